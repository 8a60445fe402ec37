"""The NumPy PoPE reference at its edges: its formula written out by hand for one score,
float64 whatever the inputs' dtype, ``base`` honoured, and every refusal's exact message.
"""

from __future__ import annotations

import math

import numpy as np
from expect import raises_exactly

import posenc


def _softplus(x):
    return math.log1p(math.exp(x))


def test_one_score_by_hand_with_base_and_delta():
    q, k = np.array([[0.5, -1.0, 2.0]]), np.array([[1.5, 0.25, -0.5]])
    delta = np.array([0.1, -0.2, 0.3])
    base = 100.0
    got = posenc.pope_scores(q, k, [4], [1], delta=delta, base=base)
    theta = [base ** (-c / 3) for c in range(3)]  # 1, 100^(-1/3), 100^(-2/3)
    want = sum(_softplus(q[0, c]) * _softplus(k[0, c]) * math.cos((1 - 4) * theta[c] + delta[c])
               for c in range(3))  # fmt: skip
    assert got.shape == (1, 1) and got.dtype == np.float64
    assert abs(got[0, 0] - want) < 1e-14
    np.testing.assert_allclose(posenc.pope_frequencies(3, base=base), theta, rtol=1e-15)


def test_computed_in_float64_whatever_the_inputs_dtype():
    g = np.random.default_rng(0)
    q, k = g.normal(size=(2, 5, 6)), g.normal(size=(2, 7, 6))
    delta = g.normal(size=(2, 6))
    ref = posenc.pope_scores(q, k, range(5), range(7), delta=delta)
    low = posenc.pope_scores(q.astype(np.float32), k.astype(np.float32), range(5), range(7),
                             delta=delta.astype(np.float32))  # fmt: skip
    exact = posenc.pope_scores(q.astype(np.float32).astype(np.float64),
                               k.astype(np.float32).astype(np.float64), range(5), range(7),
                               delta=delta.astype(np.float32).astype(np.float64))  # fmt: skip
    assert low.dtype == np.float64
    np.testing.assert_allclose(low, exact, rtol=1e-13, atol=1e-13)  # not float32 arithmetic
    assert np.abs(low - ref).max() > 1e-9  # (the float32 inputs themselves differ)
    assert posenc.pope_frequencies(4, base=np.float32(10.0)).dtype == np.float64


def test_pope_refusals():
    q = np.zeros((2, 4))
    with raises_exactly("base must be a positive finite number, got -1.0"):
        posenc.pope_frequencies(4, base=-1.0)
    with raises_exactly("base must be a positive finite number, got 0.0"):
        posenc.pope_scores(q, q, range(2), range(2), base=0)
    for a, b in ((np.zeros(4), q), (q, np.zeros(4)), (q, np.zeros((2, 3)))):
        alike = "q and k must be (..., seq, head_dim) alike"
        with raises_exactly(f"{alike}, got {a.shape}, {b.shape}"):
            posenc.pope_scores(a, b, range(2), range(2))
    with raises_exactly("k_positions must have 2 entries, got 3"):
        posenc.pope_scores(q, q, range(2), range(3))
    with raises_exactly("k_positions must be non-negative, got -1"):
        posenc.pope_scores(q, q, range(2), [0, -1])
    with raises_exactly("q_positions must be non-negative, got -2"):
        posenc.pope_scores(q, q, np.array([[0, -2]]), range(2))
    with raises_exactly("delta must end in head_dim=4, got shape (3,)"):
        posenc.pope_scores(np.zeros((1, 2, 4)), np.zeros((1, 2, 4)), range(2), range(2),
                           delta=np.zeros(3))  # fmt: skip


def test_per_row_positions_with_no_keys_or_no_rows_give_empty_scores():
    q = np.ones((2, 3, 4))
    got = posenc.pope_scores(q, np.ones((2, 0, 4)), np.zeros((2, 3)), np.zeros((2, 0)))
    assert got.shape == (2, 3, 0) and got.dtype == np.float64
    none = posenc.pope_scores(np.ones((0, 3, 4)), np.ones((0, 2, 4)), np.zeros((0, 3)),
                              np.zeros((0, 2)))  # fmt: skip
    assert none.shape == (0, 3, 2)
    with raises_exactly("k_positions must be non-negative, got -1"):  # rows still checked
        posenc.pope_scores(q, np.ones((2, 2, 4)), np.zeros((2, 3)), [[0, 1], [0, -1]])
