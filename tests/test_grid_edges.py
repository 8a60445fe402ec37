"""Grid positions, the 2-D sin-cos table and M-RoPE ids: exact refusals and their boundaries.

Pins the full ValueError message of every check in ``posenc.grid`` at the largest refused
value, the smallest accepted value next to it, and M-RoPE's default ``spatial_merge=1``.
"""

import numpy as np
import pytest
from expect import raises_exactly

import posenc

# -- grid_positions ---------------------------------------------------------------------------


def test_grid_positions_refuses_no_axes():
    with raises_exactly("shape must name at least one axis, got ()"):
        posenc.grid_positions()


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3, 1)])
def test_grid_positions_refuses_empty_axis(shape):
    with raises_exactly("shape must be >= 1, got 0"):
        posenc.grid_positions(*shape)


def test_grid_positions_refuses_non_int_axis():
    with raises_exactly("shape must be an integer, got 2.0"):
        posenc.grid_positions(2, 2.0)


def test_grid_positions_size_one_axes():
    # smallest accepted size: a single cell at the origin, one column per axis
    np.testing.assert_array_equal(posenc.grid_positions(1), [[0]])
    got = posenc.grid_positions(1, 1, 1)
    assert got.shape == (1, 3) and got.dtype == np.int64
    np.testing.assert_array_equal(got, [[0, 0, 0]])


# -- sinusoidal_2d ----------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [3, 0, -4])
def test_sinusoidal_2d_refuses_dim_below_4(dim):
    with raises_exactly(f"dim must be >= 4, got {dim}"):
        posenc.sinusoidal_2d(2, 2, dim)


def test_sinusoidal_2d_refuses_non_multiple_of_4():
    with raises_exactly("dim must be a positive multiple of 4, got 6"):
        posenc.sinusoidal_2d(2, 2, 6)


def test_sinusoidal_2d_refuses_non_int_dim():
    with raises_exactly("dim must be an integer, got 4.0"):
        posenc.sinusoidal_2d(2, 2, 4.0)


def test_sinusoidal_2d_smallest_dim():
    # dim 4: omega = (1,), so token h * width + w is [sin w, cos w, sin h, cos h]
    table = posenc.sinusoidal_2d(2, 2, 4)
    assert table.shape == (4, 4) and table.dtype == np.float64
    want = [[np.sin(w), np.cos(w), np.sin(h), np.cos(h)] for h in range(2) for w in range(2)]
    np.testing.assert_allclose(table, want, rtol=0, atol=1e-15)


# -- mrope_positions --------------------------------------------------------------------------


def test_mrope_default_merge_is_one():
    # no spatial_merge given: a 2x3 image is 6 tokens at (2, 2 + y, 2 + x); text resumes at
    # 2 + max(2, 3) = 5 (the docstring's example, written out)
    got = posenc.mrope_positions([2, (1, 2, 3), 2])
    want = [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],
    ]
    np.testing.assert_array_equal(got.T, want)
    np.testing.assert_array_equal(got, posenc.mrope_positions([2, (1, 2, 3), 2], spatial_merge=1))


def test_mrope_refuses_merge_below_1():
    with raises_exactly("spatial_merge must be >= 1, got 0"):
        posenc.mrope_positions([(1, 2, 2)], spatial_merge=0)
    with raises_exactly("spatial_merge must be >= 1, got 0"):
        posenc.mrope_positions([3], spatial_merge=0)
    with raises_exactly("spatial_merge must be >= 1, got -2"):
        posenc.mrope_positions([(1, 2, 2)], spatial_merge=-2)


def test_mrope_refuses_non_int_merge():
    with raises_exactly("spatial_merge must be an integer, got 2.0"):
        posenc.mrope_positions([3], spatial_merge=2.0)


def test_mrope_refuses_negative_start():
    with raises_exactly("start must be >= 0, got -1"):
        posenc.mrope_positions([3], start=-1)
    with raises_exactly("start must be an integer, got 1.0"):
        posenc.mrope_positions([3], start=1.0)


def test_mrope_start_zero_and_shift():
    # smallest start: text at 0, 1; start=3 shifts every coordinate by 3
    base = posenc.mrope_positions([2, (1, 2, 2)], start=0)
    np.testing.assert_array_equal(base[:2], [[0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(posenc.mrope_positions([2, (1, 2, 2)], start=3), base + 3)


def test_mrope_refuses_negative_text_length():
    with raises_exactly("segments must be >= 0, got -1"):
        posenc.mrope_positions([2, -1, 3])


def test_mrope_empty_text_segment_is_no_tokens():
    # n = 0 is accepted: no tokens, and the next segment starts where it would have
    got = posenc.mrope_positions([2, 0, (1, 1, 2), 0, 1])
    want = posenc.mrope_positions([2, (1, 1, 2), 1])
    np.testing.assert_array_equal(got, want)
    # text 0, 1; image at (2, 2, 2), (2, 2, 3); text resumes at 2 + max(1, 2) = 4
    np.testing.assert_array_equal(got[:, 2], [0, 1, 2, 3, 4])
    assert posenc.mrope_positions([0]).shape == (0, 3)


@pytest.mark.parametrize("seg", [(0, 2, 2), (1, 0, 2), (1, 2, 0), (1, -2, 2), (1, 2.0, 2)])
def test_mrope_refuses_grid_entry_below_1(seg):
    with raises_exactly(f"segments must hold ints (text) or (t, h, w) grids, got {seg!r}"):
        posenc.mrope_positions([1, seg])


def test_mrope_refuses_negative_grid_with_merge():
    # -2 is divisible by 2, so only the >= 1 check stands between it and a grid of -1 rows
    seg = (1, -2, 2)
    with raises_exactly(f"segments must hold ints (text) or (t, h, w) grids, got {seg!r}"):
        posenc.mrope_positions([seg], spatial_merge=2)


def test_mrope_unit_grid():
    # smallest grid (1, 1, 1): one token at the next text position, text resumes one later
    got = posenc.mrope_positions([1, (1, 1, 1), 1])
    np.testing.assert_array_equal(got, [[0, 0, 0], [1, 1, 1], [2, 2, 2]])
