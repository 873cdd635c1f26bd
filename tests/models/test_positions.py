"""The 1-D models' fixed positions (zoo.models.embeddings) pinned to the values the hand-written versions gave before
they moved onto timm's `timm.layers.pos_embed_sincos` (`freq_bands`, `apply_rot_embed`): the literals below were
computed from the old code, so a checkpoint trained with sinusoidal or rotary positions sees the same positions.
timm's frequencies `1 / base^e` and the old `base^-e` differ by at most one float32 ulp, hence the tolerance."""

import torch

from zoo.models.embeddings import apply_rotary, rotary_tables, sinusoidal_positions

# sinusoidal_positions(3, 8, offset=5), then (2, 16, offset=97): sin, cos interleaved per frequency
SIN_5_8 = [
    [-0.9589243, 0.2836622, 0.4794255, 0.8775826, 0.0499792, 0.9987503, 0.005, 0.9999875],
    [-0.2794155, 0.9601703, 0.5646425, 0.8253356, 0.059964, 0.9982005, 0.006, 0.999982],
    [0.6569866, 0.7539023, 0.6442177, 0.7648422, 0.0699428, 0.997551, 0.0069999, 0.9999755],
]
SIN_97_16 = [
    [0.3796077, -0.9251475, -0.6756406, 0.7372311, -0.2717604, -0.9623649, 0.0741154, -0.9972497, 0.8248857,
     0.5652996, 0.3019533, 0.9533227, 0.096848, 0.9952992, 0.0306693, 0.9995296],
    [-0.5733819, -0.8192883, -0.4128731, 0.9107885, -0.3664793, -0.9304262, 0.0425479, -0.9990944, 0.8304973,
     0.5570226, 0.3049664, 0.9523631, 0.0978432, 0.9952018, 0.0309854, 0.9995198],
]  # fmt: skip
# apply_rotary(linspace(-1, 1, 24) as [1, 1, 3, 8], *rotary_tables([0, 3, 50], 8)): position 0 is the identity
ROT = [
    [-1.0, -0.9130435, -0.8260869, -0.7391304, -0.6521739, -0.5652174, -0.4782609, -0.3913043],
    [0.2951664, -0.2462279, -0.1368968, -0.0443911, -0.0859927, 0.0603656, 0.213381, 0.304216],
    [0.5715247, 0.9278194, 0.0582885, 0.6013797, 0.6105674, -0.2242863, 1.0722506, 1.0313454],
]
# apply_rotary(linspace(-2, 1, 32) as [1, 1, 2, 16], *rotary_tables([7, 90], 16, base=500))
ROT_500 = [
    [-0.7024661, 1.8101635, 0.8648172, -0.7398303, -1.2762241, -1.3940053, -1.3735662, -1.3052754, -2.2381115,
     1.2729063, -1.8923305, -1.8029915, -1.2946594, -0.9517695, -0.7376435, -0.5883913],
    [-0.0860302, 0.5211807, -0.3477389, -0.2555429, 0.5894192, -0.7839369, -0.5942254, -0.1727737, -0.5482802,
     -0.1736078, 0.4605042, -0.5799679, -0.4004864, -0.1919579, 0.69236, 1.0105137],
]  # fmt: skip


def close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual.reshape(len(expected), -1), torch.tensor(expected), rtol=0, atol=2e-6)


def test_sinusoidal_positions_are_the_old_ones():
    close(sinusoidal_positions(3, 8, offset=5), SIN_5_8)
    close(sinusoidal_positions(2, 16, offset=97), SIN_97_16)


def test_rotary_rotation_is_the_old_one():
    x = torch.linspace(-1, 1, 24).reshape(1, 1, 3, 8)
    close(apply_rotary(x, *rotary_tables(torch.tensor([0, 3, 50]), 8)), ROT)
    x = torch.linspace(-2, 1, 32).reshape(1, 1, 2, 16)
    close(apply_rotary(x, *rotary_tables(torch.tensor([7, 90]), 16, base=500.0)), ROT_500)


def test_rotary_keeps_a_low_precision_input_s_dtype_and_rotates_in_float32():
    x = torch.linspace(-1, 1, 24).reshape(1, 1, 3, 8)
    rotated = apply_rotary(x.bfloat16(), *rotary_tables(torch.tensor([0, 3, 50]), 8))
    assert rotated.dtype == torch.bfloat16
    # the bf16 input rotated exactly (in float32) and rounded once
    expected = apply_rotary(x.bfloat16().float(), *rotary_tables(torch.tensor([0, 3, 50]), 8)).bfloat16()
    assert torch.equal(rotated, expected)
