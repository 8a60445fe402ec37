"""RoPE kernels: rotate ``(..., seq, head_dim)`` tensors given cos/sin tables.

Angles are always float64 products of positions and rates (``_cos_sin``); only the
resulting cos/sin are rounded. Three rotation kernels, chosen by pairing and dtype, write
into a caller-owned ``out`` without temporaries of the size of the input; a plain
differentiable expression is used while autograd records.
"""

from __future__ import annotations

import torch


def _cos_sin(positions, inv_freq, scale, dtype):
    """cos, sin of ``positions * inv_freq``: float64 angles, rounded to ``dtype``."""
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (b|1, seq, r // 2)
    return (scale * angles.cos()).to(dtype), (scale * angles.sin()).to(dtype)


def _rotate(x, cos, sin, pairing, out=None, cis=None):
    """Write the rotation of ``x`` (..., seq, head_dim) into ``out`` and return it.

    ``cos``/``sin`` broadcast to ``(..., seq, r // 2)``; ``cis`` optionally holds
    ``complex(cos, sin)`` already. Three kernels, none with temporaries the size of ``x``,
    so a caller-owned ``out`` makes the rotation allocation-free:

    * interleaved float32/float64: adjacent pairs are complex numbers, one complex multiply;
    * interleaved bfloat16/float16: the same, block by block through a small float32
      buffer that stays in cache (upcast, multiply, round once);
    * half: four multiply(-add) kernels on the two halves.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        if out is not None:
            raise ValueError("out= does not support autograd: x requires grad (use no_grad)")
        return _rotate_autograd(x, cos, sin, pairing)
    out = torch.empty_like(x) if out is None else _check_out(x, out)
    h = cos.shape[-1]
    r = 2 * h
    if pairing == "interleaved" and _complex_view_ok(x) and _complex_view_ok(out):
        _complex_mul(x, out, torch.complex(cos, sin) if cis is None else cis, h)
    elif pairing == "interleaved" and x.dtype in _LOW and x.dim() == 4 and cos.shape[0] == 1:
        cis = torch.complex(cos.float(), sin.float()) if cis is None else cis
        _rotate_blocked(x[..., :r], out[..., :r], cis[0, 0], h)
    else:
        _rotate_halves(x, cos, sin, pairing, out, h, r)
    if r < x.shape[-1]:
        out[..., r:].copy_(x[..., r:])  # partial rotary: the tail passes through
    return out


_LOW = (torch.bfloat16, torch.float16)


def _check_out(x, out):
    """Return ``out`` if it can receive the rotation of ``x``, else raise ``ValueError``."""
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(
            f"out must match x: {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    if out.data_ptr() == x.data_ptr():
        raise ValueError("out must not share memory with the input")
    return out


def _complex_mul(x, out, cis, h):
    """``out[..., :2h] = x[..., :2h] * cis`` with adjacent pairs read as complex numbers."""
    xc = torch.view_as_complex(x[..., : 2 * h].unflatten(-1, (h, 2)))  # (..., seq, h)
    torch.mul(xc, cis, out=torch.view_as_complex(out[..., : 2 * h].unflatten(-1, (h, 2))))


def _complex_view_ok(t):
    """Can ``t``'s adjacent pairs be viewed as complex numbers (float32/64, even strides)?"""
    return (
        t.dtype in (torch.float32, torch.float64)
        and t.stride(-1) == 1
        and t.storage_offset() % 2 == 0
        and all(st % 2 == 0 for st in t.stride()[:-1])
    )


def _rotate_blocked(x, out, cis, h, block=1 << 18):
    """Interleaved low-precision path: groups of heads through a float32 complex buffer."""
    b, heads, seq, _ = x.shape
    g = max(1, min(heads, block // (seq * 2 * h)))  # heads per block, ~1 MB of float32
    buf = torch.empty(g, seq, h, 2, device=x.device)  # (g, seq, r // 2, 2)
    for i in range(b):
        for j in range(0, heads, g):
            n = min(g, heads - j)
            tmp = buf[:n]
            tmp.copy_(x[i, j : j + n].unflatten(-1, (h, 2)))  # upcast
            torch.view_as_complex(tmp).mul_(cis)  # (n, seq, r // 2)
            out[i, j : j + n].unflatten(-1, (h, 2)).copy_(tmp)  # round once


def _rotate_autograd(x, cos, sin, pairing):
    """Differentiable version for training: plain tensor expressions, new output."""
    h = cos.shape[-1]
    r = 2 * h
    x1, x2 = (x[..., :h], x[..., h:r]) if pairing == "half" else (x[..., 0:r:2], x[..., 1:r:2])
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin  # (..., seq, r // 2) each
    rot = torch.cat([o1, o2], -1) if pairing == "half" else torch.stack([o1, o2], -1).flatten(-2)
    return torch.cat([rot, x[..., r:]], -1) if r < x.shape[-1] else rot


def _rotate_halves(x, cos, sin, pairing, out, h, r):
    if pairing == "half":
        x1, x2, o1, o2 = x[..., :h], x[..., h:r], out[..., :h], out[..., h:r]
    else:
        x1, x2, o1, o2 = x[..., 0:r:2], x[..., 1:r:2], out[..., 0:r:2], out[..., 1:r:2]
    torch.mul(x1, cos, out=o1)  # o1 = x1 cos - x2 sin
    o1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2)  # o2 = x2 cos + x1 sin
    o2.addcmul_(x1, sin)
