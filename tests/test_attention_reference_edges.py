"""The NumPy reference attention's contract at its edges: float64 work whatever the input
dtype (q, k, v and bias), the exact refusal of a mask that empties a row, causal_mask's
smallest accepted size and exact refusals, and permutation_matrix's int output and its
refusal of a 0-d perm."""

from fractions import Fraction

import numpy as np
import pytest
from expect import raises_exactly

import posenc


def _softmax_attention_f64(q, k, v, bias=0.0):
    """Independent float64 oracle: softmax(q k^T / sqrt(d) + bias) v, row max subtracted."""
    q, k, v = (np.array(a, dtype=np.float64) for a in (q, k, v))
    s = q @ k.T / np.sqrt(q.shape[-1]) + np.array(bias, dtype=np.float64)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    w = e / e.sum(axis=-1, keepdims=True)
    return w @ v, w


def test_float32_inputs_are_worked_in_float64():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3))
    out, w = posenc.attention(q, k, v)
    assert out.dtype == np.float64 and w.dtype == np.float64
    ref_out, ref_w = _softmax_attention_f64(q, k, v)
    # float32 arithmetic would be off by ~1e-7; float64 agrees to rounding
    np.testing.assert_allclose(w, ref_w, rtol=1e-13, atol=0)
    np.testing.assert_allclose(out, ref_out, rtol=1e-13, atol=1e-15)


def test_longdouble_inputs_give_float64():
    q = k = np.eye(2, dtype=np.longdouble)
    v = np.array([[1.0], [3.0]], dtype=np.longdouble)
    out, w = posenc.attention(q, k, v)
    assert out.dtype == np.float64 and w.dtype == np.float64


def test_int8_inputs_do_not_wrap():
    # score of key 0 is 100 * 2 / sqrt(1) = 200 (int8 arithmetic would wrap it to -56),
    # key 1 scores 0: all the weight (1 - e^-200 == 1.0 in float64) goes to key 0
    q = np.array([[100]], dtype=np.int8)
    k = np.array([[2], [0]], dtype=np.int8)
    v = np.array([[5], [7]], dtype=np.int8)
    out, w = posenc.attention(q, k, v)
    np.testing.assert_array_equal(w, [[1.0, np.exp(-200.0)]])
    np.testing.assert_array_equal(out, [[5.0 + 7.0 * np.exp(-200.0)]])


def test_fraction_inputs_are_read_as_floats():
    half = Fraction(1, 2)
    q = [[half, Fraction(0)], [Fraction(0), Fraction(1)]]
    k = [[Fraction(1), Fraction(0)], [Fraction(0), Fraction(3, 2)]]
    v = [[Fraction(2)], [Fraction(-1)]]
    out, w = posenc.attention(q, k, v)
    ref_out, ref_w = _softmax_attention_f64(q, k, v)
    assert out.dtype == np.float64
    np.testing.assert_allclose(w, ref_w, rtol=1e-15)
    np.testing.assert_allclose(out, ref_out, rtol=1e-15)


def test_bias_is_read_as_float64():
    q = k = np.eye(2)
    v = np.array([[1.0], [3.0]])
    bias = [[Fraction(0), Fraction(1, 3)], [Fraction(-2), Fraction(0)]]
    out, w = posenc.attention(q, k, v, bias=bias)
    ref_out, ref_w = _softmax_attention_f64(q, k, v, bias=[[0.0, 1 / 3], [-2.0, 0.0]])
    assert out.dtype == np.float64 and w.dtype == np.float64
    np.testing.assert_allclose(w, ref_w, rtol=1e-15)
    np.testing.assert_allclose(out, ref_out, rtol=1e-15)
    _, w_ld = posenc.attention(q, k, v, bias=np.zeros((2, 2), dtype=np.longdouble))
    assert w_ld.dtype == np.float64


def test_mask_refusal_message_is_exact():
    q = k = np.ones((2, 4))
    v = np.ones((2, 1))
    # boundary: one key kept per row is accepted and takes all the weight
    _, w = posenc.attention(q, k, v, mask=np.array([[False, True], [True, False]]))
    np.testing.assert_array_equal(w, [[0.0, 1.0], [1.0, 0.0]])
    with raises_exactly("mask leaves a query with no key to attend to"):
        posenc.attention(q, k, v, mask=np.array([[True, False], [False, False]]))


def test_causal_mask_smallest_size():
    np.testing.assert_array_equal(posenc.causal_mask(1), [[True]])
    np.testing.assert_array_equal(posenc.causal_mask(1, 3), [[True, True, True]])
    assert posenc.causal_mask(1).dtype == bool


def test_causal_mask_refusals_are_exact():
    with raises_exactly("seq_q must be >= 1, got 0"):
        posenc.causal_mask(0)
    with raises_exactly("seq_q must be >= 1, got -1"):
        posenc.causal_mask(-1)
    with raises_exactly("seq_q must be >= 1, got 0"):
        posenc.causal_mask(0, 3)
    with raises_exactly("seq_q must be an integer, got 1.5"):
        posenc.causal_mask(1.5)
    with raises_exactly("seq_q must be an integer, got True"):
        posenc.causal_mask(True)


def test_permutation_matrix_is_int():
    P = posenc.permutation_matrix([1, 2, 0])
    assert np.issubdtype(P.dtype, np.integer)
    np.testing.assert_array_equal(P, [[0, 1, 0], [0, 0, 1], [1, 0, 0]])


def test_permutation_matrix_refuses_a_scalar():
    with raises_exactly("perm must be a permutation of 0..n-1, got 0"):
        posenc.permutation_matrix(0)
    with raises_exactly("perm must be a permutation of 0..n-1, got 2"):
        posenc.permutation_matrix(np.int64(2))


def test_a_bias_row_of_minus_inf_is_refused_not_nan():
    q = k = np.eye(2)
    v = np.ones((2, 1))
    with raises_exactly("bias leaves a query with no key to attend to (a row of -inf)"):
        posenc.attention(q, k, v, bias=np.array([[0.0, 0.0], [-np.inf, -np.inf]]))
    out, w = posenc.attention(q, k, v, bias=np.array([[0.0, -np.inf], [-np.inf, 0.0]]))
    np.testing.assert_array_equal(w, np.eye(2))  # one finite key per row is enough


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_one_axis_inputs_are_refused_by_name(which):
    args = {"q": np.ones((2, 2)), "k": np.ones((2, 2)), "v": np.ones((2, 1))}
    args[which] = np.ones(2)
    with raises_exactly(f"{which} must have shape (..., seq, dim), got (2,)"):
        posenc.attention(args["q"], args["k"], args["v"])
