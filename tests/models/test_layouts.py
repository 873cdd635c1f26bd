"""Per-block layouts (`global_blocks`: another attention in named blocks) and the patch grid that 2-D attention
variants get from the model, at build time and, with `dynamic_img_size`, at every forward."""

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import Tensor

import zoo
from zoo.attention import _registry
from zoo.attention._common import AttentionBase
from zoo.data._sizes import ModelSizes

TINY = {"embed_dim": 32, "num_heads": 2, "num_classes": 5, "in_chans": 1, "img_size": 32, "patch_size": 8}


def layout(model) -> list[str]:
    return [block.attn.attention_name for block in model.blocks]


def test_global_blocks_take_the_global_attention_with_its_options():
    model = zoo.create_model(
        "vit_tiny_patch16_224", attention="performer", attention_options={"nb_features": 16}, depth=6,
        global_blocks=[1, 4], global_attention="local", global_attention_options={"window": 3}, **TINY,
    )  # fmt: skip
    assert layout(model) == ["performer", "local", "performer", "performer", "local", "performer"]
    assert model.blocks[1].attn.bound_options == {"window": 3}
    assert model.blocks[0].attn.bound_options == {"nb_features": 16}
    model(torch.randn(2, 1, 32, 32)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_every_block_global_equals_the_global_attention_everywhere():
    torch.manual_seed(0)
    plain = zoo.create_model("vit_tiny_patch16_224", depth=3, **TINY).eval()
    layered = zoo.create_model("vit_tiny_patch16_224", attention="performer", depth=3, global_blocks=[0, 1, 2], **TINY)
    layered.load_state_dict(plain.state_dict(), strict=True)
    x = torch.randn(2, 1, 32, 32)
    torch.testing.assert_close(layered.eval()(x), plain(x))


def test_layouts_keep_timm_weight_names_so_stock_weights_load(tmp_path):
    stock = timm.create_model("vit_tiny_patch16_224", embed_dim=32, depth=4, num_heads=2, num_classes=5)
    path = tmp_path / "stock.safetensors"
    save_file(stock.state_dict(), str(path))
    options = {"attention": "window2d", "attention_options": {"window": 2}, "global_blocks": [1, 3], "depth": 4}
    model = zoo.create_model("vit_tiny_patch16_224", pretrained_file=path, **options, **{**TINY, "in_chans": 3})
    assert model.state_dict().keys() == stock.state_dict().keys()
    for key in ("blocks.0.attn.qkv.weight", "blocks.1.attn.proj.bias"):
        torch.testing.assert_close(model.state_dict()[key], stock.state_dict()[key])
    # timm's own file route, through the registered entry point
    by_name = timm.create_model(
        "zoo_vit_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **options,
        **{**TINY, "in_chans": 3},
    )  # fmt: skip
    assert layout(by_name) == ["window2d", "softmax", "window2d", "softmax"]
    torch.testing.assert_close(by_name.blocks[2].attn.qkv.weight, stock.blocks[2].attn.qkv.weight)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"global_blocks": [1, 4, 7]}, r"global_blocks \[4, 7\] out of range for depth 4: indices must be in 0\.\.3"),
        ({"global_blocks": [-1]}, r"global_blocks \[-1\] out of range for depth 4"),
        ({"global_blocks": [1.0]}, r"global_blocks \[1\.0\] out of range"),
        ({"global_blocks": [2, 2]}, r"global_blocks \[2, 2\] names a block twice"),
        ({"global_blocks": 2}, r"global_blocks=2 must be a list"),
        ({"global_attention": "performer"}, "global_attention 'performer' .* global_blocks, which is empty"),
        ({"global_blocks": [0], "global_attention": "sofmax"}, "unknown attention 'sofmax' .*did you mean 'softmax'"),
        ({"global_blocks": [0], "global_attention_options": {"windw": 2}}, "no option 'windw'"),
        ({"global_blocks": [0], "block": "gau", "attention": "gau"}, "block 'gau' brings its own attention"),
    ],
)
def test_bad_layouts_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message):
        zoo.create_model("vit_tiny_patch16_224", depth=4, **TINY, **options)


def test_recipe_layout_reaches_the_model():
    from zoo.config import recipe_from_dict
    from zoo.kinds import get_model_kind

    model = {
        "name": "vit_tiny_patch16_224", "img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 4, "num_heads": 2,
        "attention": {"name": "window2d", "options": {"window": 2}}, "global_blocks": [1, 3],
        "global_attention": {"name": "local", "options": {"window": 5}},
    }  # fmt: skip
    recipe = recipe_from_dict({"name": "x", "model": model})
    assert recipe.model.global_blocks == [1, 3] and recipe.model.global_attention.options == {"window": 5}
    kind = get_model_kind("vit")
    built = kind.build(recipe, ModelSizes(num_classes=3, in_chans=1), kind.task(recipe))
    assert layout(built) == ["window2d", "local", "window2d", "local"]
    assert built.blocks[1].attn.bound_options == {"window": 5}


class GridProbe(AttentionBase):
    """A throwaway grid variant: exact softmax that checks every input against the grid it was told."""

    needs_grid = True
    has_attention_weights = True
    attention_name = "grid_probe"

    def __init__(self, dim: int, num_heads: int = 8, *, grid_size=None, num_prefix_tokens: int = 0, **timm_args):
        super().__init__(dim, num_heads, **timm_args)
        self.grid_size, self.num_prefix_tokens, self.grids_seen = tuple(grid_size), num_prefix_tokens, []

    def set_grid(self, grid_size: tuple[int, int]) -> None:
        self.grid_size = grid_size

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask, is_causal: bool) -> Tensor:
        rows, cols = self.grid_size
        assert q.shape[-2] == self.num_prefix_tokens + rows * cols, (q.shape, self.grid_size)
        self.grids_seen.append(self.grid_size)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


@pytest.fixture
def grid_probe():
    with _registry._ATTENTIONS.scope():
        _registry._ATTENTIONS.register("grid_probe", GridProbe)
        yield "grid_probe"


@pytest.mark.parametrize("tokens", [{}, {"reg_tokens": 3}, {"class_token": False, "global_pool": "avg"}])
def test_the_model_fills_in_grid_and_prefix_tokens(grid_probe, tokens):
    model = zoo.create_model(
        "vit_tiny_patch16_224", attention=grid_probe, depth=2, **{**TINY, "img_size": (40, 24)}, **tokens
    )
    for block in model.blocks:
        assert block.attn.grid_size == model.patch_embed.grid_size == (5, 3)
        assert block.attn.num_prefix_tokens == model.num_prefix_tokens
    model(torch.randn(2, 1, 40, 24))
    assert model.blocks[1].attn.grids_seen == [(5, 3)]


def test_a_grid_that_contradicts_the_model_is_refused(grid_probe):
    with pytest.raises(ValueError, match=r"grid_size=\(6, 6\) contradicts the model's \(4, 4\)"):
        zoo.create_model(
            "vit_tiny_patch16_224", attention=grid_probe, attention_options={"grid_size": (6, 6)}, depth=1, **TINY
        )
    model = zoo.create_model(
        "vit_tiny_patch16_224", attention=grid_probe, attention_options={"grid_size": [4, 4]}, depth=1, **TINY
    )
    assert model.blocks[0].attn.grid_size == (4, 4)


def test_dynamic_img_size_tells_every_grid_attention_the_grid_of_each_input(grid_probe):
    model = zoo.create_model(
        "vit_tiny_patch16_224",
        attention="softmax",
        depth=3,
        global_blocks=[0, 2],
        global_attention=grid_probe,
        dynamic_img_size=True,
        dynamic_img_pad=True,
        **TINY,
    )
    model(torch.randn(1, 1, 32, 32))
    model.forward_features(torch.randn(1, 1, 48, 17))  # padded up to 6 x 3 patches
    model.forward_intermediates(torch.randn(1, 1, 16, 40))
    for index in (0, 2):
        assert model.blocks[index].attn.grids_seen == [(4, 4), (6, 3), (2, 5)]
    # a fixed-size model's grid follows set_input_size
    fixed = zoo.create_model("vit_tiny_patch16_224", attention=grid_probe, depth=1, **TINY)
    fixed.set_input_size(img_size=(24, 40))
    fixed(torch.randn(1, 1, 24, 40))
    assert fixed.blocks[0].attn.grids_seen == [(3, 5)]


@pytest.mark.parametrize("name", ["window2d", "neighborhood"])
def test_registered_grid_variants_run_at_any_image_size(name):
    options = {"window": 2} if name == "window2d" else {"kernel": 3}
    model = zoo.create_model(
        "vit_tiny_patch16_224",
        attention=name,
        attention_options=options,
        depth=2,
        global_blocks=[1],
        dynamic_img_size=True,
        **TINY,
    )
    assert model.blocks[0].attn.grid_size == (4, 4)
    for size in [(32, 32), (40, 24), (56, 16)]:
        logits = model(torch.randn(2, 1, *size))
        assert logits.shape == (2, 5) and torch.isfinite(logits).all()
        assert model.blocks[0].attn.grid_size == (size[0] // 8, size[1] // 8)
