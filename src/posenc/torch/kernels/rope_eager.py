"""RoPE's eager torch kernels: rotate ``(..., seq, head_dim)`` tensors given a cos/sin table.

The table ``cs`` has shape ``(..., seq, r // 2, 2)`` holding ``[cos, sin]`` (times the
attention scale) in float32, or float64 for float64 inputs; angles are always float64
products of integer positions and rates (``cos_sin``). The rotation is computed in the
table's dtype and rounded once to the input's dtype.

Two implementations of the same rotation:

* ``rotate_expr``: plain tensor expressions, new output; differentiable and traceable
  (autograd, ``torch.compile``, ``torch.func`` transforms).
* ``rotate_eager``: kernels for plain inference, which write into ``out`` or into ``x`` itself
  (``inplace``) without temporaries the size of ``x``: a complex multiply for
  interleaved float32/float64, four multiply(-add) kernels on the halves, and a blocked
  path through a small float32 buffer (low precision, in-place half pairing, odd strides).

Which one runs is decided in :mod:`posenc.torch.kernels` (the dispatch table).
"""

from __future__ import annotations

import torch

_BLOCK = 1 << 20  # elements per block of the blocked kernel (4 MiB of float32): fewer
# Python-level blocks; bf16 interleaved about 20-30 % faster than with 1 MiB blocks here
_SMALL = 1 << 12  # at most this many elements: strided cos/sin views instead of copies


def cos_sin(positions, inv_freq, scale, dtype):
    """``[cos, sin]`` of ``positions * inv_freq`` times ``scale``: ``(..., seq, r // 2, 2)``.

    Angles are float64 whatever ``dtype`` is; only the results are rounded to ``dtype``.
    """
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (..., seq, r // 2)
    return (scale * torch.stack([angles.cos(), angles.sin()], -1)).to(dtype)


def rotate_eager(x, cs, pairing, dst):
    """Plain eager inference: rotate ``x`` into ``dst`` (a new tensor, ``out`` or ``x``)."""
    h = cs.shape[-2]
    r = 2 * h
    same = x.dtype == cs.dtype
    if pairing == "interleaved" and same and _complex_view_ok(x) and _complex_view_ok(dst):
        torch.mul(_as_complex(x, h), torch.view_as_complex(cs), out=_as_complex(dst, h))
    elif pairing == "half" and same and dst is not x:
        _rotate_halves(x, cs, dst, h)
    else:
        _rotate_blocked(x, cs, pairing, dst, h)
    if r < x.shape[-1] and dst is not x:
        dst[..., r:].copy_(x[..., r:])  # partial rotary: the tail passes through
    return dst


def rotate_pair(q, k, cs, pairing, dq, dk):
    """:func:`rotate_eager` of ``q`` into ``dq`` and ``k`` into ``dk`` by one table ``cs``.

    A decode step (few elements, half pairing, whole head rotated, out of place) splits the
    table once for both, as ``[cos, cos]`` and ``[-sin, sin]`` over the head, and rotates
    each tensor in three kernels: ``x * [cos, cos] + roll(x, h) * [-sin, sin]``, the same
    products and sums as the four kernels on the halves (equal bits), in fewer calls.
    """
    h = cs.shape[-2]
    small = q.numel() + k.numel() <= _SMALL and q.shape[-1] == k.shape[-1] == 2 * h
    same = q.dtype == k.dtype == cs.dtype
    if pairing == "half" and small and same and q is not dq and k is not dk:
        cos, sin = cs[..., 0], cs[..., 1]  # (..., seq, h) views
        c2, s2 = torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)  # (..., seq, 2h)
        for x, dst in ((q, dq), (k, dk)):  # x1 cos - x2 sin | x2 cos + x1 sin
            torch.mul(x, c2, out=dst).addcmul_(x.roll(h, -1), s2)  # (..., seq, 2h)
        return dq, dk
    return rotate_eager(q, cs, pairing, dq), rotate_eager(k, cs, pairing, dk)


def check_out(x, out):
    """Return ``out`` if it can receive the rotation of ``x``, else raise ``ValueError``."""
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(
            f"out must match x: {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        raise ValueError("out must not share memory with the input")
    return out


def _pairs(t, h, pairing):
    """The two members of every pair of ``t[..., :2h]`` as views ``(..., seq, h)``."""
    if pairing == "half":
        return t[..., :h], t[..., h : 2 * h]
    return t[..., 0 : 2 * h : 2], t[..., 1 : 2 * h : 2]


def rotate_expr(x, cs, pairing):
    """Differentiable and traceable: computed in ``cs.dtype``, rounded once to ``x.dtype``."""
    h = cs.shape[-2]
    r = 2 * h
    cos, sin = cs.unbind(-1)  # (..., seq, r // 2) each
    x1, x2 = _pairs(x, h, pairing)
    if x.dtype != cs.dtype:  # (a same-dtype .to() is a no-op that still costs a dispatch)
        x1, x2 = x1.to(cs.dtype), x2.to(cs.dtype)
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin  # (..., seq, r // 2) each
    if pairing == "half":
        rot = torch.cat([o1, o2], -1)  # (..., seq, r)
    else:
        rot = torch.stack([o1, o2], -1).flatten(-2)  # (..., seq, r)
    if rot.dtype != x.dtype:
        rot = rot.to(x.dtype)
    return torch.cat([rot, x[..., r:]], -1) if r < x.shape[-1] else rot


def _as_complex(t, h):
    return torch.view_as_complex(t[..., : 2 * h].unflatten(-1, (h, 2)))  # (..., seq, h)


def _complex_view_ok(t):
    """Can ``t``'s adjacent pairs be viewed as complex numbers (float32/64, even strides)?"""
    return (
        t.dtype in (torch.float32, torch.float64)
        and t.stride(-1) == 1
        and t.storage_offset() % 2 == 0
        and all(st % 2 == 0 for st in t.stride()[:-1])
    )


def _rotate_halves(x, cs, dst, h):
    """Out of place, same dtype: four kernels on the halves, no temporaries of x's size."""
    cos, sin = _cos_sin(cs, x.numel())
    x1, x2 = _pairs(x, h, "half")
    o1, o2 = _pairs(dst, h, "half")
    torch.mul(x1, cos, out=o1)  # o1 = x1 cos - x2 sin
    o1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2)  # o2 = x2 cos + x1 sin
    o2.addcmul_(x1, sin)


def _rotate_blocked(x, cs, pairing, dst, h):
    """Blocks of rows through a small buffer in ``cs.dtype``: upcast, rotate, round once.

    Works in place (``dst is x``) because each block is copied out before it is written.
    Small tensors go in one shot (their temporaries are small too).
    """
    r = 2 * h
    if x.numel() <= _BLOCK:
        dst[..., :r].copy_(rotate_expr(x[..., :r], cs, pairing))
        return
    if pairing == "interleaved":  # pairs as complex numbers: stride-1 work on the buffer
        tables = [_complex(cs).expand(*x.shape[:-1], h)]  # (..., seq, r // 2) complex
    else:
        tables = [t.expand(*x.shape[:-1], h) for t in _cos_sin(cs)]  # (..., seq, r // 2)
    seq = x.shape[-2]
    buf = None
    for xv, dv, *tv in zip(_views3(x), _views3(dst), *map(_views3, tables), strict=True):
        rows = xv.shape[0]  # xv, dv: (rows, seq, width); tv: (rows, seq, r // 2) each
        g = max(1, min(rows, _BLOCK // (seq * r)))  # rows per block
        if buf is None or buf.shape[1] < g:
            buf = torch.empty(2, g, seq, r, dtype=cs.dtype, device=x.device)
        for j in range(0, rows, g):
            n = min(g, rows - j)
            src, res = buf[0, :n], buf[1, :n]  # (n, seq, r)
            src.copy_(xv[j : j + n, :, :r])  # upcast (or copy) the block
            _rotate_block(src, [t[j : j + n] for t in tv], res, h, pairing)
            dv[j : j + n, :, :r].copy_(res)  # round once


def _rotate_block(src, tables, res, h, pairing):
    """``res = rotation of src``: contiguous ``(n, seq, r)`` buffers in the table's dtype."""
    if pairing == "interleaved":
        torch.mul(_as_complex(src, h), tables[0], out=_as_complex(res, h))
        return
    c, s = tables  # (n, seq, r // 2) each
    s1, s2 = _pairs(src, h, pairing)
    o1, o2 = _pairs(res, h, pairing)
    torch.mul(s1, c, out=o1)
    o1.addcmul_(s2, s, value=-1)
    torch.mul(s2, c, out=o2)
    o2.addcmul_(s1, s)


def _complex(cs):
    """The table as complex numbers ``cos + i sin``: ``(..., seq, r // 2)`` (a view if it can)."""
    return torch.view_as_complex(cs if _complex_view_ok(cs) else cs.contiguous())


def _cos_sin(cs, numel=None):
    """``cos`` and ``sin`` ``(..., seq, r // 2)`` from the table: contiguous copies (strided
    operands would keep the four kernels over a large x from vectorising), or strided views
    where x has at most ``_SMALL`` elements (a decode step: the copies would cost more)."""
    if numel is not None and numel <= _SMALL:
        return cs[..., 0], cs[..., 1]
    return cs[..., 0].contiguous(), cs[..., 1].contiguous()


def _views3(t):
    """``t`` as a list of 3-D views, unbinding leading dims (never copies)."""
    if t.dim() <= 3:
        return [t.reshape((1,) * (3 - t.dim()) + tuple(t.shape))]
    return [v for sub in t.unbind(0) for v in _views3(sub)]
