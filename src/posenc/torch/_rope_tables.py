"""RoPE tables computed now: from the NumPy frequencies, through a custom op.

Used for length-dependent scalings, float64 inputs and :func:`~posenc.torch.apply_rope`.
The op is opaque to ``torch.compile`` (no graph break, no tracing into NumPy) and reads the
length from a tensor inside, so explicit positions compile too. Each
``(head_dim, base, scaling, rotary_dim)`` gets an int key.
"""

from __future__ import annotations

import torch

import posenc
from posenc.torch._rope_kernels import cos_sin
from posenc.torch.positions import position_tensor

_PARAMS: list = []


def _key(head_dim, base, scaling, rotary_dim) -> int:
    params = (head_dim, base, scaling, rotary_dim)
    if params not in _PARAMS:  # new: validate once (raises ValueError naming the argument)
        posenc.rope_frequencies(head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim)
        _PARAMS.append(params)
    return _PARAMS.index(params)


@torch.library.custom_op("posenc::rope_table", mutates_args=())
def _rope_table(
    positions: torch.Tensor, length_from: torch.Tensor, key: int, double: bool
) -> torch.Tensor:
    head_dim, base, scaling, rotary_dim = _PARAMS[key]
    seq_len = int(length_from.max()) + 1 if length_from.numel() else 0
    inv, scale = posenc.rope_frequencies(
        head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim, seq_len=seq_len
    )
    inv = torch.from_numpy(inv).to(positions.device)
    return cos_sin(positions, inv, scale, torch.float64 if double else torch.float32)


@_rope_table.register_fake
def _(positions, length_from, key, double):
    head_dim, _, _, rotary_dim = _PARAMS[key]
    r = head_dim if rotary_dim is None else rotary_dim
    dtype = torch.float64 if double else torch.float32
    return positions.new_empty(*positions.shape, r // 2, 2, dtype=dtype)


def _table_now(positions, length_from, device, key, dtype):
    """``[cos, sin]`` ``(b|1, seq, r // 2, 2)`` computed now from float64 angles.

    ``length_from``: positions whose maximum + 1 is the length fed to a length-dependent
    scaling (all the keys of the step).
    """
    pos = position_tensor(positions, device)  # (b|1, seq)
    length = position_tensor(length_from, device)
    return _rope_table(pos, length, key, dtype == torch.float64)


def _table_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32
