r"""RoPE over a grid: axial RoPE and multimodal RoPE (M-RoPE), acting on the *queries and keys*.

NumPy reference, float64 and cache-free. Shape legend: ``x`` is ``(..., seq, head_dim)``;
``positions`` are ``(..., seq, n_axes)`` coordinates (``n_axes = 2`` for an image's
``(row, column)``, 3 for M-RoPE's ``(time, height, width)``).

Every scheme here is 1-D RoPE with one change: rotary pair :math:`j` turns at its rate
:math:`\theta_j` times the coordinate of *its own axis* :math:`a_j`,

.. math::

    \phi_j = p_{a_j}\,\theta_j ,

so a scheme is two arrays of length ``head_dim // 2``: the rates ``inv_freq`` and the
``axis`` of each pair. The schemes differ in how they fill them:

* axial RoPE (:func:`axial_frequencies`; rotary-embedding-torch's ``get_axial_freqs``,
  EVA-02): the pairs are cut into ``n_axes`` equal blocks and every block gets the full
  spectrum of a ``head_dim / n_axes`` wide RoPE;
* M-RoPE (:func:`mrope_frequencies`; Qwen2-VL's ``mrope_section``): the rates of one
  ``head_dim`` wide RoPE, with consecutive ``sections`` of pairs given to time, height and
  width (or, ``interleaved``, every third pair as in Qwen3-VL).

With all coordinates of a token equal (a text token at ``(p, p, p)``) M-RoPE is 1-D RoPE.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_dim, check_int, check_positive
from posenc.encodings.qk.rope import _pair_index, rope_frequencies

__all__ = ["axial_frequencies", "mrope_frequencies", "rope_nd", "FREQS_FOR"]

FREQS_FOR = ("lang", "pixel")


def axial_frequencies(head_dim, n_axes=2, *, base=10_000.0, freqs_for="lang", max_freq=10.0):
    r"""Rates and axes of axial RoPE: ``n_axes`` blocks of pairs, one full spectrum each.

    Each axis gets ``head_dim / n_axes`` consecutive dims (``head_dim // (2 n_axes)``
    pairs) with the rates of rotary-embedding-torch's ``RotaryEmbedding(head_dim //
    n_axes, freqs_for=...)``: ``"lang"`` :math:`\text{base}^{-2j/d_a}`, ``"pixel"``
    ``linspace(1, max_freq / 2, d_a / 2) * pi`` for coordinates in ``[-1, 1]``.

    Parameters
    ----------
    head_dim : int
        Rotated width; a multiple of ``2 * n_axes``.
    n_axes : int
        Number of coordinates per token (2 for images, 3 for video).
    base : float
        RoPE base of ``"lang"`` rates.
    freqs_for : {"lang", "pixel"}
        Which spectrum every axis gets.
    max_freq : float
        Highest ``"pixel"`` rate over pi, times 2.

    Returns
    -------
    inv_freq : numpy.ndarray
        Float64 ``(head_dim // 2,)``.
    axis : numpy.ndarray
        Int64 ``(head_dim // 2,)``: the coordinate each pair turns with.

    Examples
    --------
    >>> import posenc
    >>> inv, axis = posenc.axial_frequencies(8, 2, base=100.0)
    >>> inv.round(3), axis
    (array([1. , 0.1, 1. , 0.1]), array([0, 0, 1, 1]))
    """
    head_dim = check_dim("head_dim", head_dim)
    n_axes = check_int("n_axes", n_axes, minimum=1)
    if head_dim % (2 * n_axes):
        raise ValueError(
            f"head_dim must be a multiple of 2 * n_axes = {2 * n_axes}, got {head_dim}"
        )
    if freqs_for not in FREQS_FOR:
        raise ValueError(f"freqs_for must be one of {FREQS_FOR}, got {freqs_for!r}")
    per_axis = head_dim // n_axes
    if freqs_for == "lang":
        inv, _ = rope_frequencies(per_axis, base=base)  # (per_axis // 2,)
    else:
        max_freq = check_positive("max_freq", max_freq)
        inv = np.linspace(1.0, max_freq / 2, per_axis // 2) * np.pi  # (per_axis // 2,)
    axis = np.repeat(np.arange(n_axes), per_axis // 2)  # (head_dim // 2,)
    return np.tile(inv, n_axes), axis


def mrope_frequencies(head_dim, sections, *, base=10_000.0, interleaved=False):
    r"""Rates and axes of M-RoPE: one RoPE spectrum, its pairs shared out by ``sections``.

    The rates are :func:`~posenc.rope_frequencies`' :math:`\text{base}^{-2j/d}`. Axis
    ``a`` gets ``sections[a]`` pairs: consecutive blocks, fastest first (Qwen2-VL,
    Qwen2.5-VL: ``mrope_section = [16, 24, 24]`` for ``head_dim = 128``), or with
    ``interleaved`` pair ``j`` goes to axis ``j % n`` while that axis has pairs left and
    to axis 0 after (Qwen3-VL's ``apply_interleaved_mrope``).

    Parameters
    ----------
    head_dim : int
        Rotated width; ``2 * sum(sections)``.
    sections : sequence of int
        Pairs per axis, e.g. ``(time, height, width)``; positive.
    base : float
        The RoPE base (Qwen2-VL: 1e6).
    interleaved : bool
        Qwen3-VL's layout instead of consecutive blocks.

    Returns
    -------
    inv_freq : numpy.ndarray
        Float64 ``(head_dim // 2,)``.
    axis : numpy.ndarray
        Int64 ``(head_dim // 2,)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.mrope_frequencies(12, (2, 2, 2))[1]
    array([0, 0, 1, 1, 2, 2])
    >>> posenc.mrope_frequencies(12, (2, 2, 2), interleaved=True)[1]
    array([0, 1, 2, 0, 1, 2])
    """
    head_dim = check_dim("head_dim", head_dim)
    sections = tuple(check_int("sections", s, minimum=1) for s in sections)
    if not sections or 2 * sum(sections) != head_dim:
        raise ValueError(f"sections must sum to head_dim // 2 = {head_dim // 2}, got {sections}")
    inv, _ = rope_frequencies(head_dim, base=base)  # (head_dim // 2,)
    n = len(sections)
    if not interleaved:
        return inv, np.repeat(np.arange(n), sections)  # (head_dim // 2,)
    j = np.arange(head_dim // 2)
    axis = j % n  # every n-th pair to each axis ...
    axis[j >= n * np.asarray(sections)[axis]] = 0  # ... while it has pairs; the rest to axis 0
    if tuple(np.bincount(axis, minlength=n)) != sections:
        raise ValueError(
            f"sections {sections} cannot be interleaved (Qwen3-VL needs the later axes to "
            "have no more pairs than the first)"
        )
    return inv, axis


def rope_nd(x, positions, inv_freq, axis, *, pairing="half"):
    r"""Rotate pair :math:`j` of ``x`` by :math:`p_{a_j}\theta_j`: RoPE over n-D coordinates.

    Queries and keys rotated this way score :math:`q'_m \cdot k'_n` as a function of the
    coordinate differences :math:`p_m - p_n` only, axis by axis.

    Parameters
    ----------
    x : array_like
        ``(..., seq, head_dim)``; the first ``2 * len(inv_freq)`` dims are rotated.
    positions : array_like
        ``(..., seq, n_axes)`` coordinates (integers, or real ones such as
        rotary-embedding-torch's ``linspace(-1, 1)`` pixel coordinates), broadcastable
        against ``x`` without its last axis.
    inv_freq : array_like
        Rates ``(r // 2,)``, e.g. from :func:`axial_frequencies` or :func:`mrope_frequencies`.
    axis : array_like of int
        Coordinate of each pair ``(r // 2,)``, each in ``0 .. n_axes - 1``.
    pairing : {"half", "interleaved"}
        Which dims form a pair (as in :func:`~posenc.rope`).

    Returns
    -------
    numpy.ndarray
        Float64, same shape as ``x``.

    Examples
    --------
    >>> import numpy as np, posenc
    >>> inv, axis = posenc.axial_frequencies(4, 2)  # one pair per axis, rate 1
    >>> q = np.array([[1.0, 1.0, 0.0, 0.0]])  # (seq=1, head_dim=4): pairs (0, 2), (1, 3)
    >>> posenc.rope_nd(q, [[0, 1]], inv, axis).round(4)  # row 0, column 1
    array([[1.    , 0.5403, 0.    , 0.8415]])
    """
    x = np.asarray(x, dtype=np.float64)
    pos = np.asarray(positions, dtype=np.float64)
    inv = np.asarray(inv_freq, dtype=np.float64)
    axis = np.asarray(axis)
    if x.ndim < 2 or pos.ndim < 2:
        raise ValueError(
            f"x must be (..., seq, head_dim) and positions (..., seq, n_axes), got "
            f"{x.shape} and {pos.shape}"
        )
    if not np.isfinite(pos).all():
        raise ValueError("positions must be finite")
    if inv.ndim != 1 or axis.shape != inv.shape or 2 * inv.shape[0] > x.shape[-1]:
        raise ValueError(
            f"inv_freq and axis must be (r // 2,) with r <= head_dim={x.shape[-1]}, got "
            f"{inv.shape} and {axis.shape}"
        )
    if axis.dtype.kind not in "iu" or (axis < 0).any() or (axis >= pos.shape[-1]).any():
        raise ValueError(f"axis must hold ints in 0 .. {pos.shape[-1] - 1}, got {axis}")
    angles = pos[..., axis] * inv  # (..., seq, r // 2)
    a, b = _pair_index(2 * inv.shape[0], pairing)
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, angles.shape[:-1] + (1,))))
    xa, xb = out[..., a].copy(), out[..., b].copy()
    out[..., a] = xa * cos - xb * sin
    out[..., b] = xb * cos + xa * sin
    return out
