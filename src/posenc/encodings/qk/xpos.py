r"""xPos (Sun et al., 2022): RoPE whose pairs also decay with distance (queries and keys).

NumPy reference, float64 and cache-free; shapes and pairings as in
:mod:`posenc.encodings.qk.rope`.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_dim, check_positions, check_positive
from posenc.encodings.qk.rope import _pair_index, _positions, rope

__all__ = ["xpos", "xpos_decay"]


def xpos_decay(rotary_dim, positions, *, scale_base=512.0, key=False, center=0):
    r"""xPos's per-pair scale :math:`\zeta_j^{\pm (p - c)/s}` (Sun et al., 2022).

    :math:`\zeta_j = (2j + 0.4 r) / (1.4 r)` for pair :math:`j < r/2` of a rotary width
    :math:`r`; queries get the power :math:`+(m - c)/s`, keys :math:`-(n - c)/s`, so a
    score is multiplied by :math:`\zeta_j^{(m - n)/s}` whatever the centre :math:`c`.

    Parameters
    ----------
    rotary_dim : int
        Rotary width ``r`` (even).
    positions : int or array_like of int
        Positions (any shape; an int ``n`` means ``0 .. n - 1``).
    scale_base : float
        :math:`s`, positive.
    key : bool
        Keys (negative power) instead of queries.
    center : float
        :math:`c`; it cancels in every score.

    Returns
    -------
    numpy.ndarray
        Float64 ``(*positions.shape, rotary_dim // 2)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.xpos_decay(4, [0, 512]).round(4)  # zeta = 1.6/5.6 and 3.6/5.6
    array([[1.    , 1.    ],
           [0.2857, 0.6429]])
    """
    r = check_dim("rotary_dim", rotary_dim)
    scale_base = check_positive("scale_base", scale_base)
    pos = _positions(positions)  # (seq,) or (..., seq)
    zeta = (np.arange(0, r, 2, dtype=np.float64) + 0.4 * r) / (1.4 * r)  # (r // 2,)
    power = (pos.astype(np.float64)[..., None] - center) / scale_base  # (..., 1)
    return zeta ** (-power if key else power)


def xpos(
    x, positions, *, key=False, scale_base=512.0, base=10_000.0, pairing="half", rotary_dim=None
):
    r"""xPos: RoPE with an exponential decay per pair (Sun et al., 2022).

    Rotates like :func:`rope`, then scales pair :math:`j` by :func:`xpos_decay`: queries by
    :math:`\zeta_j^{m/s}`, keys by :math:`\zeta_j^{-n/s}`, so the score of a pair is RoPE's
    times :math:`\zeta_j^{(m - n)/s}`, which decays with distance (:math:`\zeta_j < 1`).

    Parameters
    ----------
    x : array_like
        ``(..., seq, head_dim)``.
    positions : int or array_like of int
        As in :func:`rope`.
    key : bool
        Scale as keys (negative power) instead of queries.
    scale_base : float
        :math:`s`.
    base : float
        The RoPE base.
    pairing : {"half", "interleaved"}
        Which dims form a pair.
    rotary_dim : int, optional
        Rotate (and scale) only the first ``rotary_dim`` dims.

    Returns
    -------
    numpy.ndarray
        Float64, same shape as ``x``.

    Examples
    --------
    >>> import numpy as np, posenc
    >>> q = k = np.ones((1, 4))
    >>> def score(m, n):
    ...     return (posenc.xpos(q, [m]) @ posenc.xpos(k, [n], key=True).T).item()
    >>> round(score(600, 100), 6), round(score(1100, 600), 6)  # depends on m - n only
    (-0.151601, -0.151601)
    """
    out = rope(x, positions, base=base, pairing=pairing, rotary_dim=rotary_dim)
    r = out.shape[-1] if rotary_dim is None else rotary_dim
    a, b = _pair_index(r, pairing)
    pos = np.asarray(positions) if np.ndim(positions) else check_positions(positions)
    decay = xpos_decay(r, pos, scale_base=scale_base, key=key)  # (..., seq, r // 2)
    out[..., a] *= decay
    out[..., b] *= decay
    return out
