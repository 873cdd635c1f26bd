"""The block-size sweep of the fused kernels, rehearsed on the CPU (Triton's interpreter, toy sizes)."""

import json

import pytest
import torch

from dev import kernel_configs
from zoo.attention._features import Feature
from zoo.attention._kernels.fused_linear.plan import config_override as _config_override


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine runs the kernels compiled, not interpreted")
def test_cpu_rehearsal_times_every_config_and_picks_the_fastest(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kernel_configs, "CONFIGS", ("16:4", "32:4::16"))
    # two feature maps (one with a projection) at toy sizes: the interpreter is slow
    features = {"linear": ("linear", {}, "elu"), "hedgehog": ("hedgehog", {"feature_dim": 8}, "hedgehog")}
    monkeypatch.setattr(kernel_configs, "FEATURES", features)
    monkeypatch.setattr(kernel_configs, "CPU_SHAPES", {"vit_s_1024": (1, 33, 32, 1), "64k": (1, 40, 32, 1)})
    monkeypatch.setattr("sys.argv", ["kernel_configs", "--out", str(tmp_path), "--device", "cpu", "--repeats", "1"])
    kernel_configs.main()
    results = json.loads((tmp_path / "kernel_configs.json").read_text())
    for name, (_, _, feature) in kernel_configs.FEATURES.items():
        timings = results["configs"][name]
        assert set(timings) == {"16:4", "32:4::16"}
        fastest = min(timings, key=lambda c: timings[c]["vit_s_1024"] + timings[c]["64k"] / 4)
        assert results["best"][feature] == fastest
        monkeypatch.setenv("ZOO_FUSED_CONFIG", results["env"])
        expected = {"16:4": (16, 4, None, None), "32:4::16": (32, 4, None, 16)}[fastest]
        assert _config_override(Feature[feature.upper()]) == expected
    assert "Chosen: `ZOO_FUSED_CONFIG=" in (tmp_path / "kernel_configs.md").read_text()
    # a line after each configuration: a run that stops the sweep at its limit exports the best timed so far
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ZOO_FUSED_CONFIG=")]
    elu, hedgehog = results["best"]["elu"], results["best"]["hedgehog"]
    assert printed == [
        "ZOO_FUSED_CONFIG=elu=16:4",
        f"ZOO_FUSED_CONFIG=elu={elu}",
        f"ZOO_FUSED_CONFIG=elu={elu},hedgehog=16:4",
        f"ZOO_FUSED_CONFIG=elu={elu},hedgehog={hedgehog}",
    ]
