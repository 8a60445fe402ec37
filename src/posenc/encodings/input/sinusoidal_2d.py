r"""The 2-D sin-cos table of MAE / ViT, added to patch embeddings (the input family).

NumPy reference, float64 and cache-free. Shape legend: a grid of ``height x width``
patches is flattened row by row (row-major, as ViTs do) into ``seq = height * width``
tokens.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_int
from posenc.encodings.input.absolute import frequencies
from posenc.positions import grid_positions

__all__ = ["sinusoidal_2d"]


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
