"""Score biases of a fixed shape, ALiBi and T5 buckets: ``B[h, i, j]`` added to the scores.

NumPy reference, float64 and cache-free. Shape legend: positions are ``(seq,)`` or
``(batch, seq)`` integers (an int ``n`` means ``0 .. n - 1``); a bias is
``(heads, seq_q, seq_k)``, or ``(batch, heads, seq_q, seq_k)`` for per-row positions.
Query ``i`` and key ``j`` are positions; every bias here depends on ``i - j`` only. The
biases whose shape is learned (KERPLE, FIRE) are in :mod:`posenc.encodings.scores.learned_bias`.
"""

from __future__ import annotations

import math

import numpy as np

from posenc._checks import check_int, check_positions

__all__ = ["alibi_slopes", "alibi_bias", "t5_buckets"]


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
