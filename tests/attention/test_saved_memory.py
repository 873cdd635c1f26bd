"""What a linear-family layer keeps for backward, bounded by exact attention's (SDPA) layer at the same sizes.

Counted with saved-tensor hooks over one whole layer (projections included), each storage once (q, k and v are
views of one qkv output; the attention output and proj's input share one), the module's own parameters and buffers
left out (they exist whether or not anything is saved). The fused kernels (the GPU path, here in Triton's
interpreter) keep q, k, v, the output, and the `[r, d]` state only where it is smaller than SDPA's log-sum-exp.
"""

import builders
import pytest
import torch

from zoo.attention._kernels.fused_linear import force_fused

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIM, HEADS = 128, 2
LONG = 4200  # just past linear's 64 x 65 floats of state per head
FUSED = {"linear": {}, "performer": {"nb_features": 256}, "hedgehog": {"feature_dim": 64}}


def saved_bytes(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages that one forward of `module` saves for backward, its own tensors left out."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    module = module.to(DEVICE)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(x.to(DEVICE).requires_grad_())
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    return sum(size for pointer, size in storages.items() if pointer not in own)


@pytest.mark.parametrize("length", [256, 1024])
@pytest.mark.parametrize("name", list(FUSED))
def test_fused_layer_saves_no_more_than_sdpa(name, length):
    x = builders.tokens(1, length, DIM)
    bound = saved_bytes(builders.make("softmax", DIM, HEADS), x)
    with force_fused():
        fused = saved_bytes(builders.make(name, DIM, HEADS, **FUSED[name]), x)
    # q, k, v, out: at least what SDPA keeps but its log-sum-exp (HEADS x length fp32)
    assert bound - 4 * HEADS * length <= fused <= bound


def test_the_state_is_recomputed_where_it_would_outweigh_sdpa():
    """Performer's 256 x 65 floats of state per head outweigh SDPA's 1,024 log-sum-exp floats, so backward
    recomputes the state; linear's 64 x 65 at 4,200 tokens do not, so it is kept: the saved bytes differ by it."""
    x = builders.tokens(1, LONG, DIM)
    with force_fused():
        kept = saved_bytes(builders.make("linear", DIM, HEADS), x)
    bound = saved_bytes(builders.make("softmax", DIM, HEADS), x)
    head_dim = DIM // HEADS
    state = 4 * HEADS * head_dim * (head_dim + 1) + 4 * HEADS  # state, key sum, and the [b h] key offsets
    assert kept == bound - 4 * HEADS * LONG + state
