"""Derived state: tables computed from a module's constructor arguments, never checkpointed.

An encoding declares its derived tables (cos/sin tables, ALiBi's slopes, T5's bucket map)
by overriding ``_derived_tensors``: they are registered as non-persistent buffers (never
saved to or loaded from a checkpoint) that keep the right numbers through every ``.to()``,
``.half()``, device move or ``to_empty()`` (moved in their own dtype, recomputed only when
they were on the meta device), so a module built on the meta device is exact once
materialised, by ``to_empty()`` or by ``load_state_dict(assign=True)``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DerivedState"]


class DerivedState(nn.Module):
    """A module whose derived tables are recomputed, never loaded, and survive every move.

    Subclasses list the buffer names in ``_DERIVED`` and build them in ``_derived_tensors``
    (on the CPU, in the dtype they are kept in); :attr:`work_dtype` is the precision the
    module computes in (float32, or float64 after ``.double()``).
    """

    def __init__(self) -> None:
        super().__init__()
        # the work dtype follows torch's default dtype at construction, not at each call
        self.__dict__["_work"] = (
            torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        )

    #: Names of the non-persistent buffers built by ``_derived_tensors``.
    _DERIVED: tuple[str, ...] = ()

    def _derived_tensors(self) -> dict[str, torch.Tensor]:
        """Tables computed from the constructor arguments, on the CPU (default: none)."""
        return {}

    def _register_derived(self, device=None) -> None:
        """(Re)compute the derived tables and register them as non-persistent buffers.

        ``device`` defaults to torch's default device, so a module built inside
        ``with torch.device("meta")`` holds meta tables until it is materialised.
        """
        device = torch.get_default_device() if device is None else device
        for name, table in self._derived_tensors().items():
            self.register_buffer(name, table.to(device), persistent=False)

    def _materialize(self, device=None) -> None:
        """Build the derived tables if they are still on the meta device.

        A module built on meta whose parameters were then loaded with
        ``load_state_dict(assign=True)`` (HF's and accelerate's empty-weight loading) has
        real parameters but meta tables: they are built on ``device`` (default: where the
        parameters are, else the CPU) instead of being read as uninitialised memory.
        """
        present = [self._buffers[n] for n in self._DERIVED if self._buffers.get(n) is not None]
        if not any(t.is_meta for t in present):
            return
        if device is not None and torch.device(device).type == "meta":
            return  # computing on meta (shapes only): meta tables are what it needs
        if device is None:
            real = [p.device for p in self.parameters() if not p.is_meta]
            device = real[0] if real else torch.device("cpu")
        with torch.inference_mode(False), torch.no_grad():  # usable by training later
            self._register_derived(device)

    @property
    def work_dtype(self) -> torch.dtype:
        """Dtype the encoding computes its tables and biases in: float64 after ``.double()``
        (or with float64 as torch's default dtype at construction), else float32 -- never
        lower, whatever the module is cast to."""
        work = self.__dict__.get("_work")
        if work is None:
            default = torch.get_default_dtype()
            work = torch.float64 if default == torch.float64 else torch.float32
        return work

    def _apply(self, fn, recurse=True):
        # .to(), .half(), .cuda(), to_empty() ... all land here: let torch move everything,
        # then put the derived tables back exactly, in their own dtype, on the new device.
        before = {n: self._buffers.get(n) for n in self._DERIVED}
        super()._apply(fn, recurse)
        # what the move does to floats: a device-only move keeps both probes' dtypes and
        # leaves the work dtype alone; a cast sets it (float64, or float32 for any other)
        p32 = fn(torch.zeros((), dtype=torch.float32))
        p64 = fn(torch.zeros((), dtype=torch.float64))
        if not (p32.dtype == torch.float32 and p64.dtype == torch.float64):
            self.__dict__["_work"] = torch.float64 if p32.dtype == torch.float64 else torch.float32
        names = [n for n in self._DERIVED if before.get(n) is not None]
        if not names:
            return self
        device = self._buffers[names[0]].device
        if device.type == "meta" or any(before[n].is_meta for n in names):
            self._register_derived(device)  # nothing exact to keep: compute them
            return self
        for n in names:  # the exact tables, in their own dtype: moved, never recomputed
            self._buffers[n] = before[n].to(device)  # the same tensor when nothing moves
        return self
