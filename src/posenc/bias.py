"""Encodings that act on the *scores*: a bias ``B[h, i, j]`` added to ``q_i . k_j / sqrt(d)``.

NumPy reference, float64 and cache-free. Shape legend: positions are ``(seq,)`` or
``(batch, seq)`` integers (an int ``n`` means ``0 .. n - 1``); a bias is
``(heads, seq_q, seq_k)``, or ``(batch, heads, seq_q, seq_k)`` for per-row positions.
Query ``i`` and key ``j`` are positions; every bias here depends on ``i - j`` only
(FIRE: while ``i`` stays below its threshold ``L``).
"""

from __future__ import annotations

import math

import numpy as np

from posenc._checks import check_int, check_positions, check_positive

__all__ = ["alibi_slopes", "alibi_bias", "t5_buckets", "kerple_bias", "fire_bias"]


def alibi_slopes(heads: int) -> np.ndarray:
    r"""ALiBi's per-head slopes (Press et al., 2022), as in the authors' ``get_slopes``.

    For a power of two :math:`n`, the slopes are :math:`s, s^2, \dots, s^n` with
    :math:`s = 2^{-8/n}`. Otherwise, with :math:`c = 2^{\lfloor \log_2 n \rfloor}`, the
    slopes of :math:`c` heads are followed by every other slope of :math:`2c` heads
    (``[0::2]``), as many as needed -- so the list is not monotone.

    Parameters
    ----------
    heads : int
        Number of heads, ``>= 1``.

    Returns
    -------
    numpy.ndarray
        Float64, shape ``(heads,)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.alibi_slopes(8)
    array([0.5       , 0.25      , 0.125     , 0.0625    , 0.03125   ,
           0.015625  , 0.0078125 , 0.00390625])
    >>> posenc.alibi_slopes(6)  # 4 heads' slopes, then slopes 0 and 2 of 8 heads
    array([0.25      , 0.0625    , 0.015625  , 0.00390625, 0.5       ,
           0.125     ])
    """
    heads = check_int("heads", heads, minimum=1)

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return start ** np.arange(1, n + 1, dtype=np.float64)  # (n,)

    c = 2 ** int(math.floor(math.log2(heads)))
    if c == heads:
        return power_of_two(heads)
    return np.concatenate([power_of_two(c), power_of_two(2 * c)[0::2][: heads - c]])


def _positions(name, positions) -> np.ndarray:
    """An int length, a ``(seq,)`` or a ``(batch, seq)`` array of non-negative ints."""
    arr = np.asarray(positions)
    if arr.ndim == 2:
        rows = [check_positions(row, name) for row in arr]
        return np.stack(rows) if rows else arr.astype(np.int64)
    return check_positions(positions, name)


def relative_positions(q_positions, k_positions) -> np.ndarray:
    """``i - j`` for every query position ``i`` and key position ``j``.

    Parameters
    ----------
    q_positions, k_positions : int or array_like of int
        ``(seq,)`` or ``(batch, seq)``; batches must agree.

    Returns
    -------
    numpy.ndarray
        Int64 ``(seq_q, seq_k)`` or ``(batch, seq_q, seq_k)``.
    """
    qp, kp = _positions("q_positions", q_positions), _positions("k_positions", k_positions)
    if qp.ndim == 2 and kp.ndim == 2 and qp.shape[0] != kp.shape[0]:
        raise ValueError(
            f"k_positions must have the batch of q_positions ({qp.shape[0]}), got {kp.shape[0]}"
        )
    return qp[..., :, None] - kp[..., None, :]  # (..., seq_q, seq_k)


def alibi_bias(slopes, q_positions, k_positions, *, symmetric=False) -> np.ndarray:
    r"""ALiBi: a linear penalty :math:`B_{h,i,j} = -m_h\,(i - j)` on the scores.

    The causal form penalises the distance back to each key; ``symmetric=True`` gives
    :math:`-m_h\,|i - j|` for bidirectional attention. Implementations that add
    :math:`m_h\,j` instead differ from the causal form by a per-row constant
    (:math:`-m_h\,i`), which the softmax ignores -- but not in the symmetric case, and
    not in low precision (see Part 4).

    Parameters
    ----------
    slopes : array_like
        Per-head slopes ``(heads,)``, e.g. :func:`alibi_slopes`.
    q_positions, k_positions : int or array_like of int
        ``(seq,)`` or ``(batch, seq)``.
    symmetric : bool
        Penalise ``|i - j|`` (bidirectional) instead of ``i - j``.

    Returns
    -------
    numpy.ndarray
        Float64 ``(heads, seq_q, seq_k)`` or ``(batch, heads, seq_q, seq_k)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.alibi_bias([0.5], 3, 3)[0]
    array([[-0. ,  0.5,  1. ],
           [-0.5, -0. ,  0.5],
           [-1. , -0.5, -0. ]])
    """
    slopes = np.asarray(slopes, dtype=np.float64)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape (heads,), got {slopes.shape}")
    rel = relative_positions(q_positions, k_positions).astype(np.float64)
    dist = np.abs(rel) if symmetric else rel
    return -slopes[:, None, None] * dist[..., None, :, :]  # (..., heads, sq, sk)


def t5_buckets(relative, *, bidirectional=True, num_buckets=32, max_distance=128) -> np.ndarray:
    """T5's bucket of each relative position ``key - query`` (Raffel et al., 2020).

    Bidirectional: half the buckets for keys before the query, half (offset by
    ``num_buckets // 2``) for keys after it. Unidirectional: every future key falls in
    bucket 0. Within a direction, distances below half the buckets have a bucket each;
    larger ones share logarithmically wider buckets up to ``max_distance``, beyond which
    all share the last. Computed like HF's ``T5Attention._relative_position_bucket``
    (float32 logarithm, truncation toward zero), so buckets match T5 checkpoints.

    Parameters
    ----------
    relative : array_like of int
        ``key - query`` positions, any shape.
    bidirectional : bool
        Encoder-style (both directions) or decoder-style (causal).
    num_buckets : int
        Number of buckets; even and at least 4 when bidirectional.
    max_distance : int
        Distances at or beyond it share the last bucket; must exceed ``num_buckets // 2``.

    Returns
    -------
    numpy.ndarray
        Int64 buckets in ``[0, num_buckets)``, same shape as ``relative``.

    Examples
    --------
    >>> import posenc
    >>> posenc.t5_buckets([-200, -20, -3, 0, 3, 20, 200], bidirectional=True)
    array([15, 10,  3,  0, 19, 26, 31])
    >>> posenc.t5_buckets([-200, -20, -3, 0, 3], bidirectional=False)
    array([31, 17,  3,  0,  0])
    """
    num_buckets = check_int("num_buckets", num_buckets, minimum=2)
    max_distance = check_int("max_distance", max_distance, minimum=1)
    if bidirectional and num_buckets % 2:
        raise ValueError(f"num_buckets must be even when bidirectional, got {num_buckets}")
    if bidirectional and num_buckets < 4:  # per direction: exact buckets, then log buckets
        raise ValueError(f"num_buckets must be >= 4 when bidirectional, got {num_buckets}")
    if max_distance <= num_buckets // 2:
        raise ValueError(
            f"max_distance must be > num_buckets // 2 = {num_buckets // 2}, got {max_distance}"
        )
    rel = np.asarray(relative)
    if not np.issubdtype(rel.dtype, np.integer):
        raise ValueError(f"relative must hold integers, got dtype {rel.dtype}")
    rel = rel.astype(np.int64)
    buckets = np.zeros(rel.shape, dtype=np.int64)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets += (rel > 0) * n
        dist = np.abs(rel)
    else:
        dist = -np.minimum(rel, 0)
    exact = n // 2
    far = np.maximum(dist, exact).astype(np.float32)  # small distances are discarded below
    scaled = np.log(far / np.float32(exact)) / np.float32(math.log(max_distance / exact))
    large = exact + (scaled * np.float32(n - exact)).astype(np.int64)  # trunc toward zero
    large = np.minimum(large, n - 1)
    return buckets + np.where(dist < exact, dist, large)


def kerple_bias(q_positions, k_positions, r1, r2, *, variant="log") -> np.ndarray:
    r"""KERPLE (Chi et al., 2022): a learned, conditionally positive definite distance kernel.

    ``"log"``: :math:`B_{h,i,j} = -r_1^{(h)} \log(1 + r_2^{(h)} |i - j|)`;
    ``"power"``: :math:`B_{h,i,j} = -r_1^{(h)} |i - j|^{r_2^{(h)}}` with
    :math:`0 < r_2 \le 2`. With ``"power"`` and :math:`r_2 = 1` it is symmetric ALiBi.

    Parameters
    ----------
    q_positions, k_positions : int or array_like of int
        ``(seq,)`` or ``(batch, seq)``.
    r1, r2 : array_like
        Positive per-head parameters ``(heads,)``.
    variant : {"log", "power"}
        The kernel.

    Returns
    -------
    numpy.ndarray
        Float64 ``(heads, seq_q, seq_k)`` or ``(batch, heads, seq_q, seq_k)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.kerple_bias(3, 3, [1.0], [1.0], variant="power")[0, 2]
    array([-2., -1., -0.])
    """
    r1, r2 = (np.asarray(a, dtype=np.float64) for a in (r1, r2))
    if r1.ndim != 1 or r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must have shape (heads,), got {r1.shape} and {r2.shape}")
    if (r1 <= 0).any() or (r2 <= 0).any():
        raise ValueError("r1 and r2 must be positive")
    dist = np.abs(relative_positions(q_positions, k_positions)).astype(np.float64)[..., None, :, :]
    if variant == "log":
        return -r1[:, None, None] * np.log1p(r2[:, None, None] * dist)
    if variant == "power":
        if (r2 > 2).any():
            raise ValueError(f"r2 must be <= 2 for the power variant, got {r2.max()}")
        return -r1[:, None, None] * dist ** r2[:, None, None]
    raise ValueError(f"variant must be one of ('log', 'power'), got {variant!r}")


def fire_bias(q_positions, k_positions, *, c, threshold, w1, b1, w2, b2, eps=1e-6) -> np.ndarray:
    r"""FIRE (Li et al., 2023): an MLP of the progressively interpolated distance.

    .. math::

        B_{h,i,j} = f_\theta\!\left(\frac{\psi(|i - j|)}{\psi(\max(L, i))}\right),
        \qquad \psi(x) = \log(c\,x + 1),

    where :math:`f_\theta` is a one-hidden-layer ReLU MLP from 1 input to ``heads``
    outputs. Dividing by :math:`\psi(\max(L, i))` maps every distance a query can see into
    :math:`[0, 1]`, whatever its position; below the threshold :math:`L` the bias depends
    on :math:`|i - j|` only. ``eps`` is added to the denominator.

    Parameters
    ----------
    q_positions, k_positions : int or array_like of int
        ``(seq,)`` or ``(batch, seq)``.
    c : float
        Positive scale of :math:`\psi`.
    threshold : float
        :math:`L`, positive.
    w1, b1 : array_like
        First layer: ``(hidden,)`` weights and ``(hidden,)`` biases.
    w2, b2 : array_like
        Second layer: ``(heads, hidden)`` weights and ``(heads,)`` biases.
    eps : float
        Added to :math:`\psi(\max(L, i))`.

    Returns
    -------
    numpy.ndarray
        Float64 ``(heads, seq_q, seq_k)`` or ``(batch, heads, seq_q, seq_k)``.
    """
    c, threshold = check_positive("c", c), check_positive("threshold", threshold)
    w1, b1, w2, b2 = (np.asarray(a, dtype=np.float64) for a in (w1, b1, w2, b2))
    if w1.ndim != 1 or b1.shape != w1.shape or w2.shape[1:] != w1.shape or b2.shape != w2.shape[:1]:
        raise ValueError(
            "FIRE weights must be w1 (hidden,), b1 (hidden,), w2 (heads, hidden), b2 (heads,), "
            f"got {w1.shape}, {b1.shape}, {w2.shape}, {b2.shape}"
        )
    rel = relative_positions(q_positions, k_positions).astype(np.float64)  # (..., sq, sk)
    i = rel + _positions("k_positions", k_positions)[..., None, :]  # query position per entry
    x = np.log1p(c * np.abs(rel)) / (np.log1p(c * np.maximum(threshold, i)) + eps)
    hidden = np.maximum(x[..., None] * w1 + b1, 0.0)  # (..., sq, sk, hidden)
    out = hidden @ w2.T + b2  # (..., sq, sk, heads)
    return np.moveaxis(out, -1, -3)  # (..., heads, sq, sk)
