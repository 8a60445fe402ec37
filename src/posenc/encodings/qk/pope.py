"""PoPE, polar coordinate position embeddings (Gopalakrishnan et al., 2025): queries and keys.

NumPy reference, float64 and cache-free. Shape legend: ``q`` is ``(..., seq_q, head_dim)``,
``k`` is ``(..., seq_k, head_dim)``; scores are ``(..., seq_q, seq_k)``.

Each of the ``head_dim`` components becomes a complex number: its *magnitude* is
``softplus`` of the component (the "what"), its *phase* is the position times a
frequency (the "where"), plus a learned phase bias on the keys. RoPE, by contrast, rotates
pairs of components, so a pair's own angle (content) adds to the position angle.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_int, check_positions, check_positive

__all__ = ["pope_frequencies", "pope_scores"]


def pope_frequencies(head_dim: int, *, base: float = 10_000.0) -> np.ndarray:
    r"""PoPE's frequencies :math:`\theta_c = \text{base}^{-c/d}`, one per component, ``c < d``.

    Parameters
    ----------
    head_dim : int
        ``d``, the width of a query or key (any positive integer: no pairs).
    base : float
        Sets the slowest frequency; positive.

    Returns
    -------
    numpy.ndarray
        Float64 ``(head_dim,)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.pope_frequencies(4, base=10_000.0)
    array([1.  , 0.1 , 0.01 , 0.001])
    """
    d = check_int("head_dim", head_dim, minimum=1)
    base = check_positive("base", base)
    return base ** (-np.arange(d, dtype=np.float64) / d)


def _softplus(x):
    return np.logaddexp(0.0, x)


def pope_scores(q, k, q_positions, k_positions, *, delta=None, base=10_000.0) -> np.ndarray:
    r"""PoPE attention scores (before the softmax scale):

    .. math::

        a_{mn} = \sum_{c=0}^{d-1} \mu^q_{m,c}\, \mu^k_{n,c}\,
                 \cos\big((n - m)\,\theta_c + \delta_c\big),
        \qquad \mu = \operatorname{softplus}(x),

    for a query at position :math:`m` and a key at :math:`n`: the query's phase is
    :math:`m\theta_c`, the key's :math:`n\theta_c + \delta_c`, and the score is the real
    part of :math:`\sum_c \overline{z^q_c}\, z^k_c`. It depends on :math:`n - m` and on the
    magnitudes only; the phase of the content never enters.

    Parameters
    ----------
    q : array_like
        ``(..., seq_q, head_dim)``.
    k : array_like
        ``(..., seq_k, head_dim)``.
    q_positions, k_positions : int or array_like of int
        ``(seq,)`` positions, or arrays broadcastable to ``q.shape[:-1]`` / ``k.shape[:-1]``.
    delta : array_like, optional
        Phase bias :math:`\delta`, broadcastable to ``(..., head_dim)`` over the leading
        axes of ``q`` (e.g. ``(heads, head_dim)``); default 0.
    base : float
        As in :func:`pope_frequencies`.

    Returns
    -------
    numpy.ndarray
        Float64 ``(..., seq_q, seq_k)``.

    Examples
    --------
    >>> import numpy as np, posenc
    >>> q = k = np.zeros((1, 2))  # softplus(0) = log 2 in every component
    >>> s = posenc.pope_scores(q, k, [5], [3])
    >>> bool(np.isclose(s[0, 0], np.log(2) ** 2 * (np.cos(-2.0) + np.cos(-0.02))))
    True
    """
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    if q.ndim < 2 or k.ndim < 2 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be (..., seq, head_dim) alike, got {q.shape}, {k.shape}")
    theta = pope_frequencies(q.shape[-1], base=base)  # (d,)
    qp, kp = (_pos(name, p, t) for name, p, t in (("q_positions", q_positions, q),
                                                   ("k_positions", k_positions, k)))  # fmt: skip
    phase_q = qp[..., None] * theta  # (..., sq, d)
    phase_k = kp[..., None] * theta  # (..., sk, d)
    if delta is not None:
        delta = np.asarray(delta, dtype=np.float64)
        if delta.shape[-1] != q.shape[-1]:
            raise ValueError(f"delta must end in head_dim={q.shape[-1]}, got shape {delta.shape}")
        phase_k = phase_k + delta[..., None, :]  # (..., sk, d)
    zq = _softplus(q) * np.exp(1j * phase_q)  # (..., sq, d)
    zk = _softplus(k) * np.exp(1j * phase_k)  # (..., sk, d)
    return np.real(np.conj(zq) @ np.swapaxes(zk, -1, -2))  # (..., sq, sk)


def _pos(name, positions, x):
    pos = np.asarray(positions)
    if pos.ndim <= 1:
        pos = check_positions(positions, name)
    else:  # one row per leading index: each row checked like a 1-D array
        lead = int(np.prod(pos.shape[:-1]))  # rows, counted even when they are empty
        rows = [check_positions(row, name) for row in pos.reshape(lead, pos.shape[-1])]
        pos = np.stack(rows).reshape(pos.shape) if rows else np.zeros(pos.shape, np.int64)
    if pos.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name} must have {x.shape[-2]} entries, got {pos.shape[-1]}")
    return pos.astype(np.float64)
