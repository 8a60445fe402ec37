"""Checking the values of positions: integers, non-negative, inside a table. The one place
posenc reads a tensor's values on the host.

A read is a device synchronisation on a GPU, so it is done at most once per tensor: the
bounds found are remembered on the tensor with its version counter (any in-place change
forgets them), and code that builds positions from values it knows (a cache's next slot)
records their bounds without reading. Traced code (``torch.compile``, ``torch.func``)
cannot read values: it checks through :func:`checked_positions`, an op that raises
posenc's ``ValueError`` on the CPU and asserts on the device elsewhere (no sync, so a
compiled decode step can be captured as a CUDA graph). Meta tensors hold no values: they
take the traced path, where the op only passes their shape on.
"""

from __future__ import annotations

import torch

__all__ = ["bounds", "carry_bounds", "check_values", "checked_positions", "host_read"]
__all__ += ["known_bounds", "max_position", "remember_bounds", "traced"]

#: Device types whose traced checks assert on the device instead of reading the values back.
DEVICE_ASSERT = {"cuda"}


def host_read(t: torch.Tensor) -> list:
    """``t``'s values as Python numbers: the one host read of posenc (a sync on a GPU)."""
    return t.tolist()


def traced(positions) -> bool:
    """Are ``positions`` values out of Python's reach (``torch.compile``, ``torch.func``,
    the meta device)?"""
    return torch.compiler.is_compiling() or (
        isinstance(positions, torch.Tensor)
        and (positions.is_meta or torch._C._functorch.is_functorch_wrapped_tensor(positions))
    )


def _version(t):
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter: nothing to remember
        return None


def remember_bounds(t: torch.Tensor, lo, hi) -> torch.Tensor:
    """Record that every value of ``t`` is in ``[lo, hi]`` (until ``t`` changes); returns ``t``.

    Nothing is recorded for unknown bounds (``None``) or while tracing (compiled code reads
    nothing, so it needs no bounds).
    """
    if lo is None or hi is None or torch.compiler.is_compiling():
        return t
    version = _version(t)
    if version is not None:
        t._posenc_bounds = (version, int(lo), int(hi))
    return t


def known_bounds(t):
    """``(lo, hi)`` recorded for ``t``'s current values (a ``range``'s own), or ``None``."""
    if isinstance(t, range):
        return (t.start, t.stop - 1) if len(t) else None
    if torch.compiler.is_compiling():
        return None
    got = getattr(t, "_posenc_bounds", None)
    if got is not None and got[0] == _version(t):
        return got[1:]
    return None


def carry_bounds(src, dst: torch.Tensor) -> torch.Tensor:
    """``dst`` holds values of ``src`` (moved, widened, sliced): it keeps ``src``'s bounds."""
    known = known_bounds(src)
    return dst if known is None else remember_bounds(dst, *known)


def bounds(t: torch.Tensor):
    """``(lo, hi)`` of an integer tensor (``None`` if empty): read once per version."""
    if not t.numel():
        return None
    known = known_bounds(t)
    if known is None:
        lo, hi = host_read(torch.stack(torch.aminmax(t)))
        remember_bounds(t, lo, hi)
        known = (lo, hi)
    return known


def max_position(positions) -> int:
    """Largest position (``-1`` if empty): static for a ``range``, else from :func:`bounds`."""
    if isinstance(positions, range):
        return positions.stop - 1
    found = bounds(positions)
    return -1 if found is None else found[1]


def _refuse(name, lo, hi, stop, low=0, limit="max_len", why=""):
    """``ValueError`` for values outside ``[low, stop)``: names ``name``, the bound (``stop``
    as ``limit=stop`` when ``limit`` is given), the value, then ``why`` (a hint, a reason)."""
    if lo is not None and lo < low:
        bound = "non-negative" if low == 0 else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {lo}{why}")
    if stop and hi is not None and hi >= stop:
        bound = f"< {limit}={stop}" if limit else f"< {stop}"
        raise ValueError(f"{name} must be {bound}, got {hi}{why}")


def check_values(name: str, positions, stop=None, *, low=0, limit="max_len", why=""):
    """``positions`` (a ``range`` or an integer tensor) after checking ``low <= p < stop``.

    Eager tensors are checked with their :func:`bounds` (one read, remembered); traced ones
    through :func:`checked_positions`, whose result replaces them. ``ValueError`` as
    :func:`_refuse` words it.
    """
    if isinstance(positions, range):
        if len(positions):
            _refuse(name, positions.start, positions.stop - 1, stop, low, limit, why)
        return positions
    dtype = positions.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got dtype {dtype}")
    if traced(positions):
        return checked_positions(positions, low, stop or 0, name, limit, why)
    found = bounds(positions)
    if found is not None:
        _refuse(name, *found, stop, low, limit, why)
    return positions


@torch.library.custom_op("posenc::checked_positions", mutates_args=())
def checked_positions(
    positions: torch.Tensor, low: int, stop: int, name: str, limit: str, why: str
) -> torch.Tensor:
    """A copy of ``positions`` after checking ``low <= p`` (and ``p < stop`` if ``stop > 0``).

    An op, so compiled code and ``vmap`` check what eager code checks instead of letting a
    negative index wrap around a table; its result is used downstream, so the check cannot
    be dropped as dead code. On the CPU it raises posenc's ``ValueError``; on a device in
    :data:`DEVICE_ASSERT` it asserts there (the same words, without the value), so the
    host never waits for the device.
    """
    if positions.numel():
        if positions.device.type in DEVICE_ASSERT:
            ok = positions.min() >= low
            if stop > 0:
                ok = ok & (positions.max() < stop)
            upper = f" and < {limit or 'the limit'}={stop}" if stop > 0 else ""
            torch._assert_async(ok, f"{name} must be >= {low}{upper}{why}")
        else:
            lo, hi = host_read(torch.stack(torch.aminmax(positions)))
            _refuse(name, lo, hi, stop, low, limit, why)
    return positions.clone()


@checked_positions.register_fake
def _(positions, low, stop, name, limit, why):
    return torch.empty_like(positions)


@checked_positions.register_vmap
def _(info, in_dims, positions, low, stop, name, limit, why):
    return checked_positions(positions, low, stop, name, limit, why), in_dims[0]


def joined(stored, new):
    """The largest position once ``new`` joins ``stored`` (bounds or ``None``: unknown)."""
    return None if stored is None or new is None else max(stored[1], new[1])
