"""The 2-D sin-cos table of MAE / ViT in torch, added to the input ``(batch, seq, dim)``.

Positions are ``(batch|1, seq, 2)`` ``(row, column)`` coordinates, or 1-D positions
``p`` meaning ``(p, p)``; see ``posenc.torch.encodings.qk.rope_nd`` for how grid coordinates
travel through the attention core.
"""

from __future__ import annotations

import numpy as np
import torch

import posenc
from posenc._checks import check_int, check_positive
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.encodings.checks import check_float
from posenc.torch.position_values import check_values
from posenc.torch.positions import position_arg

__all__ = ["SinusoidalEncoding2D"]


class SinusoidalEncoding2D(PositionalEncoding):
    """Adds MAE's 2-D sin-cos table (:func:`posenc.sinusoidal_2d`) to patch embeddings.

    Positions are ``(batch|1, seq, 2)`` ``(row, column)`` coordinates (1-D positions mean
    ``(p, p)``); the first half of the channels encodes the column, the second the row.
    The per-axis table (float64, from the NumPy reference) is derived state, rounded once
    to the input's dtype when added.

    Parameters
    ----------
    dim : int
        Embedding width; a multiple of 4.
    base : float
        The constant that sets the slowest rate.
    max_len : int
        Table size: rows and columns must be ``< max_len``.

    Examples
    --------
    >>> import torch, posenc
    >>> from posenc.torch import SinusoidalEncoding2D
    >>> pe = SinusoidalEncoding2D(8, max_len=16)
    >>> pos = torch.from_numpy(posenc.grid_positions(2, 3))[None]  # (1, 6, 2)
    >>> x = pe(torch.zeros(1, 6, 8, dtype=torch.float64), pos)
    >>> bool((x[0].numpy() == posenc.sinusoidal_2d(2, 3, 8)).all())
    True
    """

    _DERIVED = ("table",)
    position_axes = 2

    def __init__(self, dim, *, base=10_000.0, max_len=1024):
        super().__init__()
        self.dim = check_int("dim", dim, minimum=4)
        if self.dim % 4:
            raise ValueError(f"dim must be a positive multiple of 4, got {dim}")
        self.base = check_positive("base", base)
        self.max_len = check_int("max_len", max_len, minimum=1)
        self._register_derived()

    def _derived_tensors(self):
        # the column half of a 1 x max_len grid: [sin p w, cos p w] for p < max_len
        table = posenc.sinusoidal_2d(1, self.max_len, self.dim, base=self.base)
        return {"table": torch.from_numpy(np.ascontiguousarray(table[:, : self.dim // 2]))}

    def encode_input(self, x, positions):
        """Add the 2-D table at ``positions`` to ``x`` ``(batch, seq, dim)``.

        Parameters
        ----------
        x : torch.Tensor
            Embeddings ``(batch, seq, dim)``.
        positions : torch.Tensor or range
            ``(batch|1, seq, 2)`` ``(row, column)``, or 1-D positions.

        Returns
        -------
        torch.Tensor
            Same shape and dtype as ``x``.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape (batch, seq, dim={self.dim}), got {tuple(x.shape)}"
            )
        check_float("x", x)
        positions = position_arg(positions, x.shape[0], x.shape[1], axes=2)
        hint = "; build the encoding with a larger max_len"
        positions = check_values("positions", positions, self.max_len, why=hint)
        self._materialize(x.device)  # still on meta after load_state_dict(assign=True)?
        table = self.table  # (max_len, dim // 2)
        if isinstance(positions, range):
            half = table[positions.start : positions.stop][None]  # (1, seq, dim // 2)
            pe = torch.cat([half, half], -1)  # (1, seq, dim)
        else:
            positions = positions.to(table.device)
            if positions.dim() == 2:
                positions = positions[..., None].expand(-1, -1, 2)  # (b|1, seq, 2)
            pe = torch.cat([table[positions[..., 1]], table[positions[..., 0]]], -1)
        return x + pe.to(x.dtype)  # (batch, seq, dim), rounded once

    def forward(self, x, positions=None):
        """Add the table to ``x`` ``(batch, seq, dim)`` (see :meth:`encode_input`).

        Parameters
        ----------
        x : torch.Tensor
            Embeddings ``(batch, seq, dim)``.
        positions : torch.Tensor or range, optional
            ``(batch|1, seq, 2)`` coordinates or 1-D positions; default ``0 .. seq - 1``.

        Returns
        -------
        torch.Tensor
            Same shape and dtype as ``x``.
        """
        return self.encode_input(x, positions)

    def extra_repr(self):
        return f"dim={self.dim}, base={self.base}, max_len={self.max_len}"
