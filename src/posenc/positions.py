r"""Positions beyond a line: grid coordinates and M-RoPE position ids.

NumPy reference, int64 and cache-free; the torch twin of what positions are is
:mod:`posenc.torch.positions`. Shape legend: a grid of ``height x width`` patches is
flattened row by row (row-major, as ViTs do) into ``seq = height * width`` tokens;
coordinates are ``(seq, n_axes)``.
"""

from __future__ import annotations

import numbers

import numpy as np

from posenc._checks import check_int

__all__ = ["grid_positions", "mrope_positions"]


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
