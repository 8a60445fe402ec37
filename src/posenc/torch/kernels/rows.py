"""The rows of a ``[cos, sin]`` table at some positions, before any kernel gathers them."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["TableRows"]


class TableRows(NamedTuple):
    """The rows of a whole ``[cos, sin]`` table at ``positions``, not yet gathered.

    ``table``: ``(rows, r // 2, 2)`` float32, a module's derived table; ``positions``: a
    ``range`` or int64 ``(batch|1, seq)``. The Triton kernel indexes the table itself;
    every other kernel gets the rows gathered (:meth:`gather`).
    """

    table: torch.Tensor
    positions: object

    def gather(self, device=None) -> torch.Tensor:
        """The rows ``(batch|1, seq, r // 2, 2)`` (a slice for a ``range``), on ``device``."""
        t, p = self.table, self.positions
        rows = t[p.start : p.stop][None] if isinstance(p, range) else t[p.to(t.device)]
        return rows.to(t.device if device is None else device)
