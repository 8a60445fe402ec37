"""Axial RoPE, M-RoPE rates and ``rope_nd`` (NumPy): defaults, exact refusals, boundaries.

Pins the defaults of ``axial_frequencies`` (two axes, ``max_freq=10``), that ``base`` reaches
its rates, the full ValueError message of every check in ``posenc.rotary_nd`` at the largest
refused and smallest accepted value, the float64 conversion of ``rope_nd``'s inputs (ints,
float32, ``fractions.Fraction``) and the broadcast of positions with more batch axes than ``x``.
Golden rates are ``base ** (-2j / d)`` and ``linspace(1, max_freq / 2, n) * pi`` worked by hand.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from expect import raises_exactly

import posenc

# -- axial_frequencies ------------------------------------------------------------------------


def test_axial_defaults_to_two_axes():
    # head_dim 8, 2 axes: per axis d_a = 4, rates 1e4 ** (-0 / 4) = 1 and 1e4 ** (-2 / 4) = 0.01
    inv, axis = posenc.axial_frequencies(8)
    np.testing.assert_allclose(inv, [1.0, 0.01, 1.0, 0.01], rtol=1e-15)
    np.testing.assert_array_equal(axis, [0, 0, 1, 1])


def test_axial_uses_base():
    # base 100, d_a = 4: 100 ** 0 = 1, 100 ** (-1 / 2) = 0.1
    inv, _ = posenc.axial_frequencies(8, 2, base=100.0)
    np.testing.assert_allclose(inv, [1.0, 0.1, 1.0, 0.1], rtol=1e-15)


def test_axial_pixel_default_max_freq_is_10():
    # linspace(1, 10 / 2, 2) * pi = (pi, 5 pi) on each axis
    inv, axis = posenc.axial_frequencies(8, freqs_for="pixel")
    np.testing.assert_allclose(inv, [math.pi, 5 * math.pi] * 2, rtol=1e-15)
    np.testing.assert_array_equal(axis, [0, 0, 1, 1])
    inv4, _ = posenc.axial_frequencies(8, freqs_for="pixel", max_freq=4.0)  # (pi, 2 pi)
    np.testing.assert_allclose(inv4, [math.pi, 2 * math.pi] * 2, rtol=1e-15)


def test_axial_one_axis_is_1d_rope():
    # n_axes = 1, the smallest accepted: the rates of rope_frequencies(4) on axis 0
    inv, axis = posenc.axial_frequencies(4, 1)
    np.testing.assert_allclose(inv, [1.0, 0.01], rtol=1e-15)
    np.testing.assert_array_equal(axis, [0, 0])


def test_axial_smallest_head_dim_per_axis_count():
    # head_dim = 2 * n_axes is accepted: one pair per axis, rate 1
    inv, axis = posenc.axial_frequencies(6, 3)
    np.testing.assert_array_equal(inv, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(axis, [0, 1, 2])


@pytest.mark.parametrize(
    ("head_dim", "message"),
    [
        (7, "head_dim must be even, got 7"),
        (0, "head_dim must be a positive even integer, got 0"),
    ],
)
def test_axial_refuses_bad_head_dim(head_dim, message):
    with raises_exactly(message):
        posenc.axial_frequencies(head_dim, 1)


def test_axial_refuses_zero_axes():
    with raises_exactly("n_axes must be >= 1, got 0"):
        posenc.axial_frequencies(8, 0)
    with raises_exactly("n_axes must be an integer, got 1.0"):
        posenc.axial_frequencies(8, 1.0)


@pytest.mark.parametrize(("head_dim", "n_axes", "k"), [(10, 2, 4), (8, 3, 6), (4, 4, 8)])
def test_axial_refuses_head_dim_not_multiple_of_2_n_axes(head_dim, n_axes, k):
    with raises_exactly(f"head_dim must be a multiple of 2 * n_axes = {k}, got {head_dim}"):
        posenc.axial_frequencies(head_dim, n_axes)


def test_axial_pixel_refuses_non_positive_max_freq():
    with raises_exactly("max_freq must be a positive finite number, got 0.0"):
        posenc.axial_frequencies(8, freqs_for="pixel", max_freq=0)
    with raises_exactly("max_freq must be a positive real number, got '10'"):
        posenc.axial_frequencies(8, freqs_for="pixel", max_freq="10")


# -- mrope_frequencies ------------------------------------------------------------------------


def test_mrope_refuses_odd_head_dim():
    with raises_exactly("head_dim must be even, got 7"):
        posenc.mrope_frequencies(7, (1, 2))
    with raises_exactly("head_dim must be a positive even integer, got -2"):
        posenc.mrope_frequencies(-2, (1,))


def test_mrope_refuses_empty_section():
    # (2, 0, 2) sums to head_dim // 2 = 4 but gives height no pair
    with raises_exactly("sections must be >= 1, got 0"):
        posenc.mrope_frequencies(8, (2, 0, 2))
    with raises_exactly("sections must be an integer, got 1.5"):
        posenc.mrope_frequencies(8, (2, 1.5))
    # one pair, the smallest accepted section: base 1e4, d = 8 -> 1, 0.1, 0.01, 0.001
    inv, axis = posenc.mrope_frequencies(8, (3, 1))
    np.testing.assert_allclose(inv, [1.0, 0.1, 0.01, 0.001], rtol=1e-15)
    np.testing.assert_array_equal(axis, [0, 0, 0, 1])


@pytest.mark.parametrize(
    ("head_dim", "sections"), [(32, (4, 6, 5)), (8, ()), (8, (2, 3)), (10, (2, 2))]
)
def test_mrope_refuses_sections_not_summing_to_half(head_dim, sections):
    with raises_exactly(
        f"sections must sum to head_dim // 2 = {head_dim // 2}, got {tuple(sections)}"
    ):
        posenc.mrope_frequencies(head_dim, sections)


def test_mrope_interleaved_layout_by_hand():
    # (7, 4, 5): pair j to axis j % 3 while j < 3 * sections[j % 3]; pair 13 (h's 5th) -> t
    _, axis = posenc.mrope_frequencies(32, (7, 4, 5), interleaved=True)
    np.testing.assert_array_equal(axis, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0, 2, 0])


def test_mrope_refuses_uninterleavable_sections():
    with raises_exactly(
        "sections (4, 6, 6) cannot be interleaved (Qwen3-VL needs the later axes to "
        "have no more pairs than the first)"
    ):
        posenc.mrope_frequencies(32, (4, 6, 6), interleaved=True)


# -- rope_nd: conversions ---------------------------------------------------------------------


def test_rope_nd_int_input_gives_float64():
    # one pair (0, 1) turned by 1 * 1 rad: (1, 0) -> (cos 1, sin 1), not truncated to ints
    got = posenc.rope_nd([[1, 0]], [[1]], [1.0], [0])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, [[math.cos(1.0), math.sin(1.0)]], rtol=0, atol=1e-15)


def test_rope_nd_float32_input_gives_float64():
    got = posenc.rope_nd(np.array([[1.0, 0.0]], np.float32), [[2]], [1.0], [0])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, [[math.cos(2.0), math.sin(2.0)]], rtol=0, atol=1e-15)


def test_rope_nd_accepts_fraction_positions_and_rates():
    # angle 1/2 rad either way: (1, 0) -> (cos .5, sin .5)
    want = [[math.cos(0.5), math.sin(0.5)]]
    got = posenc.rope_nd([[1.0, 0.0]], [[Fraction(1, 2)]], [1.0], [0])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    got = posenc.rope_nd([[1.0, 0.0]], [[1]], [Fraction(1, 2)], [0])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_rope_nd_positions_with_more_batch_axes_than_x():
    # x (seq=3, 4) against positions (2, 3, 2): the result is (2, 3, 4), one rope_nd per batch
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4))
    pos = rng.integers(0, 9, (2, 3, 2))
    inv, axis = posenc.axial_frequencies(4, 2)
    got = posenc.rope_nd(x, pos, inv, axis)
    assert got.shape == (2, 3, 4)
    for b in range(2):
        np.testing.assert_array_equal(got[b], posenc.rope_nd(x, pos[b], inv, axis))
    # pair (0, 2) turns by the row, pair (1, 3) by the column, both at rate 1
    r, c = pos[1, 2]
    want = [
        x[2, 0] * math.cos(r) - x[2, 2] * math.sin(r),
        x[2, 1] * math.cos(c) - x[2, 3] * math.sin(c),
        x[2, 2] * math.cos(r) + x[2, 0] * math.sin(r),
        x[2, 3] * math.cos(c) + x[2, 1] * math.sin(c),
    ]
    np.testing.assert_allclose(got[1, 2], want, rtol=0, atol=1e-14)


# -- rope_nd: refusals ------------------------------------------------------------------------

INV, AXIS = [1.0, 1.0], [0, 1]


@pytest.mark.parametrize(
    ("x_shape", "pos"),
    [((4,), [[0, 1]]), ((1, 4), [0, 1]), ((4,), [0, 1])],
)
def test_rope_nd_refuses_1d_x_or_positions(x_shape, pos):
    with raises_exactly(
        "x must be (..., seq, head_dim) and positions (..., seq, n_axes), got "
        f"{x_shape} and {np.shape(pos)}"
    ):
        posenc.rope_nd(np.ones(x_shape), pos, INV, AXIS)


def test_rope_nd_smallest_shapes_accepted():
    # (seq=1, head_dim=2) and (seq=1, n_axes=1): one pair turned by 3 rad
    got = posenc.rope_nd([[0.0, 1.0]], [[3.0]], [1.0], [0])
    np.testing.assert_allclose(got, [[-math.sin(3.0), math.cos(3.0)]], rtol=0, atol=1e-15)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rope_nd_refuses_non_finite_positions(bad):
    with raises_exactly("positions must be finite"):
        posenc.rope_nd(np.ones((2, 4)), [[0.0, 1.0], [bad, 2.0]], INV, AXIS)


@pytest.mark.parametrize(
    ("x_shape", "inv", "axis", "shapes"),
    [
        ((1, 4), [1.0, 1.0], [0], "(2,) and (1,)"),  # axis shorter than inv_freq
        ((1, 4), [[1.0]], [[0]], "(1, 1) and (1, 1)"),  # 2-D rates
        ((1, 2), [1.0, 1.0], [0, 0], "(2,) and (2,)"),  # r = 4 > head_dim = 2
        ((2, 3, 4), [1.0] * 3, [0] * 3, "(3,) and (3,)"),  # r = 6 > 4, seq 3 != head_dim
    ],
)
def test_rope_nd_refuses_bad_rates(x_shape, inv, axis, shapes):
    with raises_exactly(
        f"inv_freq and axis must be (r // 2,) with r <= head_dim={x_shape[-1]}, got {shapes}"
    ):
        posenc.rope_nd(np.ones(x_shape), [[0, 1]] * x_shape[-2], inv, axis)


def test_rope_nd_rotary_dim_equal_to_head_dim_accepted():
    # r = head_dim = 2 is the largest accepted; r < head_dim leaves the tail as is
    np.testing.assert_allclose(posenc.rope_nd([[1.0, 0.0]], [[0, 1]], [1.0], [1]),
                               [[math.cos(1.0), math.sin(1.0)]], rtol=0, atol=1e-15)  # fmt: skip
    got = posenc.rope_nd([[1.0, 0.0, 7.0]], [[0, 1]], [1.0], [1])
    np.testing.assert_allclose(got, [[math.cos(1.0), math.sin(1.0), 7.0]], rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("axis", "shown"),
    [
        (np.array([2]), "[2]"),  # n_axes itself: the smallest refused
        (np.array([-1]), "[-1]"),
        (np.array([0.0]), "[0.]"),
        (np.array([True]), "[ True]"),
    ],
)
def test_rope_nd_refuses_axis_out_of_range(axis, shown):
    # positions (1, seq=3, n_axes=2): axes 0 .. 1 exist
    with raises_exactly(f"axis must hold ints in 0 .. 1, got {shown}"):
        posenc.rope_nd(np.ones((3, 2)), np.zeros((1, 3, 2)), [1.0], axis)


def test_rope_nd_largest_axis_accepted():
    # axis n_axes - 1 = 1, also as unsigned: the pair turns by the column, 2 rad
    for axis in ([1], np.array([1], np.uint8)):
        got = posenc.rope_nd(np.array([[1.0, 0.0]]), [[5.0, 2.0]], [1.0], axis)
        np.testing.assert_allclose(got, [[math.cos(2.0), math.sin(2.0)]], rtol=0, atol=1e-15)
