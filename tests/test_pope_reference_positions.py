"""The NumPy PoPE reference with per-row positions and a wide ``delta``: positions shaped like
``q.shape[:-1]`` with one or two leading axes give each row its own phases (checked against
the formula written out in plain Python), rows are still validated one by one, and the
scores stay float64 even when ``delta`` arrives in a wider float type.
"""

from __future__ import annotations

import math

import numpy as np
from expect import raises_exactly

import posenc


def _softplus(x):
    return math.log1p(math.exp(x))


def _by_hand(q, k, qp, kp, delta, base=10_000.0):
    """a_mn = sum_c softplus(q_mc) softplus(k_nc) cos((kp_n - qp_m) theta_c + delta_c)."""
    d = len(q[0])
    theta = [base ** (-c / d) for c in range(d)]
    return np.array(
        [
            [
                sum(
                    _softplus(q[m][c])
                    * _softplus(k[n][c])
                    * math.cos((kp[n] - qp[m]) * theta[c] + delta[c])
                    for c in range(d)
                )
                for n in range(len(k))
            ]
            for m in range(len(q))
        ]
    )


def test_per_row_positions_give_each_row_its_own_phases():
    g = np.random.default_rng(1)
    q, k = g.normal(size=(2, 3, 4)), g.normal(size=(2, 2, 4))
    qp = np.array([[0, 5, 9], [3, 1, 7]])  # non-zero and different per row
    kp = np.array([[2, 8], [6, 0]])
    got = posenc.pope_scores(q, k, qp, kp)
    assert got.shape == (2, 3, 2) and got.dtype == np.float64
    for b in range(2):
        want = _by_hand(q[b].tolist(), k[b].tolist(), qp[b].tolist(), kp[b].tolist(), [0.0] * 4)
        np.testing.assert_allclose(got[b], want, rtol=1e-13, atol=1e-13)


def test_positions_with_two_leading_axes():
    g = np.random.default_rng(2)
    batch, heads, sq, sk, d = 2, 3, 4, 5, 2
    q, k = g.normal(size=(batch, heads, sq, d)), g.normal(size=(batch, heads, sk, d))
    qp = g.integers(0, 50, size=(batch, heads, sq))
    kp = g.integers(0, 50, size=(batch, heads, sk))
    delta = g.normal(size=(heads, d))
    got = posenc.pope_scores(q, k, qp, kp, delta=delta, base=100.0)
    assert got.shape == (batch, heads, sq, sk) and got.dtype == np.float64
    for b in range(batch):
        for h in range(heads):
            want = _by_hand(q[b, h].tolist(), k[b, h].tolist(), qp[b, h].tolist(),
                            kp[b, h].tolist(), delta[h].tolist(), base=100.0)  # fmt: skip
            np.testing.assert_allclose(got[b, h], want, rtol=1e-13, atol=1e-13)


def test_rows_of_three_axis_positions_checked_one_by_one():
    q = np.zeros((2, 3, 4, 2))
    kp = np.zeros((2, 3, 4))
    qp = np.zeros((2, 3, 4))
    qp[1, 2, 3] = 2.5
    with raises_exactly("q_positions must hold integers, got 2.5"):
        posenc.pope_scores(q, q, qp, kp)
    qp[1, 2, 3] = 3.0  # the nearest accepted value: an integral float
    got = posenc.pope_scores(q, q, qp, kp)
    assert got.shape == (2, 3, 4, 4)
    kp[0, 1, 0] = -1
    with raises_exactly("k_positions must be non-negative, got -1.0"):
        posenc.pope_scores(q, q, qp, kp)


def test_wide_float_delta_is_rounded_to_float64():
    g = np.random.default_rng(3)
    q, k = g.normal(size=(3, 4)), g.normal(size=(2, 4))
    wide = np.array([0.1, -0.2, 0.3, 1.0], dtype=np.longdouble) / 3
    got = posenc.pope_scores(q, k, [0, 4, 9], [1, 7], delta=wide)
    assert got.dtype == np.float64
    want = posenc.pope_scores(q, k, [0, 4, 9], [1, 7], delta=wide.astype(np.float64))
    np.testing.assert_array_equal(got, want)
