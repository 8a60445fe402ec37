"""RoPE as one Triton kernel: q and k in one launch, heads sharing their table, one rounding.

Imports :mod:`triton`, so it is imported only when the dispatch in
:mod:`posenc.torch.kernels` first picks it (``import posenc.torch`` never needs triton).
On CUDA it compiles for the GPU; with ``TRITON_INTERPRET=1`` it runs on CPU tensors
(how the tests exercise it on a machine without a GPU).

Layers, bottom up:

* ``_rope_fwd``: the kernel. A program rotates ``BLOCK_S`` rows (positions) of up to
  ``HEADS`` heads of one batch row, of q or of k (program ids past q's head groups are
  k's). It loads the rows' ``[cos, sin]`` once, in float32, and reuses them for its
  heads: the table's bytes are paid once per head group, not once per head, so the bytes
  issued stay near the copy bound (q and k read and written once). The table is either
  gathered (``(b, s, r // 2, 2)``, any strides) or the whole derived table indexed
  inside the kernel by per-token positions (no gather on the host). Every stride of
  the inputs and outputs is passed, so strided views (q and k sliced out of a fused qkv
  projection) need no copy; offsets are 64-bit. ``CONJUGATE`` negates sin: the rotation
  by ``-theta``, i.e. the backward. Results are rounded once, to nearest even.
* ``plan`` / ``launch``: block sizes, head groups and the grid for one or two tensors
  (``plan`` also counts the bytes the programs issue), prepared once per layout; ``out``
  may be the input itself (in place); launched under the tensors' own CUDA device.
* :mod:`.rope_triton_ops` (autograd, ``torch.compile``) calls :func:`launch`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

_TILE = 4096  # elements of one head per program (rows x pairs x 2)
HEADS = 8  # heads per program at most: one table read serves them


@triton.jit
def _rotate_group(
    X, OUT, CS, P,
    sxb, sxh, sxs, sxd, sob, soh, sos, sod, scb, scs, spb, sps,
    b, group, s0, seq, heads,
    HALF: tl.constexpr, TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
    CONJUGATE: tl.constexpr, INDEXED: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, HEADS_PER: tl.constexpr,
):  # fmt: skip
    rows = s0 + tl.arange(0, BLOCK_S).to(tl.int64)[:, None]  # (BLOCK_S, 1)
    live = rows < seq
    if INDEXED:  # the table row of each token is its position, read here (no host gather)
        trow = tl.load(P + b * spb + rows * sps, mask=live, other=0)  # (BLOCK_S, 1) int64
    else:
        trow = rows
    e = tl.arange(0, 2 * BLOCK_H).to(tl.int64)[None, :]  # (1, 2 BLOCK_H): a row's 2h entries
    emask = live & (e < 2 * HALF)  # (BLOCK_S, 2 BLOCK_H)
    # [cos_0, sin_0, cos_1, ...]: one contiguous load per row, split in registers, shared
    # by every head of the group
    cs = tl.load(CS + b * scb + trow * scs + e, mask=emask, other=0.0).to(tl.float32)
    cos, sin = tl.split(tl.reshape(cs, (BLOCK_S, BLOCK_H, 2)))  # (BLOCK_S, BLOCK_H) each
    if CONJUGATE:
        sin = -sin
    j = tl.arange(0, BLOCK_H).to(tl.int64)[None, :]  # (1, BLOCK_H)
    jmask = live & (j < HALF)
    t = 2 * HALF + tl.arange(0, BLOCK_T).to(tl.int64)[None, :]  # (1, BLOCK_T): the tail
    tmask = live & (t < 2 * HALF + TAIL)
    for i in range(HEADS_PER):
        head = group * HEADS_PER + i
        if head < heads:
            x_at = X + b * sxb + head * sxh + rows * sxs
            o_at = OUT + b * sob + head * soh + rows * sos
            if INTERLEAVED:  # pairs are adjacent: whole rows, split in registers
                x = tl.load(x_at + e * sxd, mask=emask, other=0.0).to(tl.float32)
                x1, x2 = tl.split(tl.reshape(x, (BLOCK_S, BLOCK_H, 2)))
            else:  # pairs are (j, j + HALF): the two halves
                x1 = tl.load(x_at + j * sxd, mask=jmask, other=0.0).to(tl.float32)
                x2 = tl.load(x_at + (j + HALF) * sxd, mask=jmask, other=0.0).to(tl.float32)
            o1 = x1 * cos - x2 * sin
            o2 = x2 * cos + x1 * sin
            ty = OUT.dtype.element_ty
            if INTERLEAVED:
                o = tl.reshape(tl.join(o1, o2), (BLOCK_S, 2 * BLOCK_H))
                tl.store(o_at + e * sod, _round(o, ty), mask=emask)  # the one rounding
            else:
                tl.store(o_at + j * sod, _round(o1, ty), mask=jmask)  # the one rounding
                tl.store(o_at + (j + HALF) * sod, _round(o2, ty), mask=jmask)
            if TAIL > 0:  # partial rotary, new output: the dims past 2 * HALF pass through
                tl.store(o_at + t * sod, tl.load(x_at + t * sxd, mask=tmask), mask=tmask)


@triton.jit
def _round(x, ty):
    """float32 -> the output's dtype, to nearest (ties to even), on a GPU and interpreted.

    bfloat16 is rounded in integers (the interpreter's own conversion truncates, even when
    asked for "rtne"); float16 by Triton's conversion, which rounds to nearest on both.
    """
    if ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        up = bits + 0x7FFF + ((bits >> 16) & 1)  # half an ulp of bf16, ties to even
        y = (up >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, y, x.to(tl.bfloat16))  # a NaN stays a NaN
    return x.to(ty)


@triton.jit
def _rope_fwd(
    Q, QO, CSQ, PQ, K, KO, CSK, PK,
    sqb, sqh, sqs, sqd, sqob, sqoh, sqos, sqod, scqb, scqs, spqb, spqs,
    skb, skh, sks, skd, skob, skoh, skos, skod, sckb, scks, spkb, spks,
    q_heads, k_heads, q_groups, q_seq, k_seq,
    HALF: tl.constexpr, TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
    CONJUGATE: tl.constexpr, Q_INDEXED: tl.constexpr, K_INDEXED: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
    HEADS_PER: tl.constexpr,
):  # fmt: skip
    """Grid ``(seq blocks, q head groups + k head groups, batch)``: q and k in one launch."""
    s0 = tl.program_id(0).to(tl.int64) * BLOCK_S
    gid = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    if gid < q_groups:
        _rotate_group(
            Q, QO, CSQ, PQ, sqb, sqh, sqs, sqd, sqob, sqoh, sqos, sqod, scqb, scqs, spqb, spqs,
            b, gid, s0, q_seq, q_heads,
            HALF, TAIL, INTERLEAVED, CONJUGATE, Q_INDEXED, BLOCK_S, BLOCK_H, BLOCK_T, HEADS_PER,
        )  # fmt: skip
    else:
        _rotate_group(
            K, KO, CSK, PK, skb, skh, sks, skd, skob, skoh, skos, skod, sckb, scks, spkb, spks,
            b, gid - q_groups, s0, k_seq, k_heads,
            HALF, TAIL, INTERLEAVED, CONJUGATE, K_INDEXED, BLOCK_S, BLOCK_H, BLOCK_T, HEADS_PER,
        )  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """How :func:`launch` splits the work, and the bytes its programs issue."""

    grid: tuple
    block_s: int
    block_h: int
    heads_per: int
    warps: int  # 4 for prefill blocks, fewer for a decode row: wider loads per thread
    groups: tuple  # head groups of q (and of k)
    bytes_issued: int  # loads and stores of every program (masked lanes not counted)
    copy_bound: int  # reading and writing the rotated tensors once


def _pow2(n: int) -> int:  # triton.next_power_of_2: its constexpr wrapper costs ~5 us a call
    return 1 << (n - 1).bit_length() if n > 0 else 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _as4(t):
    """``t`` with leading dims of size 1 added up to 4-D (a view)."""
    return t[(None,) * (4 - t.dim())]


def _table(x4, cs):
    """``(table, positions)``: the ``[cos, sin]`` rows ``(b, s, r // 2, 2)`` (any strides,
    shared by the heads) and ``None``, or the whole table ``(rows, r // 2, 2)`` and int64
    positions ``(b, s)`` to index it with inside the kernel."""
    if isinstance(cs, tuple):  # (table, positions): indexed in the kernel
        table, pos = cs
        return table.contiguous(), pos.expand(x4.shape[0], x4.shape[2])
    cs5 = cs[(None,) * (5 - cs.dim())]  # (b|1, h|1, s|1, r // 2, 2)
    if cs5.shape[1] != 1:
        raise ValueError(f"the [cos, sin] rows must be shared by the heads, got {tuple(cs.shape)}")
    rows = cs5[:, 0]  # (b|1, s|1, r // 2, 2)
    if rows.stride(-1) != 1 or rows.stride(-2) != 2:
        rows = rows.contiguous()  # the kernel reads a row's (r // 2, 2) entries as one block
    return rows.expand(x4.shape[0], x4.shape[2], *rows.shape[-2:]), None


def _half(cs):
    """Pairs per row of a ``[cos, sin]`` table (or of an indexed one)."""
    return (cs[0] if isinstance(cs, tuple) else cs).shape[-2]


def plan(pairs) -> Plan:
    """Block sizes, head groups and grid for ``pairs`` of ``(x, cs, out)``; bytes issued."""
    x0, cs0, out0 = pairs[0]
    half = _half(cs0)
    shapes = [_as4(x).shape for x, _, _ in pairs]
    heads = [s[1] for s in shapes]
    seqs = [s[2] for s in shapes]
    block_h = _pow2(half)
    block_s = max(1, min(_pow2(max(seqs)), _TILE // (2 * block_h)))
    heads_per = max(1, min(HEADS, _pow2(max(heads))))  # zero heads: an empty grid, no division
    groups = tuple(_cdiv(h, heads_per) for h in heads)
    grid = (_cdiv(max(seqs), block_s), sum(groups), shapes[0][0])
    warps = max(1, min(4, block_s * 2 * block_h // 256))  # >= 8 elements per thread
    inplace = out0.data_ptr() == x0.data_ptr()
    width = x0.shape[-1] if not inplace else 2 * half  # in place: the tail stays put
    issued = bound = 0
    for (x, cs, _), (b, h, s, _) in zip(pairs, shapes, strict=True):
        esize = x.element_size()
        bound += 2 * b * h * s * width * esize
        issued += 2 * b * h * s * width * esize  # every head's rows in and out once
        groups_x = _cdiv(h, heads_per)
        issued += b * s * groups_x * 2 * half * 4  # float32 [cos, sin] once per group
        if isinstance(cs, tuple):
            issued += b * s * groups_x * 8  # int64 positions
    return Plan(grid, block_s, block_h, heads_per, warps, groups, issued, bound)


class _Prepared(NamedTuple):
    """What a launch of one key needs besides the tensors' addresses (:func:`_prepare`)."""

    grid: tuple
    scalars: tuple  # every stride, heads, groups and sequence lengths, in the kernel's order
    constants: dict  # the constexpr keywords, num_warps and the compiler flag
    copied: tuple  # per pair: were the gathered rows copied to make a row one block?


_PREPARED: dict = {}  # key -> _Prepared: the host work of a launch, done once per layout


def _key(pairs, interleaved, conjugate):
    """Everything :func:`_prepare` reads: shapes, strides, dtypes, in-placeness, flags."""
    key = [interleaved, conjugate]
    for x, cs, out in pairs:
        t, pos = cs if isinstance(cs, tuple) else (cs, None)
        key += [x.shape, x.stride(), x.dtype, out.stride(), out.data_ptr() == x.data_ptr()]
        key += [t.shape, t.stride()] if pos is None else [t.shape, pos.shape, pos.stride()]
    return tuple(key)


def _prepare(pairs, interleaved, conjugate):
    """Plan, strides and constants of a launch of ``pairs`` (see :func:`launch`)."""
    p = plan(pairs)
    strides, flags, heads, seqs, copied = [], [], [], [], []
    for x, cs, out in pairs:
        x4, o4 = _as4(x), _as4(out)  # (b, h, s, d)
        table, pos = _table(x4, cs)
        indexed = pos is not None
        copied.append(not indexed and table.data_ptr() != cs.data_ptr())
        st = table.stride()
        cs_strides = (0, st[0]) if indexed else (st[0], st[1])  # (batch, row)
        p_strides = tuple(pos.stride()) if indexed else (0, 0)
        strides += [*x4.stride(), *o4.stride(), *cs_strides, *p_strides]
        flags.append(indexed)
        heads.append(x4.shape[1])
        seqs.append(x4.shape[2])
    if len(pairs) == 1:  # k's slots repeat q's; its programs are never launched
        strides = strides + strides[:12]
        flags, heads, seqs = flags * 2, heads + [0], seqs + [0]
    x0, cs0, out0 = pairs[0]
    half = _half(cs0)
    tail = 0 if out0.data_ptr() == x0.data_ptr() else x0.shape[-1] - 2 * half
    constants = dict(HALF=half, TAIL=tail, INTERLEAVED=interleaved, CONJUGATE=conjugate,
                     Q_INDEXED=flags[0], K_INDEXED=flags[1], BLOCK_S=p.block_s,
                     BLOCK_H=p.block_h, BLOCK_T=_pow2(max(tail, 1)), HEADS_PER=p.heads_per,
                     num_warps=p.warps, enable_fp_fusion=False)  # no FMA  # fmt: skip
    scalars = (*strides, heads[0], heads[1], p.groups[0], seqs[0], seqs[1])
    return _Prepared(p.grid, scalars, constants, tuple(copied))


def _pointers(pairs, copied):
    """The tensors whose addresses the kernel takes: x, out, table, positions per pair."""
    args = []
    for (x, cs, out), copy in zip(pairs, copied, strict=True):
        if isinstance(cs, tuple):  # (table, positions): indexed in the kernel
            args += [x, out, cs[0].contiguous(), cs[1]]
        else:  # gathered rows: the view the plan read starts where cs does, unless copied
            rows = _table(_as4(x), cs)[0] if copy else cs
            args += [x, out, rows, rows]  # the positions' pointer is unused
    return args + args[:4] if len(pairs) == 1 else args


def launch(pairs, interleaved, conjugate=False):
    """Rotate one or two ``(x, cs, out)`` (q, then k) in one kernel launch.

    ``x``: ``(..., seq, head_dim)`` with at most 4 dims, float32/float16/bfloat16; ``cs``:
    the ``[cos, sin]`` rows ``(..., seq, r // 2, 2)`` float32 shared by the heads, or a
    ``(table, positions)`` pair (the whole table, and int64 ``(b|1, seq)`` positions to
    index it with); ``out``: like ``x``, a new tensor, a buffer not overlapping ``x``, or
    ``x`` itself (in place). The pairs must share batch, head_dim, rotary width and
    in-placeness. The plan, strides and constants are prepared once per layout (shapes,
    strides, dtypes, in-placeness) and kept: a repeated call only reads the addresses.
    """
    key = _key(pairs, interleaved, conjugate)
    how = _PREPARED.get(key)
    if how is None:
        how = _prepare(pairs, interleaved, conjugate)
        if len(_PREPARED) >= 512:  # a bound on the layouts kept
            _PREPARED.clear()
        _PREPARED[key] = how
    outs = tuple(out for _, _, out in pairs)
    if 0 in how.grid:  # nothing to rotate (an empty prompt, zero heads)
        return outs
    args = _pointers(pairs, how.copied)
    device = pairs[0][0].device
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:  # Triton launches on the current device: make it the tensors'
        _rope_fwd[how.grid](*args, *how.scalars, **how.constants)
    return outs
