"""torch SinusoidalEncoding against the NumPy reference."""

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import SinusoidalEncoding

# Relative tolerances per dtype: float32 has a 2^-24 unit roundoff, bfloat16 2^-8;
# the sum x + pe is rounded once to the input dtype.
TOLERANCE = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_numpy_reference(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 50, 16).to(dtype)
    out = SinusoidalEncoding(16, max_len=64)(x)
    assert out.dtype == dtype and out.shape == (2, 50, 16)
    expected = x.double().numpy() + posenc.sinusoidal(50, 16)[None]
    np.testing.assert_allclose(out.double().numpy(), expected, **TOLERANCE[dtype])


def test_positions_offset_and_per_row():
    pe = SinusoidalEncoding(8, max_len=100)
    x = torch.zeros(2, 3, 8, dtype=torch.float64)
    pos = torch.tensor([[10, 11, 12], [0, 0, 1]])
    out = pe(x, positions=pos).numpy()
    np.testing.assert_allclose(out[0], posenc.sinusoidal([10, 11, 12], 8), atol=1e-7)
    np.testing.assert_allclose(out[1], posenc.sinusoidal([0, 0, 1], 8), atol=1e-7)
    shared = pe(x, positions=torch.tensor([97, 98, 99])).numpy()
    np.testing.assert_allclose(shared[1], posenc.sinusoidal([97, 98, 99], 8), atol=1e-7)


def test_table_is_non_persistent_buffer():
    pe = SinusoidalEncoding(8, max_len=10)
    assert "table" in dict(pe.named_buffers())
    assert "table" not in pe.state_dict()
    assert list(pe.parameters()) == []
    assert pe.places == ("input",)


def test_positions_beyond_max_len_raise():
    pe = SinusoidalEncoding(8, max_len=10)
    with pytest.raises(ValueError, match="positions must be < max_len=10, got 10"):
        pe(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match="positions must be < max_len=10, got 12"):
        pe(torch.zeros(1, 2, 8), positions=torch.tensor([3, 12]))


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((7,), {}, "dim must be even, got 7"),
        ((8,), dict(max_len=0), "max_len must be >= 1, got 0"),
        ((8,), dict(base=0.0), "base must be a positive finite number, got 0.0"),
    ],
)
def test_constructor_validation(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SinusoidalEncoding(*args, **kwargs)


def test_forward_validation():
    pe = SinusoidalEncoding(8, max_len=10)
    with pytest.raises(
        ValueError, match=r"x must have shape \(batch, seq, dim=8\), got \(1, 3, 6\)"
    ):
        pe(torch.zeros(1, 3, 6))
    with pytest.raises(ValueError, match=r"positions must have shape"):
        pe(torch.zeros(2, 3, 8), positions=torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        pe(torch.zeros(1, 3, 8), positions=torch.tensor([0.0, 1.0, 2.0]))
