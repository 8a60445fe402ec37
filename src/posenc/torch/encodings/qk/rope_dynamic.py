"""RoPE's length-dependent scalings: ``[cos, sin]`` for the length read from a tensor.

The settings ``(head_dim, base, scaling, rotary_dim)`` travel as values, never as an index
into a process-wide list: a module pickled, saved with ``torch.save`` or sent to another
process carries them, and the table it builds there is the same. Fixed rates are a float64
tensor (``inv_freq``) and the table is a plain tensor expression of the positions.
Length-dependent scalings (dynamic NTK, LongRoPE) need the rates for the length read from a
tensor: a custom op, opaque to ``torch.compile``, rebuilds them from the settings encoded
as a string (:func:`settings_key`), parsed once per distinct string (a bounded cache).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json

import torch

import posenc
from posenc.torch.kernels import cos_sin
from posenc.torch.positions import position_tensor

#: Scalings that are not dataclasses cannot be written as a string: kept here, by value.
_OPAQUE: dict[str, tuple] = {}
_OPAQUE_MAX = 256


def settings_key(head_dim, base, scaling, rotary_dim) -> str:
    """The RoPE settings as a string the op can rebuild them from (validated first).

    A dataclass scaling is written as its class path and fields (JSON; floats round-trip
    exactly), so the string means the same thing in every process.
    """
    posenc.rope_frequencies(head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim)
    if scaling is None or dataclasses.is_dataclass(scaling):
        spec = None
        if scaling is not None:
            cls = type(scaling)
            fields = {f.name: getattr(scaling, f.name) for f in dataclasses.fields(scaling)}
            spec = [f"{cls.__module__}:{cls.__qualname__}", fields]
        return json.dumps([int(head_dim), float(base), spec, rotary_dim])
    key = f"opaque:{head_dim}:{base!r}:{scaling!r}:{rotary_dim}"
    _OPAQUE.pop(key, None)
    _OPAQUE[key] = (head_dim, base, scaling, rotary_dim)  # most recent last
    while len(_OPAQUE) > _OPAQUE_MAX:
        _OPAQUE.pop(next(iter(_OPAQUE)))
    return key


@functools.lru_cache(maxsize=128)
def _settings(key: str) -> tuple:
    """``(head_dim, base, scaling, rotary_dim)`` from :func:`settings_key`'s string."""
    if key.startswith("opaque:"):
        if key not in _OPAQUE:
            raise RuntimeError(f"RoPE settings {key!r} are no longer registered; call again")
        return _OPAQUE[key]
    head_dim, base, spec, rotary_dim = json.loads(key)
    scaling = None
    if spec is not None:
        path, fields = spec
        module, name = path.split(":")
        scaling = getattr(importlib.import_module(module), name)(**fields)
    return head_dim, base, scaling, rotary_dim


@torch.library.custom_op("posenc::rope_table", mutates_args=())
def _rope_table(
    positions: torch.Tensor, length_from: torch.Tensor, key: str, double: bool
) -> torch.Tensor:
    head_dim, base, scaling, rotary_dim = _settings(key)
    seq_len = int(length_from.max()) + 1 if length_from.numel() else 0
    inv, scale = posenc.rope_frequencies(
        head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim, seq_len=seq_len
    )
    inv = torch.from_numpy(inv).to(positions.device)
    return cos_sin(positions, inv, scale, torch.float64 if double else torch.float32)


@_rope_table.register_fake
def _(positions, length_from, key, double):
    head_dim, _, _, rotary_dim = _settings(key)
    r = head_dim if rotary_dim is None else rotary_dim
    dtype = torch.float64 if double else torch.float32
    return positions.new_empty(*positions.shape, r // 2, 2, dtype=dtype)


@_rope_table.register_vmap
def _(info, in_dims, positions, length_from, key, double):
    pos_dim, len_dim = in_dims[0], in_dims[1]
    if len_dim is None:  # one length for all: elementwise in the positions
        return _rope_table(positions, length_from, key, double), pos_dim
    n = info.batch_size  # a length per sample: one call each
    pos = positions.movedim(pos_dim, 0) if pos_dim is not None else positions.expand(n, -1, -1)
    lengths = length_from.movedim(len_dim, 0)
    return torch.stack([_rope_table(pos[i], lengths[i], key, double) for i in range(n)]), 0


def _table_now(positions, length_from, device, key, dtype):
    """``[cos, sin]`` ``(b|1, seq, r // 2, 2)`` for a length-dependent scaling, from float64
    angles.

    ``length_from``: positions whose maximum + 1 is the length fed to the scaling (all the
    keys of the step).
    """
    pos = position_tensor(positions, device)  # (b|1, seq)
    length = position_tensor(length_from, device)
    return _rope_table(pos, length, key, dtype == torch.float64)
