"""RoPE as one Triton kernel: q and k in one launch, float32 math, one rounding.

Imports :mod:`triton`, so it is imported only when the dispatch in
:mod:`posenc.torch.kernels` first picks it (``import posenc.torch`` never needs triton).
On CUDA it compiles for the GPU; with ``TRITON_INTERPRET=1`` it runs on CPU tensors
(how the tests exercise it on a machine without a GPU).

Layers, bottom up:

* ``_rope_fwd``: the kernel. A program rotates ``BLOCK_S`` rows (positions) of one
  ``(batch, head)`` of q or of k: program ids past q's heads are k's. Every stride of the
  input, the output and the ``[cos, sin]`` table is passed, so strided views (q and k
  sliced out of a fused qkv projection, a table broadcast over heads with stride 0) need no
  copy; offsets are 64-bit. Values are loaded as float32, rotated and stored once in the
  output's dtype. ``CONJUGATE`` negates sin: the rotation by ``-theta``, i.e. the backward.
* ``launch``: checks nothing the callers have not, expands the tables, picks block sizes
  and launches once for one or two tensors; ``out`` may be the input itself (in place).
* ``rope`` / ``rope_qk``: ``torch.library`` custom ops (new outputs) with autograd (the
  gradient is the same kernel with ``conjugate`` flipped) and fake tensors, so autograd and
  ``torch.compile`` go through the same kernel (the compiler treats it as opaque).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TILE = 4096  # elements of x per program (rows x pairs x 2)


@triton.jit
def _rotate_rows(
    X, CS, OUT,  # x, out: (b, h, s, d); cs: (b, h, s, r // 2, 2), (r // 2, 2) contiguous
    sxb, sxh, sxs, sxd,
    sob, sobh, sos, sod,
    scb, sch, scs,
    b, head, s0, seq,
    HALF: tl.constexpr, TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
    CONJUGATE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    rows = s0 + tl.arange(0, BLOCK_S).to(tl.int64)[:, None]  # (BLOCK_S, 1)
    e = tl.arange(0, 2 * BLOCK_H).to(tl.int64)[None, :]  # (1, 2 BLOCK_H): a row's 2h entries
    emask = (rows < seq) & (e < 2 * HALF)  # (BLOCK_S, 2 BLOCK_H)
    # the table's rows are [cos_0, sin_0, cos_1, ...]: one contiguous load, split in registers
    cs = tl.load(CS + b * scb + head * sch + rows * scs + e, mask=emask, other=0.0)
    cos, sin = tl.split(tl.reshape(cs.to(tl.float32), (BLOCK_S, BLOCK_H, 2)))  # (BLOCK_S, BLOCK_H)
    if CONJUGATE:
        sin = -sin
    x_at = X + b * sxb + head * sxh + rows * sxs
    o_at = OUT + b * sob + head * sobh + rows * sos
    if INTERLEAVED:  # pairs are adjacent: load whole rows, split in registers
        x = tl.load(x_at + e * sxd, mask=emask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_S, BLOCK_H, 2)))  # (BLOCK_S, BLOCK_H) each
    else:  # pairs are (j, j + HALF): the two halves
        j = tl.arange(0, BLOCK_H).to(tl.int64)[None, :]  # (1, BLOCK_H)
        mask = (rows < seq) & (j < HALF)  # (BLOCK_S, BLOCK_H)
        x1 = tl.load(x_at + j * sxd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_at + (j + HALF) * sxd, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if INTERLEAVED:
        o = tl.reshape(tl.join(o1, o2), (BLOCK_S, 2 * BLOCK_H))  # (BLOCK_S, 2 BLOCK_H)
        tl.store(o_at + e * sod, o.to(OUT.dtype.element_ty), mask=emask)  # the one rounding
    else:
        tl.store(o_at + j * sod, o1.to(OUT.dtype.element_ty), mask=mask)  # the one rounding
        tl.store(o_at + (j + HALF) * sod, o2.to(OUT.dtype.element_ty), mask=mask)
    if TAIL > 0:  # partial rotary, new output: the dims past 2 * HALF pass through
        t = 2 * HALF + tl.arange(0, BLOCK_T).to(tl.int64)[None, :]  # (1, BLOCK_T)
        tmask = (rows < seq) & (t < 2 * HALF + TAIL)
        tail = tl.load(x_at + t * sxd, mask=tmask, other=0.0)
        tl.store(o_at + t * sod, tail, mask=tmask)


@triton.jit
def _rope_fwd(
    Q, CSQ, QO, K, CSK, KO,
    sqb, sqh, sqs, sqd, sqob, sqoh, sqos, sqod, scqb, scqh, scqs,
    skb, skh, sks, skd, skob, skoh, skos, skod, sckb, sckh, scks,
    q_heads, q_seq, k_seq,
    HALF: tl.constexpr, TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
    CONJUGATE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Grid ``(seq blocks, q heads + k heads, batch)``: one launch for q and k."""
    s0 = tl.program_id(0).to(tl.int64) * BLOCK_S
    hid = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    if hid < q_heads:
        _rotate_rows(
            Q, CSQ, QO, sqb, sqh, sqs, sqd, sqob, sqoh, sqos, sqod,
            scqb, scqh, scqs, b, hid, s0, q_seq,
            HALF, TAIL, INTERLEAVED, CONJUGATE, BLOCK_S, BLOCK_H, BLOCK_T,
        )  # fmt: skip
    else:
        _rotate_rows(
            K, CSK, KO, skb, skh, sks, skd, skob, skoh, skos, skod,
            sckb, sckh, scks, b, hid - q_heads, s0, k_seq,
            HALF, TAIL, INTERLEAVED, CONJUGATE, BLOCK_S, BLOCK_H, BLOCK_T,
        )  # fmt: skip


def _as4(t):
    """``t`` with leading dims of size 1 added up to 4-D (a view)."""
    return t[(None,) * (4 - t.dim())]


def launch(pairs, interleaved, conjugate=False):
    """Rotate one or two ``(x, cs, out)`` (q, then k) in one kernel launch.

    ``x``: ``(..., seq, head_dim)`` with at most 4 dims, float32/float16/bfloat16;
    ``cs``: ``(..., seq, r // 2, 2)`` float32, broadcastable to ``x``; ``out``: like ``x``,
    a new tensor, a buffer not overlapping ``x``, or ``x`` itself (in place). The pairs
    must share batch, head_dim, rotary width and in-placeness.
    """
    args, heads, seqs = [], [], []
    for x, cs, out in pairs:
        x4, o4 = _as4(x), _as4(out)  # (b, h, s, d)
        if cs.stride(-1) != 1 or cs.stride(-2) != 2:
            cs = cs.contiguous()  # the kernel reads a row's (r // 2, 2) entries as one block
        c6 = cs.expand(*x4.shape[:-1], *cs.shape[-2:])  # (b, h, s, r // 2, 2): stride 0 views
        args += [x4, c6, o4]
        heads.append(x4.shape[1])
        seqs.append(x4.shape[2])
    if len(pairs) == 1:  # k's slots repeat q's; its programs are never launched
        args += args[:3]
        seqs.append(0)
    strides = [  # kernel order per tensor: x, out, then the table's leading three
        st
        for i in (0, 3)
        for t in (args[i], args[i + 2], args[i + 1])
        for st in t.stride()[: 4 if t is not args[i + 1] else 3]
    ]
    x0, cs0, out0 = pairs[0]
    half = cs0.shape[-2]
    tail = 0 if out0.data_ptr() == x0.data_ptr() else x0.shape[-1] - 2 * half
    block_h = triton.next_power_of_2(half)
    block_s = max(1, min(triton.next_power_of_2(max(seqs)), _TILE // (2 * block_h)))
    batch = args[0].shape[0]
    grid = (triton.cdiv(max(seqs), block_s), sum(heads), batch)
    if 0 in grid:  # nothing to rotate (an empty prompt, zero heads)
        return tuple(out for _, _, out in pairs)
    _rope_fwd[grid](
        args[0], args[1], args[2], args[3], args[4], args[5],
        *strides, heads[0], seqs[0], seqs[1],
        HALF=half, TAIL=tail, INTERLEAVED=interleaved, CONJUGATE=conjugate,
        BLOCK_S=block_s, BLOCK_H=block_h, BLOCK_T=triton.next_power_of_2(max(tail, 1)),
    )  # fmt: skip
    return tuple(out for _, _, out in pairs)


# -- custom ops: autograd and torch.compile through the same kernel --------------------------
@torch.library.custom_op("posenc::rope_triton", mutates_args=())
def rope(x: torch.Tensor, cs: torch.Tensor, interleaved: bool, conjugate: bool) -> torch.Tensor:
    """``x`` rotated by ``cs`` (by ``-theta`` if ``conjugate``), a new tensor."""
    return launch([(x, cs, torch.empty_like(x))], interleaved, conjugate)[0]


@rope.register_fake
def _(x, cs, interleaved, conjugate):
    return torch.empty_like(x)


@torch.library.custom_op("posenc::rope_qk_triton", mutates_args=())
def rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cs_q: torch.Tensor,
    cs_k: torch.Tensor,
    interleaved: bool,
    conjugate: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` rotated by their tables in one launch, new tensors."""
    pairs = [(q, cs_q, torch.empty_like(q)), (k, cs_k, torch.empty_like(k))]
    return launch(pairs, interleaved, conjugate)


@rope_qk.register_fake
def _(q, k, cs_q, cs_k, interleaved, conjugate):
    return torch.empty_like(q), torch.empty_like(k)


def _rope_backward(ctx, grad):
    (cs,) = ctx.saved_tensors
    return rope(grad, cs, ctx.interleaved, not ctx.conjugate), None, None, None


def _rope_qk_backward(ctx, grad_q, grad_k):
    cs_q, cs_k = ctx.saved_tensors
    gq, gk = rope_qk(grad_q, grad_k, cs_q, cs_k, ctx.interleaved, not ctx.conjugate)
    return gq, gk, None, None, None, None


def _setup_rope(ctx, inputs, output):
    _, cs, interleaved, conjugate = inputs
    ctx.save_for_backward(cs)
    ctx.interleaved, ctx.conjugate = interleaved, conjugate


def _setup_rope_qk(ctx, inputs, output):
    _, _, cs_q, cs_k, interleaved, conjugate = inputs
    ctx.save_for_backward(cs_q, cs_k)
    ctx.interleaved, ctx.conjugate = interleaved, conjugate


rope.register_autograd(_rope_backward, setup_context=_setup_rope)
rope_qk.register_autograd(_rope_qk_backward, setup_context=_setup_rope_qk)
