"""torch SinusoidalEncoding2D: constructor checks and defaults, input-shape errors, 1-D positions
(per row), 3-axis coordinates rejected, output dtype, and the derived table against MAE's layout.
"""

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import SinusoidalEncoding2D


def _zeros(batch, seq, dim, dtype=torch.float64):
    return torch.zeros(batch, seq, dim, dtype=dtype)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(dim=2), r"^dim must be >= 4, got 2$"),
        (dict(dim=0), r"^dim must be >= 4, got 0$"),
        (dict(dim=-4), r"^dim must be >= 4, got -4$"),
        (dict(dim=4.0), r"^dim must be an integer, got 4\.0$"),
        (dict(dim=6), r"^dim must be a positive multiple of 4, got 6$"),
        (dict(dim=8, base=0.0), r"^base must be a positive finite number, got 0\.0$"),
        (dict(dim=8, base="1e4"), r"^base must be a positive real number, got '1e4'$"),
        (dict(dim=8, max_len=0), r"^max_len must be >= 1, got 0$"),
        (dict(dim=8, max_len=-3), r"^max_len must be >= 1, got -3$"),
        (dict(dim=8, max_len=2.0), r"^max_len must be an integer, got 2\.0$"),
    ],
)
def test_constructor_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SinusoidalEncoding2D(**kwargs)


def test_smallest_dim_and_max_len_are_accepted():
    pe = SinusoidalEncoding2D(4, max_len=1)
    assert (pe.dim, pe.max_len) == (4, 1)
    out = pe(_zeros(1, 1, 4))
    np.testing.assert_array_equal(out[0].numpy(), posenc.sinusoidal_2d(1, 1, 4))
    pe4 = SinusoidalEncoding2D(4, max_len=8)
    pos = torch.from_numpy(posenc.grid_positions(2, 3))[None]
    np.testing.assert_allclose(pe4(_zeros(1, 6, 4), pos)[0].numpy(), posenc.sinusoidal_2d(2, 3, 4))


def test_default_max_len_is_1024():
    pe = SinusoidalEncoding2D(4)
    assert pe.max_len == 1024 and pe.base == 10_000.0
    assert pe.table.shape == (1024, 2)
    pe(_zeros(1, 1, 4), torch.tensor([[[1023, 1023]]]))  # the last row and column fit
    hint = "; build the encoding with a larger max_len"  # as the 1-D tables say
    with pytest.raises(ValueError, match=rf"^positions must be < max_len=1024, got 1024{hint}$"):
        pe(_zeros(1, 1, 4), torch.tensor([[[0, 1024]]]))


def test_table_is_max_len_rows_of_the_column_half():
    pe = SinusoidalEncoding2D(8, max_len=5, base=100.0)
    assert pe.table.shape == (5, 4) and pe.table.dtype == torch.float64
    want = posenc.sinusoidal_2d(1, 5, 8, base=100.0)[:, :4]
    np.testing.assert_array_equal(pe.table.numpy(), want)


def test_base_reaches_the_table():
    pe = SinusoidalEncoding2D(8, base=100.0, max_len=16)
    pos = torch.from_numpy(posenc.grid_positions(3, 4))[None]
    got = pe(_zeros(1, 12, 8), pos)[0].numpy()
    np.testing.assert_allclose(got, posenc.sinusoidal_2d(3, 4, 8, base=100.0), atol=1e-15)
    assert not np.allclose(got, posenc.sinusoidal_2d(3, 4, 8))


@pytest.mark.parametrize("shape", [(1, 3, 4), (2, 3, 16), (3, 8), (1, 1, 3, 8), (8,)])
def test_x_shape_error_message(shape):
    pe = SinusoidalEncoding2D(8, max_len=16)
    with pytest.raises(ValueError) as info:
        pe(torch.zeros(shape))
    assert str(info.value) == f"x must have shape (batch, seq, dim=8), got {tuple(shape)}"


def test_three_axis_coordinates_are_rejected():
    pe = SinusoidalEncoding2D(8, max_len=16)
    msg = (
        r"^positions must have shape \(seq,\) or \(batch, seq\) = \(1, 4\), or "
        r"\(batch, seq, n_axes=2\) coordinates, got \(1, 4, 3\)$"
    )
    with pytest.raises(ValueError, match=msg):
        pe(_zeros(1, 4, 8), torch.zeros(1, 4, 3, dtype=torch.long))


def test_one_d_positions_per_row_are_the_diagonal():
    """1-D positions p mean the grid point (p, p), per row of a (batch, seq) tensor."""
    pe = SinusoidalEncoding2D(8, max_len=16)
    pos = torch.tensor([[0, 5, 3, 9], [15, 2, 2, 7]])  # (batch=2, seq=4)
    out = pe(_zeros(2, 4, 8), pos).numpy()
    grid = posenc.sinusoidal_2d(16, 16, 8)  # token h * 16 + w
    for b in range(2):
        np.testing.assert_allclose(out[b], grid[pos[b].numpy() * 17], atol=1e-15)
    shared = pe(_zeros(2, 4, 8), torch.tensor([4, 1, 0, 11])).numpy()  # (seq,) for the batch
    np.testing.assert_allclose(shared[1], grid[np.array([4, 1, 0, 11]) * 17], atol=1e-15)
    # and the same points given as (row, column) coordinates
    coords = pos[..., None].expand(-1, -1, 2).contiguous()
    np.testing.assert_array_equal(pe(_zeros(2, 4, 8), coords).numpy(), out)


def test_output_keeps_input_dtype():
    pe = SinusoidalEncoding2D(8, max_len=16)
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    for positions in (None, torch.tensor([[1, 2, 3], [0, 0, 0]]), torch.tensor([[[1, 2]] * 3])):
        out = pe(x, positions)
        assert out.dtype == torch.float32 and out.shape == (2, 3, 8)
    out = pe(x.bfloat16(), torch.tensor([[3, 4, 5]]))
    assert out.dtype == torch.bfloat16
    want = x.bfloat16().double().numpy() + posenc.sinusoidal_2d(16, 16, 8)[[3 * 17, 4 * 17, 5 * 17]]
    np.testing.assert_allclose(out.double().numpy(), want, rtol=8e-3, atol=8e-3)
