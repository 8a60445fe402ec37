"""RoPE's derived ``[cos, sin]`` table: built lazily, grown to the largest position used, looked up.

Angles are float64 products of integer positions and rates; the table is float32. It
starts with the first 4096 positions and grows (at least doubling, never past ``max_len``)
when a position past it is first used, so a million-position model costs what it uses.
Contiguous positions slice it, others gather from it; float64 inputs, compiled or vmapped
calls get ``[cos, sin]`` computed for their positions, and length-dependent scalings
theirs for each call's length (:mod:`.rope_dynamic`).
"""

from __future__ import annotations

import copy
import pickle
import threading

import torch

import posenc
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.encodings.qk.rope_dynamic import _table_now
from posenc.torch.kernels import TableRows, cos_sin
from posenc.torch.position_values import check_values, max_position, traced
from posenc.torch.positions import position_tensor

_FIRST_ROWS = 4096  # rows of the cos/sin table built at construction; it grows on demand
_GROW = threading.Lock()  # growth is rare: one lock for every table

__all__ = ["RopeTables", "rows_to_build"]


class RopeTables(PositionalEncoding):
    """The table half of :class:`~posenc.torch.RotaryEmbedding` (and its subclasses).

    Reads the settings the encoding set: ``head_dim``, ``base``, ``scaling``,
    ``rotary_dim``, ``scale``, ``max_len``, ``dynamic`` and the settings key ``_key``.
    """

    _DERIVED = ("inv_freq", "cos_sin")

    def __getstate__(self):
        """Pickling (``pickle``, ``torch.save``) refuses a scaling pickle cannot carry by name."""
        if self.scaling is not None:
            try:
                pickle.dumps(self.scaling)
            except Exception as err:
                raise pickle.PicklingError(
                    f"{type(self).__name__}'s scaling {type(self.scaling).__qualname__} cannot "
                    f"be pickled ({err}); give it picklable fields"
                ) from err
        return super().__getstate__()

    def __deepcopy__(self, memo):
        # copy.deepcopy keeps what pickle cannot carry (a function is copied by reference)
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(super().__getstate__(), memo))
        return new

    def _derived_tensors(self):
        if self.dynamic:
            return {}
        inv, _ = posenc.rope_frequencies(
            self.head_dim, base=self.base, scaling=self.scaling, rotary_dim=self.rotary_dim
        )
        inv = torch.from_numpy(inv)  # float64 (r // 2,)
        pos = torch.arange(min(self.max_len, _FIRST_ROWS), device="cpu")
        return {"inv_freq": inv, "cos_sin": cos_sin(pos, inv, self.scale, torch.float32)}

    def _grow(self, last):
        """Extend the table (eager only) to reach position ``last``: rows are built when
        first used, not for the whole ``max_len`` (1M positions would be 0.5 GB).

        Safe under threads sharing the module: the longer table is built apart from the
        one readers hold and published in one assignment, under a lock, so a table is
        never longer than :func:`rows_to_build` asks or missing rows it reports.
        """
        if last < self.cos_sin.shape[0]:
            return
        with _GROW:  # one grower at a time; readers keep the table they already read
            old = self.cos_sin
            rows = rows_to_build(old.shape[0], last, self.max_len)
            if rows <= old.shape[0]:
                return  # another thread grew it meanwhile
            # a normal tensor even when grown under inference_mode: trains later
            with torch.inference_mode(False), torch.no_grad():
                pos = torch.arange(old.shape[0], rows, device=self.inv_freq.device)
                new = cos_sin(pos, self.inv_freq, self.scale, torch.float32)  # (rows - have, ·)
                self.cos_sin = torch.cat([old, new])  # (rows, r // 2, 2)

    def table(self, positions, dtype=torch.float32, *, length_from=None, device=None):
        """``[cos, sin]`` (times the attention scale) at ``positions``: ``(b|1, seq, r // 2, 2)``.

        Parameters
        ----------
        positions : torch.Tensor or range
            Int64 ``(b|1, seq)`` or a ``range``; ``0 <= p < max_len`` (``ValueError``).
        dtype : torch.dtype
            Dtype of the tensors to rotate; the table is float64 for float64, else float32.
        length_from : torch.Tensor or range, optional
            Positions whose maximum + 1 is the length fed to a length-dependent scaling
            (default ``positions``).
        device : torch.device, optional
            Where a table computed now goes (default: where the cached table lives).

        Returns
        -------
        torch.Tensor
            ``cs`` with ``cs[..., 0] = s cos(p theta_j)`` and ``cs[..., 1] = s sin(p theta_j)``.
        """
        positions = check_values("positions", positions, self.max_len)
        return self._lookup(positions, dtype, length_from, device)

    def _rows(self, positions, dtype, length_from=None, device=None):
        """``[cos, sin]`` for the rotation kernels, positions already checked: the derived
        table and the positions (:class:`~posenc.torch.kernels.TableRows`: eager, below
        float64, where the Triton kernel indexes the table itself), else the rows computed
        now, ``(b|1, 1, seq, r // 2, 2)``."""
        device = self._device() if device is None else device
        if self.dynamic:
            length_from = positions if length_from is None else length_from
            cs = _table_now(positions, length_from, device, self._key, _table_dtype(dtype))
            return cs[:, None]
        self._materialize(device)
        if dtype == torch.float64 or traced(positions):
            # computed for the positions asked for: float64 angles, rounded once
            inv = self.inv_freq.to(device)
            pos = position_tensor(positions, device)
            return cos_sin(pos, inv, self.scale, _table_dtype(dtype))[:, None]
        self._grow(max_position(positions))  # eager: the bounds the check remembered
        return TableRows(self.cos_sin, positions)  # read once: growth publishes a new tensor

    def _lookup(self, positions, dtype, length_from=None, device=None):
        """:meth:`table` for positions already checked (the hooks check them once)."""
        rows = self._rows(positions, dtype, length_from, device)
        device = self._device() if device is None else device
        return rows.gather(device) if isinstance(rows, TableRows) else rows[:, 0]

    def _device(self):
        return self.inv_freq.device if "inv_freq" in self._buffers else torch.device("cpu")


def _table_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def rows_to_build(have: int, last: int, max_len: int) -> int:
    """Rows a lazily grown table should hold to reach position ``last``: at least double
    what it has (so growth costs O(total) overall), never more than ``max_len``."""
    if last < have:
        return have
    return min(max_len, max(2 * have, last + 1))
