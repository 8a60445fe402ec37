"""Plain scaled dot-product attention in NumPy: the oracle the torch layer is tested against.

Shape legend (SDPA order): ``(..., seq_q, head_dim)`` queries, ``(..., seq_k, head_dim)``
keys, ``(..., seq_k, v_dim)`` values, where ``...`` is typically ``(batch, heads)``.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_int

__all__ = ["attention", "causal_mask", "permutation_matrix"]


def attention(q, k, v, *, mask=None, bias=None):
    r"""Scaled dot-product attention, :math:`\mathrm{softmax}(QK^\top/\sqrt{d} + B)\,V`.

    The softmax runs over keys (the last axis) and subtracts the row maximum first,
    so large scores do not overflow.

    Parameters
    ----------
    q : array_like
        Queries, shape ``(..., seq_q, head_dim)``.
    k : array_like
        Keys, shape ``(..., seq_k, head_dim)``.
    v : array_like
        Values, shape ``(..., seq_k, v_dim)``.
    mask : array_like of bool, optional
        ``True`` where a query may attend to a key; broadcastable to
        ``(..., seq_q, seq_k)``. Every query must keep at least one key.
    bias : array_like, optional
        Added to the scaled scores before the softmax (ALiBi, T5, ...);
        broadcastable to ``(..., seq_q, seq_k)``.

    Returns
    -------
    out : numpy.ndarray
        Shape ``(..., seq_q, v_dim)``, float64.
    weights : numpy.ndarray
        Shape ``(..., seq_q, seq_k)``; each row sums to 1.

    Examples
    --------
    >>> import numpy as np, posenc
    >>> q = k = np.eye(2)
    >>> v = np.array([[1.0], [3.0]])
    >>> out, w = posenc.attention(q, k, v)
    >>> out.round(4)
    array([[1.6604],
           [2.3396]])
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., seq, dim), got {a.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share head_dim on their last axis, got {q.shape} and {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share seq_k, got {k.shape} and {v.shape}")
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (..., seq_q, seq_k)
    if bias is not None:
        scores = scores + np.asarray(bias, dtype=np.float64)
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), scores.shape)
        if not mask.any(axis=-1).all():
            raise ValueError("mask leaves a query with no key to attend to")
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)  # (..., seq_q, 1)
    if np.isneginf(top).any():  # softmax of a row of -inf is 0 / 0
        raise ValueError("bias leaves a query with no key to attend to (a row of -inf)")
    scores = scores - top
    weights = np.exp(scores)  # (..., seq_q, seq_k)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ v, weights  # (..., seq_q, v_dim), (..., seq_q, seq_k)


def causal_mask(seq_q: int, seq_k: int | None = None) -> np.ndarray:
    """Boolean causal mask: query ``i`` sees keys up to ``i`` (aligned at the end).

    Parameters
    ----------
    seq_q : int
        Number of queries.
    seq_k : int, optional
        Number of keys (default ``seq_q``). With ``seq_k > seq_q`` the queries are
        the last ``seq_q`` positions, as when decoding with a KV cache.

    Returns
    -------
    numpy.ndarray
        Bool array of shape ``(seq_q, seq_k)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    seq_q = check_int("seq_q", seq_q, minimum=1)
    seq_k = seq_q if seq_k is None else check_int("seq_k", seq_k, minimum=seq_q)
    return np.tril(np.ones((seq_q, seq_k), dtype=bool), k=seq_k - seq_q)


def permutation_matrix(perm) -> np.ndarray:
    """The matrix ``P`` with ``P @ X == X[perm]`` for any ``X`` with ``len(perm)`` rows.

    Parameters
    ----------
    perm : array_like of int
        A permutation of ``0 .. n - 1``.

    Returns
    -------
    numpy.ndarray
        Int array of shape ``(n, n)`` with a single 1 in each row and column;
        its inverse is its transpose.

    Examples
    --------
    >>> import posenc
    >>> posenc.permutation_matrix([1, 2, 0])
    array([[0, 1, 0],
           [0, 0, 1],
           [1, 0, 0]])
    """
    perm = np.asarray(perm)
    n = perm.shape[0] if perm.ndim == 1 else -1
    if (
        perm.ndim != 1
        or not np.issubdtype(perm.dtype, np.integer)
        or not np.array_equal(np.sort(perm), np.arange(n))
    ):
        raise ValueError(f"perm must be a permutation of 0..n-1, got {perm.tolist()!r}")
    P = np.zeros((n, n), dtype=int)  # (n, n)
    P[np.arange(n), perm] = 1
    return P
