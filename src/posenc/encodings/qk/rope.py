"""Rotary position embedding (RoPE, Su et al., 2021), which acts on the *queries and keys*.

NumPy reference, float64 and cache-free. Shape legend: ``x`` is ``(..., seq, head_dim)``;
the first ``rotary_dim`` entries of the last axis are rotated in ``rotary_dim // 2``
pairs, the rest pass through.

Pairing conventions (a parameter, not folklore):

* ``"half"`` (GPT-NeoX, Llama, HF ``rotate_half``): pair ``j`` is ``(j, j + rotary_dim / 2)``;
* ``"interleaved"`` (GPT-J, Meta's original Llama, RoFormer): pair ``j`` is ``(2j, 2j + 1)``.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_dim, check_positions, check_positive
from posenc.scaling import Scaling

__all__ = ["rope_frequencies", "rope", "PAIRINGS"]

PAIRINGS = ("half", "interleaved")


def rope_frequencies(head_dim, *, base=10_000.0, scaling=None, rotary_dim=None, seq_len=None):
    r"""Inverse frequencies of RoPE and the attention scale applied to cos and sin.

    Default: :math:`\theta_j = \text{base}^{-2j/r}` for :math:`j < r/2` with ``r = rotary_dim``.

    Parameters
    ----------
    head_dim : int
        Width of one attention head; a positive even integer.
    base : float
        The RoPE base ("theta"); must be positive.
    scaling : posenc.scaling.Scaling, optional
        A scaling from :mod:`posenc.scaling` (``Linear``, ``NTK``, ``DynamicNTK``,
        ``YaRN``, ``Llama3``, ``LongRoPE``); ``None`` for the default rates.
    rotary_dim : int, optional
        How many leading dims are rotated (partial rotary); even, ``<= head_dim``.
    seq_len : int, optional
        Current sequence length, read by the length-dependent scalings (dynamic NTK,
        LongRoPE).

    Returns
    -------
    inv_freq : numpy.ndarray
        Float64, shape ``(rotary_dim // 2,)``.
    attention_scale : float
        Multiplies cos and sin (1 except for YaRN and LongRoPE).

    Examples
    --------
    >>> import posenc
    >>> inv, scale = posenc.rope_frequencies(8, base=100.0)
    >>> inv.round(4), scale
    (array([1.    , 0.3162, 0.1   , 0.0316]), 1.0)
    >>> inv2, _ = posenc.rope_frequencies(8, base=100.0, scaling=posenc.scaling.Linear(4.0))
    >>> bool((inv2 == inv / 4).all())
    True
    """
    head_dim = check_dim("head_dim", head_dim)
    rotary_dim = head_dim if rotary_dim is None else check_dim("rotary_dim", rotary_dim)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
    base = check_positive("base", base)
    if scaling is None:
        return base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim), 1.0
    if not isinstance(scaling, Scaling):
        raise ValueError(f"scaling must be a posenc.scaling object, got {scaling!r}")
    inv, scale = scaling.inv_freq(rotary_dim, base, seq_len)
    return np.asarray(inv, dtype=np.float64), float(scale)


def _positions(positions):
    """An int length or 1-D positions as :func:`check_positions`; more axes: checked ints."""
    pos = np.asarray(positions)
    if pos.ndim <= 1:
        return check_positions(positions)  # (seq,)
    if pos.dtype.kind not in "iu" or (pos < 0).any():
        raise ValueError("positions must hold non-negative integers")
    return pos


def _pair_index(rotary_dim, pairing):
    """Indices of the first and second member of each pair, each ``(rotary_dim // 2,)``."""
    if pairing == "half":
        return np.arange(rotary_dim // 2), np.arange(rotary_dim // 2, rotary_dim)
    if pairing == "interleaved":
        return np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2)
    raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")


def rope(
    x, positions, *, base=10_000.0, pairing="half", scaling=None, rotary_dim=None, seq_len=None
):
    r"""Rotate the last axis of ``x`` by position: RoPE.

    Pair ``j`` of the vector at position ``m`` is rotated by the angle :math:`m\theta_j`,

    .. math::

        \begin{pmatrix} x'_a \\ x'_b \end{pmatrix} = s
        \begin{pmatrix} \cos m\theta_j & -\sin m\theta_j \\
                        \sin m\theta_j & \cos m\theta_j \end{pmatrix}
        \begin{pmatrix} x_a \\ x_b \end{pmatrix},

    where ``(a, b)`` is the pair given by ``pairing`` and ``s`` the attention scale.
    Rotating queries and keys this way makes :math:`q'_m \cdot k'_n` depend on
    :math:`m - n` only (for ``s = 1``).

    Parameters
    ----------
    x : array_like
        Shape ``(..., seq, head_dim)``.
    positions : int or array_like of int
        A length ``seq`` (positions ``0 .. seq - 1``) or non-negative integer
        positions of shape ``(seq,)`` or broadcastable to ``x.shape[:-1]``.
    base : float
        The RoPE base; must be positive.
    pairing : {"half", "interleaved"}
        Which dimensions form a pair.
    scaling : posenc.scaling.Scaling, optional
        A scaling from :mod:`posenc.scaling`.
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` dims (default all).
    seq_len : int, optional
        For length-dependent scalings; default ``max(positions) + 1``.

    Returns
    -------
    numpy.ndarray
        Float64, same shape as ``x``.

    Examples
    --------
    >>> import numpy as np, posenc
    >>> q = np.array([[1.0, 0.0]])  # (seq=1, head_dim=2)
    >>> posenc.rope(q, [1]).round(4)  # rotated by 1 radian
    array([[0.5403, 0.8415]])
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., seq, head_dim), got {x.shape}")
    head_dim = x.shape[-1]
    pos = _positions(positions)  # (seq,) or (..., seq)
    if pos.shape[-1] != x.shape[-2]:
        raise ValueError(f"positions must have seq={x.shape[-2]} entries, got shape {pos.shape}")
    if seq_len is None:
        seq_len = int(pos.max()) + 1 if pos.size else 0
    inv, scale = rope_frequencies(
        head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim, seq_len=seq_len
    )
    r = 2 * inv.shape[0]
    a, b = _pair_index(r, pairing)
    angles = pos.astype(np.float64)[..., None] * inv  # (..., seq, r // 2)
    cos, sin = scale * np.cos(angles), scale * np.sin(angles)
    out = x.copy()
    out[..., a] = x[..., a] * cos - x[..., b] * sin
    out[..., b] = x[..., b] * cos + x[..., a] * sin
    return out
