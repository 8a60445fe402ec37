r"""Positions beyond a line: grid coordinates, the 2-D sin-cos table, and M-RoPE position ids.

NumPy reference, float64 (positions int64) and cache-free. Shape legend: a grid of
``height x width`` patches is flattened row by row (row-major, as ViTs do) into
``seq = height * width`` tokens; coordinates are ``(seq, n_axes)``.
"""

from __future__ import annotations

import numbers

import numpy as np

from posenc._checks import check_int
from posenc.absolute import frequencies

__all__ = ["grid_positions", "sinusoidal_2d", "mrope_positions"]


def grid_positions(*shape):
    """Integer coordinates of every cell of a grid, row-major: ``(prod(shape), len(shape))``.

    Parameters
    ----------
    *shape : int
        Grid size per axis, e.g. ``height, width`` or ``time, height, width``.

    Returns
    -------
    numpy.ndarray
        Int64 ``(prod(shape), len(shape))``; row ``i`` holds the coordinates of token ``i``.

    Examples
    --------
    >>> import posenc
    >>> posenc.grid_positions(2, 3).T
    array([[0, 0, 0, 1, 1, 1],
           [0, 1, 2, 0, 1, 2]])
    """
    if not shape:
        raise ValueError("shape must name at least one axis, got ()")
    shape = tuple(check_int("shape", s, minimum=1) for s in shape)
    grids = np.meshgrid(*(np.arange(s) for s in shape), indexing="ij")  # each shape
    return np.stack([g.reshape(-1) for g in grids], -1).astype(np.int64)  # (prod, n_axes)


def sinusoidal_2d(height, width, dim, *, base=10_000.0):
    r"""The 2-D sin-cos table of MAE / ViT: half the channels per axis, ``(height*width, dim)``.

    MAE's ``get_2d_sincos_pos_embed`` layout: for the patch in row :math:`h`, column
    :math:`w` (token :math:`h \cdot \text{width} + w`), with :math:`\omega_i =
    \text{base}^{-i/(\text{dim}/4)}`, :math:`i < \text{dim}/4`,

    .. math::

        PE = [\,\sin w\omega,\ \cos w\omega,\ \sin h\omega,\ \cos h\omega\,],

    four blocks of ``dim / 4``: the *column* takes the first half (MAE stacks
    ``meshgrid(grid_w, grid_h)`` and calls its first member ``emb_h``), sines before
    cosines within each half (not interleaved as in :func:`~posenc.sinusoidal`).

    Parameters
    ----------
    height, width : int
        Grid size in patches.
    dim : int
        Embedding width; a positive multiple of 4.
    base : float
        The constant that sets the slowest rate.

    Returns
    -------
    numpy.ndarray
        Float64 ``(height * width, dim)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.sinusoidal_2d(1, 2, 4).round(4)  # [sin w, cos w, sin h, cos h]
    array([[0.    , 1.    , 0.    , 1.    ],
           [0.8415, 0.5403, 0.    , 1.    ]])
    """
    dim = check_int("dim", dim, minimum=4)
    if dim % 4:
        raise ValueError(f"dim must be a positive multiple of 4, got {dim}")
    coords = grid_positions(height, width).astype(np.float64)  # (seq, 2): (row, column)
    omega = frequencies(dim // 2, base=base)  # (dim // 4,)
    blocks = []
    for c in (coords[:, 1], coords[:, 0]):  # column first, as MAE
        angles = c[:, None] * omega  # (seq, dim // 4)
        blocks += [np.sin(angles), np.cos(angles)]
    return np.concatenate(blocks, -1)  # (seq, dim)


def mrope_positions(segments, *, spatial_merge=1, start=0):
    r"""Qwen2-VL's M-RoPE position ids for a sequence of text and image/video segments.

    Text tokens sit on the diagonal, ``(p, p, p)``, one step apart. A vision segment of
    ``(t, h, w)`` patches becomes ``t * (h / m) * (w / m)`` tokens (merge ``m``) at
    ``(s + i, s + y, s + x)`` for frame ``i``, row ``y``, column ``x``, where ``s`` is the
    position the next text token would have had. After it, positions continue at ``s +
    max(h, w) / m``: text after an image resumes just past the image's largest row or
    column, not at ``s`` plus its token count. This is HF transformers 5.x's
    ``Qwen2VLModel.get_rope_index``; its 4.x versions resumed at the largest coordinate
    + 1, which differs only for a video with more frames than rows and columns.

    Parameters
    ----------
    segments : sequence
        In order: an int ``n`` for ``n`` text tokens, or a ``(t, h, w)`` tuple for a
        vision input's patch grid before merging (HF's ``image_grid_thw`` row).
    spatial_merge : int
        Patches merged per side into one token (Qwen2-VL: 2); divides ``h`` and ``w``.
    start : int
        Position of the first token.

    Returns
    -------
    numpy.ndarray
        Int64 ``(seq, 3)``: ``(time, height, width)`` per token.

    Examples
    --------
    >>> import posenc
    >>> posenc.mrope_positions([2, (1, 2, 3), 2]).T  # text, a 2x3 image, text
    array([[0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
           [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
           [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]])
    """
    m = check_int("spatial_merge", spatial_merge, minimum=1)
    pos = check_int("start", start, minimum=0)
    parts = [np.zeros((0, 3), dtype=np.int64)]
    for seg in segments:
        if isinstance(seg, numbers.Integral) and not isinstance(seg, bool):
            n = check_int("segments", seg, minimum=0)
            parts.append(np.repeat(pos + np.arange(n)[:, None], 3, 1))  # (n, 3)
            pos += n
            continue
        try:
            t, h, w = (check_int("segments", s, minimum=1) for s in seg)
        except (TypeError, ValueError):
            raise ValueError(
                f"segments must hold ints (text) or (t, h, w) grids, got {seg!r}"
            ) from None
        if h % m or w % m:
            raise ValueError(f"spatial_merge={m} must divide the grid's h and w, got {seg!r}")
        parts.append(pos + grid_positions(t, h // m, w // m))  # (t h w / m^2, 3)
        pos += max(h, w) // m
    return np.concatenate(parts)
