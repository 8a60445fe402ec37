"""RoPE's length-dependent scalings: ``[cos, sin]`` for the length of each call.

Dynamic NTK and LongRoPE change the rates with the length (the largest position + 1), so
the table is computed per call. The length is read from the positions' remembered bounds
in eager code; traced code reads it inside a custom op, opaque to ``torch.compile``, which
rebuilds the rates from the settings written as a string (:func:`settings_key`): the class
path and fields of a dataclass scaling, parsed once per distinct string (a bounded cache).
So the settings travel as values: a module pickled, saved or sent to another process
carries them and builds the same table there. A scaling that cannot be written that way
is refused when the module is built, with its name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json

import torch

import posenc
from posenc.torch.kernels import cos_sin
from posenc.torch.position_values import max_position, traced
from posenc.torch.positions import position_tensor


def _class_at(path):
    """The class a ``module:qualname`` path names, or ``None``."""
    module, _, qualname = path.partition(":")
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


def _spec(scaling):
    """``([class path, fields], None)`` for a scaling a string can carry, else ``(None, why)``."""
    cls = type(scaling)
    path = f"{cls.__module__}:{cls.__qualname__}"
    if not dataclasses.is_dataclass(scaling):
        return None, "it is not a dataclass"
    if _class_at(path) is not cls:
        return None, f"its class cannot be imported as {path} (define it at a module's top level)"
    spec = [path, {f.name: getattr(scaling, f.name) for f in dataclasses.fields(scaling)}]
    try:
        json.dumps(spec)
    except TypeError:
        return None, "its fields are not JSON values"
    return spec, None


def settings_key(head_dim, base, scaling, rotary_dim) -> str:
    """The RoPE settings as a string :func:`_rope_table` rebuilds them from (validated first).

    The scaling is written as its class path and fields (JSON; floats round-trip exactly),
    so the string means the same thing in every process. Raises ``ValueError`` naming a
    scaling that cannot be written so: not a dataclass, a class that cannot be imported by
    its path (defined inside a function), or fields that are not JSON values.
    """
    posenc.rope_frequencies(head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim)
    spec, why = (None, None) if scaling is None else _spec(scaling)
    if why:
        raise ValueError(
            f"scaling {type(scaling).__qualname__} cannot travel as a value (a module "
            f"rebuilds a length-dependent scaling from its class and fields): {why}"
        )
    return json.dumps([int(head_dim), float(base), spec, rotary_dim])


@functools.lru_cache(maxsize=128)
def _settings(key: str) -> tuple:
    """``(head_dim, base, scaling, rotary_dim)`` from :func:`settings_key`'s string."""
    head_dim, base, spec, rotary_dim = json.loads(key)
    scaling = None
    if spec is not None:
        path, fields = spec
        scaling = _class_at(path)(**fields)
    return head_dim, base, scaling, rotary_dim


@torch.library.custom_op("posenc::rope_table", mutates_args=())
def _rope_table(
    positions: torch.Tensor, length_from: torch.Tensor, key: str, double: bool, seq_len: int
) -> torch.Tensor:
    """``[cos, sin]`` at ``positions`` for ``seq_len`` (``-1``: ``max(length_from) + 1``)."""
    head_dim, base, scaling, rotary_dim = _settings(key)
    if seq_len < 0:
        seq_len = max_position(length_from) + 1
    inv, scale = posenc.rope_frequencies(
        head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim, seq_len=seq_len
    )
    inv = torch.from_numpy(inv).to(positions.device)
    return cos_sin(positions, inv, scale, torch.float64 if double else torch.float32)


@_rope_table.register_fake
def _(positions, length_from, key, double, seq_len):
    head_dim, _, _, rotary_dim = _settings(key)
    r = head_dim if rotary_dim is None else rotary_dim
    dtype = torch.float64 if double else torch.float32
    return positions.new_empty(*positions.shape, r // 2, 2, dtype=dtype)


@_rope_table.register_vmap
def _(info, in_dims, positions, length_from, key, double, seq_len):
    pos_dim, len_dim = in_dims[0], in_dims[1]
    if len_dim is None:  # one length for all: elementwise in the positions
        return _rope_table(positions, length_from, key, double, seq_len), pos_dim
    n = info.batch_size  # a length per sample: one call each
    pos = positions.movedim(pos_dim, 0) if pos_dim is not None else positions.expand(n, -1, -1)
    lengths = length_from.movedim(len_dim, 0)
    cs = [_rope_table(pos[i], lengths[i], key, double, -1) for i in range(n)]
    return torch.stack(cs), 0


def _table_now(positions, length_from, device, key, dtype):
    """``[cos, sin]`` ``(b|1, seq, r // 2, 2)`` for a length-dependent scaling, from float64
    angles.

    ``length_from``: positions whose maximum + 1 is the length fed to the scaling (all the
    keys of the step).
    """
    known = -1 if traced(length_from) else max_position(length_from) + 1  # remembered bounds
    pos = position_tensor(positions, device)  # (b|1, seq)
    length = position_tensor(length_from, device)
    return _rope_table(pos, length, key, dtype == torch.float64, known)
