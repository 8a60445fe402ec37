"""posenc.bias (NumPy score biases): exact refusals, T5 defaults and bounds, float64 outputs.

Pins what the parity tests leave open: the whole message of every refusal (the parameter
it names, the shapes it quotes), per-row positions validated row by row and an empty batch
accepted, ``t5_buckets``' default ``num_buckets``/``max_distance`` and its smallest accepted
values, float64 results for parameters that are not floats (exact ``Fraction``\\ s),, and
bidirectional buckets refused below 4 (one exact and one log bucket per direction).
"""

import math
from fractions import Fraction

import numpy as np
from expect import raises_exactly

import posenc
from posenc.encodings.scores.bias import relative_positions

HALF = [Fraction(1, 2)]  # an exact slope / parameter that is not a float


def test_per_row_positions_are_checked_row_by_row_under_their_name():
    for bad, got in (([[0, 1], [2, -1]], "-1"), ([[0.0, 1.5]], "1.5")):
        msg = "must be non-negative" if got == "-1" else "must hold integers"
        with raises_exactly(f"q_positions {msg}, got {got}"):
            posenc.alibi_bias([0.5], bad, [[0, 1]] * len(bad))
        with raises_exactly(f"k_positions {msg}, got {got}"):
            posenc.alibi_bias([0.5], [[0, 1]] * len(bad), bad)


def test_bad_flat_positions_name_the_argument():
    with raises_exactly("q_positions must be >= 0, got -1"):
        relative_positions(-1, 2)
    with raises_exactly("k_positions must be non-negative, got -3"):
        relative_positions(2, [0, -3])


def test_batch_mismatch_quotes_both_batch_sizes():
    # seq lengths (4, 5) differ from the batches (2, 3), so a swapped axis shows
    with raises_exactly("k_positions must have the batch of q_positions (2), got 3"):
        relative_positions(np.zeros((2, 4), int), np.zeros((3, 5), int))


def test_empty_batch_gives_empty_int64_relative_positions():
    rel = relative_positions(np.zeros((0, 3), int), np.zeros((0, 4), int))
    assert rel.shape == (0, 3, 4) and rel.dtype == np.int64
    bias = posenc.alibi_bias([0.5, 0.25], np.zeros((0, 3), int), np.zeros((0, 4), int))
    assert bias.shape == (0, 2, 3, 4) and bias.dtype == np.float64


def test_per_row_float_positions_give_int64_differences():
    rel = relative_positions([[0.0, 2.0]], [[1.0, 3.0, 0.0]])
    assert rel.dtype == np.int64
    np.testing.assert_array_equal(rel, [[[-1, -3, 0], [1, -1, 2]]])


def test_alibi_slopes_that_are_not_floats_give_float64():
    bias = posenc.alibi_bias(HALF, 2, 2)  # -0.5 * (i - j)
    assert bias.dtype == np.float64
    np.testing.assert_array_equal(bias, [[[0.0, 0.5], [-0.5, 0.0]]])
    with raises_exactly("slopes must have shape (heads,), got (1, 1)"):
        posenc.alibi_bias([[0.5]], 2, 2)
    with raises_exactly("slopes must have shape (heads,), got ()"):
        posenc.alibi_bias(0.5, 2, 2)


def test_kerple_parameters_that_are_not_floats_give_float64():
    log = posenc.kerple_bias(3, 3, HALF, HALF)  # -0.5 log(1 + 0.5 |i - j|)
    assert log.dtype == np.float64
    np.testing.assert_allclose(log[0, 2], [-0.5 * math.log(2.0), -0.5 * math.log(1.5), 0.0])
    power = posenc.kerple_bias(3, 3, HALF, HALF, variant="power")  # -0.5 |i - j| ** 0.5
    assert power.dtype == np.float64
    np.testing.assert_allclose(power[0, 2], [-0.5 * math.sqrt(2.0), -0.5, 0.0])


def test_kerple_non_positive_parameter_message():
    with raises_exactly("r1 and r2 must be positive"):
        posenc.kerple_bias(3, 3, [1.0], [0.0])


def test_fire_weights_that_are_not_floats_give_float64():
    # hidden = 1, heads = 1, w1 = w2 = 1/2, b1 = b2 = 0: B = x / 4 with
    # x = log(1 + c |i - j|) / (log(1 + c max(L, i)) + eps), c = 1, L = 2
    w = {"w1": HALF, "b1": [Fraction(0)], "w2": [HALF], "b2": [Fraction(0)]}
    out = posenc.fire_bias(3, 3, c=1.0, threshold=2.0, eps=0.0, **w)
    assert out.dtype == np.float64
    row2 = [math.log(3.0) / math.log(3.0) / 4, math.log(2.0) / math.log(3.0) / 4, 0.0]
    np.testing.assert_allclose(out[0, 2], row2, rtol=1e-15)


def test_fire_bad_weights_message_is_whole():
    w = {"w1": np.ones(3), "b1": np.zeros(2), "w2": np.ones((2, 3)), "b2": np.zeros(2)}
    with raises_exactly(
        "FIRE weights must be w1 (hidden,), b1 (hidden,), w2 (heads, hidden), b2 (heads,), "
        "got (3,), (2,), (2, 3), (2,)"
    ):
        posenc.fire_bias(2, 2, c=1.0, threshold=2.0, **w)


def test_t5_default_buckets_are_32_and_max_distance_128():
    # bidirectional: n = 16 per direction, exact = 8; past |d| = 91:
    # 8 + trunc(8 ln(91/8) / ln(128/8)) = 8 + trunc(7.015) = 15 (ln(129/8) would give 6.996)
    np.testing.assert_array_equal(
        posenc.t5_buckets([-200, -91, -20, -3, 0, 3, 20, 91, 200]),
        [15, 15, 10, 3, 0, 19, 26, 31, 31],
    )
    # causal: n = 32, exact = 16; d = -67: 16 + trunc(16 ln(67/16) / ln(128/16)) = 16 + 11
    # (11.02; with max_distance 129 it is 10.98)
    np.testing.assert_array_equal(
        posenc.t5_buckets([-67, -15, 5], bidirectional=False), [27, 15, 0]
    )


def test_t5_smallest_accepted_num_buckets_and_max_distance():
    # num_buckets = 2, causal: n = 2, exact = 1; every past key is in bucket 1
    np.testing.assert_array_equal(
        posenc.t5_buckets([3, 0, -1, -2, -100], bidirectional=False, num_buckets=2, max_distance=2),
        [0, 0, 1, 1, 1],
    )
    with raises_exactly("num_buckets must be >= 2, got 1"):
        posenc.t5_buckets([0], bidirectional=False, num_buckets=1)
    with raises_exactly("num_buckets must be an integer, got 2.0"):
        posenc.t5_buckets([0], bidirectional=False, num_buckets=2.0)
    with raises_exactly("max_distance must be >= 1, got 0"):
        posenc.t5_buckets([0], bidirectional=False, num_buckets=2, max_distance=0)
    with raises_exactly("max_distance must be an integer, got 2.0"):
        posenc.t5_buckets([0], bidirectional=False, num_buckets=2, max_distance=2.0)
    # max_distance = 1 passes its own minimum, then fails the bound against num_buckets
    with raises_exactly("max_distance must be > num_buckets // 2 = 1, got 1"):
        posenc.t5_buckets([0], bidirectional=False, num_buckets=2, max_distance=1)


def test_t5_refuses_non_integer_relative_positions():
    with raises_exactly("relative must hold integers, got dtype float64"):
        posenc.t5_buckets([0.0, 1.0])


def test_t5_bidirectional_needs_four_buckets():
    # 2 buckets split into 1 per direction: exact = 1 // 2 = 0 and log(max_distance / 0)
    with raises_exactly("num_buckets must be >= 4 when bidirectional, got 2"):
        posenc.t5_buckets([0, 1, -1], num_buckets=2, max_distance=4)
    # 4: per direction exact = 1 (distance 0) and one log bucket (distances >= 1)
    got = posenc.t5_buckets([-9, -1, 0, 1, 9], num_buckets=4, max_distance=4)
    np.testing.assert_array_equal(got, [1, 1, 0, 3, 3])
