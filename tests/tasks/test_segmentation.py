"""The `segmentation` task (`zoo.tasks.segmentation`) and its models (`zoo.models.segmentation`): the loss and the
metrics against hand computations, the decoders' output size, 2-D attention layouts keeping their locality through
the decoder, the recipe's decoder options checked, and a trained run round-tripping through `zoo.load_model`,
`save_pretrained`, tools/eval.py's mask figure and tools/predict.py's mask PNGs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import reset_accelerate
from PIL import Image

import zoo
from zoo.config import recipe_from_dict
from zoo.models.segmentation import SegmentationViT
from zoo.tasks import IGNORE_INDEX, get_task

ROOT = Path(__file__).resolve().parents[2]
TASK = get_task("segmentation")


def tiny(**kwargs) -> SegmentationViT:
    """A 1-block ViT on 32-px one-channel images, 8-px patches: a 4 x 4 grid."""
    args = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, in_chans=1, num_classes=3)
    args["decoder"] = "linear"
    return zoo.create_model("vit_tiny_patch16_224", **{**args, **kwargs}).eval()


def test_loss_leaves_ignored_pixels_out():
    # two pixels labelled, two ignored: the mean of the two labelled pixels' -log softmax, computed by hand
    logits = torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 9.0]])  # [pixel, k]
    outputs = logits.T.reshape(1, 3, 2, 2)
    targets = torch.tensor([[[0, 2], [IGNORE_INDEX, IGNORE_INDEX]]])
    first = -(1.0 - math.log(math.e + 1 + math.e**-1))
    second = -(0.0 - math.log(1 + math.e**2 + 1))
    assert TASK.loss(outputs, targets) == pytest.approx((first + second) / 2, rel=1e-6)
    assert TASK.loss_units(targets, None) == 2
    # the ignored pixels' logits do not matter
    changed = outputs.clone()
    changed[0, :, 1, :] = torch.randn(3, 2)
    assert TASK.loss(changed, targets) == pytest.approx(TASK.loss(outputs, targets).item())


def test_loss_of_a_batch_without_labelled_pixels_is_zero_not_nan():
    outputs = torch.randn(1, 3, 2, 2, requires_grad=True)
    loss = TASK.loss(outputs, torch.full((1, 2, 2), IGNORE_INDEX))
    loss.backward()
    assert loss.item() == 0.0 and outputs.grad is not None


def test_metrics_match_a_hand_computed_confusion():
    # 3 classes; predictions and targets over 10 pixels, 2 of them ignored
    target = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, IGNORE_INDEX, IGNORE_INDEX])
    guess = torch.tensor([0, 0, 1, 1, 2, 2, 2, 0, 1, 2])
    outputs = torch.nn.functional.one_hot(guess, 3).float().T.reshape(1, 3, 2, 5)
    metrics = TASK.build_metrics(["miou", "iou", "pixel_accuracy", "confusion"], 3)
    metrics.update(*TASK.metric_inputs(outputs, target.reshape(1, 2, 5)))
    values = {name: value.tolist() for name, value in metrics.compute().items()}
    # confusion (rows true, columns predicted), the ignored pixels left out
    confusion = [[2, 1, 0], [0, 1, 1], [1, 0, 2]]
    assert values["confusion"] == confusion
    # IoU = diagonal / (row sum + column sum - diagonal)
    iou = [2 / (3 + 3 - 2), 1 / (2 + 2 - 1), 2 / (3 + 3 - 2)]
    assert values["iou"] == pytest.approx(iou)
    assert values["miou"] == pytest.approx(sum(iou) / 3)
    assert values["pixel_accuracy"] == pytest.approx(5 / 8)


def test_miou_averages_over_the_classes_present_only():
    # class 2 in neither targets nor predictions: the mean is over classes 0 and 1
    outputs = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 1]), 3).float().T.reshape(1, 3, 2, 2)
    metrics = TASK.build_metrics(["miou"], 3)
    metrics.update(*TASK.metric_inputs(outputs, torch.tensor([[[0, 0], [1, 1]]])))
    assert metrics.compute()["miou"].item() == pytest.approx((1 / 2 + 2 / 3) / 2)


@pytest.mark.parametrize("decoder", ["linear", "pyramid", "progressive"])
@pytest.mark.parametrize("size", [32, 40])
def test_every_decoder_gives_logits_at_the_input_size(decoder, size):
    options = {"channels": 8} if decoder != "linear" else {}
    model = tiny(img_size=size, decoder=decoder, decoder_options=options, num_classes=5)
    with torch.no_grad():
        out = model(torch.randn(2, 1, size, size))
    assert out.shape == (2, 5, size, size)


@pytest.mark.parametrize("pooling", [{}, {"class_token": False, "global_pool": "avg"}], ids=["token", "avg"])
def test_the_decoder_reads_the_last_tokens_and_every_trained_parameter_learns(pooling):
    """The decoder reads each patch token of the last block: layer-normalised (zero mean and unit variance over its
    channels, at the norm's initialisation) where timm's final norm applies to every token, as they are where an
    average-pooled ViT has it after the pooling (fc_norm, frozen). Every parameter trained gets a gradient:
    data-parallel training waits on one that does not."""
    model = tiny(**pooling)
    read = []
    model.decoder.register_forward_hook(lambda module, args, out: read.append(args[0]))
    images = torch.randn(2, 1, 32, 32) * 5 + 3
    model(images).square().mean().backward()
    (features,) = read  # [b, d, h, w]
    if pooling:
        last = model.forward_intermediates(images, indices=1, norm=False, output_fmt="NCHW", intermediates_only=True)
        torch.testing.assert_close(features, last[0], atol=1e-6, rtol=0)
        assert not any(p.requires_grad for p in model.fc_norm.parameters())
    else:
        torch.testing.assert_close(features.mean(1), torch.zeros(2, 4, 4), atol=1e-5, rtol=0)
        torch.testing.assert_close(features.var(1, correction=0), torch.ones(2, 4, 4), atol=1e-3, rtol=0)
    assert [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None] == []


def test_progressive_decoder_maps_each_patch_to_its_own_pixels_and_reads_the_image_locally():
    # decoder alone, in eval mode: the transposed convolutions (kernel 2, stride 2, three for 8-px patches) take
    # patch (1, 2)'s features to pixels 8..15 x 16..23 only, and the closing 3x3 convolution widens that by one
    # pixel; the image path (two 3x3 convolutions) and the closing one see 7 x 7 pixels: a pixel at (20, 5)
    # reaches rows and columns 17..23 and 2..8
    from zoo.models.segmentation import ProgressiveDecoder

    torch.manual_seed(0)
    decoder = ProgressiveDecoder(16, 3, channels=8, patch_size=8, in_chans=1).eval()
    features, image = torch.randn(1, 16, 4, 4), torch.randn(1, 1, 32, 32)
    with torch.no_grad():
        base = decoder(features, image)
        moved = features.clone()
        moved[..., 1, 2] += 1.0
        by_patch = (decoder(moved, image) - base).abs().amax(1)[0] > 0  # [H, W]
        nudged = image.clone()
        nudged[..., 20, 5] += 1.0
        by_pixel = (decoder(features, nudged) - base).abs().amax(1)[0] > 0
    expected = torch.zeros(32, 32, dtype=torch.bool)
    expected[7:17, 15:25] = True
    assert torch.equal(by_patch, expected)
    expected = torch.zeros(32, 32, dtype=torch.bool)
    expected[17:24, 2:9] = True
    assert torch.equal(by_pixel, expected)


def test_progressive_decoder_needs_a_power_of_two_patch():
    with pytest.raises(ValueError, match="power of 2, got 6"):
        tiny(img_size=36, patch_size=6, decoder="progressive")


def test_dynamic_size_segments_a_non_square_image_at_its_own_size():
    model = tiny(dynamic_img_size=True, attention="window2d", attention_options={"window": 2})
    with torch.no_grad():
        assert model(torch.randn(1, 1, 48, 24)).shape == (1, 3, 48, 24)


def _changed_far_away(model: SegmentationViT) -> bool:
    """Whether changing the top-left 8 x 8 pixels (patch (0, 0) of the 4 x 4 grid) changes the logits of the
    bottom-right pixels 20..31, which bilinear upsampling takes from patch rows and columns 2 and 3 only."""
    torch.manual_seed(0)
    x = torch.randn(1, 1, 32, 32)
    y = x.clone()
    y[..., :8, :8] = torch.randn(8, 8)
    with torch.no_grad():
        return not torch.allclose(model(x)[..., 20:, 20:], model(y)[..., 20:, 20:], atol=1e-6)


@pytest.mark.parametrize(
    ("attention", "options", "local"),
    [
        ("softmax", {}, False),
        ("window2d", {"window": 2}, True),
        ("neighborhood", {"kernel": 3}, True),
        ("performer", {"nb_features": 16}, False),
    ],
)
def test_two_d_attention_keeps_its_locality_through_the_decoder(attention, options, local):
    # one block: a patch of rows and columns 2..3 sees its 2 x 2 window (window2d) or a 3 x 3 neighbourhood (shifted
    # inside the grid at its border: rows and columns 1..3), and the class token's embedding, never patch (0, 0);
    # global attention does
    torch.manual_seed(0)
    model = tiny(attention=attention, attention_options=options)
    assert _changed_far_away(model) is not local


def test_window2d_with_a_global_block_sees_the_whole_image():
    torch.manual_seed(0)
    model = tiny(depth=2, attention="window2d", attention_options={"window": 2}, global_blocks=[1])
    assert _changed_far_away(model)


def test_reversible_segmentation_is_refused():
    with pytest.raises(ValueError, match="reversible=False"):
        tiny(reversible=True)


def test_unknown_decoder_and_option_name_what_is_allowed():
    with pytest.raises(ValueError, match="pyramid"):
        tiny(decoder="fpn")
    with pytest.raises(ValueError, match="takes: channels"):
        tiny(decoder="pyramid", decoder_options={"width": 8})


def seg_recipe(**model) -> dict:
    model = {"depth": 1, "num_heads": 2, **model}
    data = {"name": "megamnist_seg", "options": {"canvas_size": 32, "digit_size": 10, "num_target": 2,
            "num_other": 1, "num_clutter": 1}}  # fmt: skip
    return {
        "name": "seg_tiny",
        "task": "segmentation",
        "metrics": ["miou", "pixel_accuracy"],
        "model": {"name": "vit_tiny_patch16_224", "img_size": 32, "patch_size": 8, "embed_dim": 16, **model},
        "data": {**data, "train_samples": 8, "val_samples": 4, "test_samples": 4, "batch_size": 4, "num_workers": 0},
        "train": {"max_steps": 2, "mixed_precision": "no", "epochs": 1},
        "schedule": {"warmup_steps": 1},
    }


def test_recipe_decoder_options_are_checked():
    recipe = recipe_from_dict(seg_recipe(decoder="pyramid", decoder_channels=8))
    assert recipe.model.decoder == "pyramid"
    with pytest.raises(ValueError, match=r"model\.decoder: .*linear.*pyramid.*progressive"):
        recipe_from_dict(seg_recipe(decoder="fpn"))
    classify = {**seg_recipe(decoder="pyramid"), "task": "classification", "metrics": ["top1"]}
    classify["data"] = {**classify["data"], "name": "megamnist"}
    with pytest.raises(ValueError, match=r"model\.decoder: only task 'segmentation' uses it"):
        recipe_from_dict(classify)
    with pytest.raises(ValueError, match=r"model\.reversible: .*decoder"):
        recipe_from_dict(seg_recipe(reversible=True))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 2-step run of the progressive decoder on 32-px MegaMNIST masks."""
    from zoo.train.loop import Trainer

    run_dir = tmp_path_factory.mktemp("seg") / "run"
    reset_accelerate()
    Trainer(recipe_from_dict(seg_recipe(decoder="progressive", decoder_channels=8)), run_dir).fit()
    reset_accelerate()
    return run_dir


def test_a_run_round_trips_through_load_model_and_save_pretrained(trained, tmp_path):
    model = zoo.load_model(trained)
    assert isinstance(model, SegmentationViT) and model.decoder_name == "progressive"
    assert model.pretrained_cfg["label_names"] == ("background", *map(str, range(10)))
    folder = zoo.save_pretrained(model, tmp_path / "saved")
    again = zoo.load_model(folder)
    assert isinstance(again, SegmentationViT) and again.decoder_options == {"channels": 8}
    assert again.pretrained_cfg["label_names"] == model.pretrained_cfg["label_names"]
    x = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), again(x))
    # timm's own route reads the same folder
    config = json.loads((folder / "config.json").read_text())
    assert config["model_args"]["decoder"] == "progressive" and config["num_classes"] == 11


def test_eval_reports_miou_beside_the_all_background_baseline_and_draws_masks(trained):
    from zoo.evaluate import save_evaluation

    reset_accelerate()
    result, _ = save_evaluation(trained, split="test")
    assert set(result["metrics"]) >= {"miou", "iou", "pixel_accuracy", "confusion"}
    assert len(result["metrics"]["iou"]) == 11
    # the baseline on the same 4 test canvases, from their masks: background's share over 1 + digit classes present
    masks = torch.stack([zoo.data.build_dataset("megamnist_seg", _context("test"), **_data_options())[i][1]
                         for i in range(4)])  # fmt: skip
    labelled = masks[masks != IGNORE_INDEX]
    share = (labelled == 0).float().mean().item()
    baseline = result["baselines"]["all_background"]
    assert baseline["pixel_accuracy"] == pytest.approx(share)
    assert baseline["miou"] == pytest.approx(share / len(labelled.unique()))
    figure = Image.open(result["masks_png"])
    assert figure.size[0] > 300 and figure.size[1] > 300


def _data_options() -> dict:
    return seg_recipe()["data"]["options"]


def _context(split: str):
    from zoo.data import DataContext

    return DataContext(split=split, is_training=False, num_samples=4, seed=0, img_size=32)


def test_predict_writes_a_palette_mask_per_image_and_a_legend(trained, tmp_path, monkeypatch):
    images = tmp_path / "images"
    images.mkdir()
    canvases = [zoo.data.build_dataset("megamnist_seg", _context("test"), **_data_options())[i][0] for i in range(2)]
    for i, canvas in enumerate(canvases):
        Image.fromarray((canvas[0].numpy() * 255).round().astype(np.uint8)).save(images / f"canvas{i}.png")
    output = tmp_path / "out.json"
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import predict as predict_tool

    argv = ["predict.py", str(trained), str(images), "--output", str(output), "--masks", str(tmp_path / "masks")]
    monkeypatch.setattr(sys, "argv", argv)
    predict_tool.main()
    rows = json.loads(output.read_text())["predictions"]
    assert [Path(row["mask"]).name for row in rows] == ["canvas0.png", "canvas1.png"]
    model = zoo.load_model(trained)
    for row in rows:
        png = Image.open(row["mask"])
        assert png.mode == "P" and png.size == (32, 32)
        with torch.no_grad():
            # the 8-bit PNG of the canvas is what the tool read: the same pixels up to rounding
            expected = model(torch.from_numpy(np.array(Image.open(row["input"]))).float().div(255)[None, None])
        assert np.array_equal(np.asarray(png), expected.argmax(1)[0].numpy())
        # the classes it covers, largest share first (at most --top-k 5), counted from the PNG
        counts = np.bincount(np.asarray(png).flatten(), minlength=11)
        names = [str(c - 1) if c else "background" for c in np.argsort(-counts, kind="stable")[:5] if counts[c]]
        assert row["classes"] == names
        assert row["shares"] == pytest.approx(sorted(counts[counts > 0] / 1024, reverse=True)[:5], abs=1e-6)
    legend = json.loads((tmp_path / "masks" / "legend.json").read_text())
    assert [entry["name"] for entry in legend] == ["background", *map(str, range(10))]
    assert legend[0]["color"] == [0, 0, 0]
