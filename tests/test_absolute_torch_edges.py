"""torch SinusoidalEncoding and LearnedEncoding: constructor checks and defaults, the max_len
boundary for tensor positions, ``base`` reaching the table, the N(0, 0.02^2) initialisation, and
positions under ``torch.func.vmap`` (checked inside an op, same values as eager code).
"""

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import LearnedEncoding, SinusoidalEncoding


def test_sinusoidal_default_max_len_is_4096():
    pe = SinusoidalEncoding(4)
    assert pe.max_len == 4096 and pe.table.shape == (4096, 4)
    x = torch.zeros(1, 1, 4, dtype=torch.float64)
    np.testing.assert_allclose(
        pe(x, torch.tensor([4095]))[0].numpy(), posenc.sinusoidal([4095], 4), atol=1e-15
    )
    msg = r"^positions must be < max_len=4096, got 4096; build the encoding with a larger max_len$"
    with pytest.raises(ValueError, match=msg):
        pe(x, torch.tensor([4096]))


@pytest.mark.parametrize("enc", ["sinusoidal", "learned"])
def test_tensor_position_equal_to_max_len_raises(enc):
    pe = SinusoidalEncoding(8, max_len=10) if enc == "sinusoidal" else LearnedEncoding(10, 8)
    x = torch.zeros(2, 2, 8)
    pe(x, torch.tensor([[0, 9], [9, 9]]))  # max_len - 1 is the last row
    msg = r"^positions must be < max_len=10, got 10; build the encoding with a larger max_len$"
    with pytest.raises(ValueError, match=msg):
        pe(x, torch.tensor([[0, 1], [9, 10]]))
    with pytest.raises(ValueError, match=msg):
        pe(x, torch.tensor([3, 10]))


def test_base_reaches_the_table():
    pe = SinusoidalEncoding(8, max_len=20, base=100.0)
    x = torch.zeros(1, 20, 8, dtype=torch.float64)
    np.testing.assert_allclose(pe(x)[0].numpy(), posenc.sinusoidal(20, 8, base=100.0), atol=1e-15)
    np.testing.assert_array_equal(pe.table.numpy(), posenc.sinusoidal(20, 8, base=100.0))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 8), r"^max_len must be >= 1, got 0$"),
        ((-2, 8), r"^max_len must be >= 1, got -2$"),
        ((4.0, 8), r"^max_len must be an integer, got 4\.0$"),
        ((4, 0), r"^dim must be >= 1, got 0$"),
        ((4, -1), r"^dim must be >= 1, got -1$"),
        ((4, True), r"^dim must be an integer, got True$"),
    ],
)
def test_learned_constructor_messages(args, message):
    with pytest.raises(ValueError, match=message):
        LearnedEncoding(*args)


def test_learned_smallest_table_is_accepted():
    pe = LearnedEncoding(1, 1)
    assert pe.weight.shape == (1, 1) and (pe.max_len, pe.dim) == (1, 1)
    x = torch.ones(2, 1, 1)
    torch.testing.assert_close(pe(x), x + pe.weight.detach()[None], rtol=0, atol=0)
    odd = LearnedEncoding(3, 5)  # any width, not only even ones
    assert odd.weight.shape == (3, 5)


def test_learned_init_is_normal_with_std_002():
    torch.manual_seed(0)
    w = LearnedEncoding(512, 64).weight.detach().double()  # 32768 draws
    # the sample std of n normal draws has relative standard error 1 / sqrt(2n) ~ 0.4%
    assert abs(w.std().item() / 0.02 - 1) < 0.03
    assert abs(w.mean().item()) < 0.02 * 5 / 32768**0.5
    assert w.abs().max().item() < 0.02 * 6


def test_vmap_over_positions_matches_eager():
    pe = SinusoidalEncoding(8, max_len=12)
    x = torch.zeros(1, 4, 8, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3], [11, 4, 4, 0], [7, 8, 9, 10]])
    out = torch.func.vmap(lambda p: pe(x, p))(pos)  # (3, 1, 4, 8)
    assert out.shape == (3, 1, 4, 8)
    for b in range(3):
        np.testing.assert_allclose(out[b, 0].numpy(), posenc.sinusoidal(pos[b].numpy(), 8))


def test_vmap_learned_over_positions():
    torch.manual_seed(1)
    pe = LearnedEncoding(6, 4)
    x = torch.zeros(1, 3, 4)
    pos = torch.tensor([[5, 0, 2], [1, 1, 3]])
    out = torch.func.vmap(lambda p: pe(x, p))(pos)
    w = pe.weight.detach()
    torch.testing.assert_close(out[:, 0], w[pos], rtol=0, atol=0)


@pytest.mark.parametrize("bad", [12, 13])
def test_vmap_position_past_max_len_raises(bad):
    pe = SinusoidalEncoding(8, max_len=12)
    x = torch.zeros(1, 2, 8)
    pos = torch.tensor([[0, 1], [bad, 0]])
    hint = "; build the encoding with a larger max_len"  # the words of eager mode, hint too
    with pytest.raises(ValueError, match=rf"^positions must be < max_len=12, got {bad}{hint}$"):
        torch.func.vmap(lambda p: pe(x, p))(pos)
