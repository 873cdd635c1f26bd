"""`read_weights` removes the prefixes that DDP (`module.`) and torch.compile (`_orig_mod.`) put on every key, now
through timm's `clean_state_dict`: the outputs of zoo's own stripping, which it replaced, pinned where they must not
change, and the one wrapping order the old code left half-stripped."""

import pytest
import torch
from safetensors.torch import save_file

from zoo._weights import read_weights

KEYS = ("blocks.0.attn.qkv.weight", "head.bias")


@pytest.mark.parametrize(
    "prefix",
    [
        "",  # an eager, single-process model: untouched
        "module.",  # DDP
        "_orig_mod.",  # torch.compile
        "module._orig_mod.",  # DDP around a compiled model
        "_orig_mod.module.",  # compiled around DDP: the old code kept `module.`, timm removes both
    ],
)
def test_wrapper_prefixes_are_removed(tmp_path, prefix):
    path = tmp_path / "w.safetensors"
    save_file({prefix + key: torch.full((2,), float(i)) for i, key in enumerate(KEYS)}, str(path))
    state = read_weights(path)
    assert list(state) == list(KEYS)
    assert state["head.bias"].tolist() == [1.0, 1.0]


def test_a_module_named_module_inside_the_model_is_kept(tmp_path):
    # only a leading prefix is a wrapper's: `blocks.module.x` stays as it is
    path = tmp_path / "w.safetensors"
    save_file({"blocks.module.weight": torch.zeros(1), "module_count": torch.zeros(1)}, str(path))
    assert sorted(read_weights(path)) == ["blocks.module.weight", "module_count"]
