"""The Triton RoPE kernel under autograd: a plain ``autograd.Function`` in eager code, and
``torch.library`` custom ops for ``torch.compile``.

Each returns new tensors; the gradient is the same kernel with ``conjugate`` flipped (the
rotation by ``-theta``). :func:`rotate` (eager) is what a training step calls on CUDA: a
custom op's dispatch costs about 0.3 ms of host time per forward and backward, more than
the kernel's GPU time at a small model's sizes (``benchmarks/results/gpu.json``). The
custom ops ``rope`` and ``rope_qk`` serve what must see or record the call: a traced call
that forces the kernel (their fake implementations let ``torch.compile`` trace through
them; the compiler treats the kernel as opaque), a ``torch.func`` transform, a dispatch
mode (``make_fx``). Imports triton, through :mod:`.rope_triton`.
"""

from __future__ import annotations

import torch

from posenc.torch.kernels import rope_triton

__all__ = ["rope", "rope_qk", "rotate"]


def _new(xs, tables, interleaved, conjugate):
    """``xs`` rotated by ``tables`` into new tensors, in one launch."""
    pairs = [(x, t, torch.empty_like(x)) for x, t in zip(xs, tables, strict=True)]
    return rope_triton.launch(pairs, interleaved, conjugate)


class _Rotate(torch.autograd.Function):
    """``xs`` (one or two tensors) rotated by their ``tables`` in one launch; the backward is
    the same Function conjugated (so it is differentiable again)."""

    @staticmethod
    def forward(ctx, interleaved, conjugate, *xs_and_tables):
        n = len(xs_and_tables) // 2
        xs, tables = xs_and_tables[:n], xs_and_tables[n:]
        ctx.save_for_backward(*tables)
        ctx.interleaved, ctx.conjugate = interleaved, conjugate
        return _new(xs, tables, interleaved, conjugate)

    @staticmethod
    def backward(ctx, *grads):
        tables = ctx.saved_tensors
        flags = (ctx.interleaved, not ctx.conjugate)
        if torch.is_grad_enabled():  # create_graph: the backward is recorded in turn
            back = _Rotate.apply(*flags, *grads, *tables)
        else:
            back = _new(grads, tables, *flags)
        return None, None, *back, *(None,) * len(tables)


def rotate(xs, tables, interleaved):
    """``xs`` (a tuple of one or two tensors) rotated by ``tables``, recorded by autograd."""
    return _Rotate.apply(interleaved, False, *xs, *tables)


@torch.library.custom_op("posenc::rope_triton", mutates_args=())
def rope(x: torch.Tensor, cs: torch.Tensor, interleaved: bool, conjugate: bool) -> torch.Tensor:
    """``x`` rotated by ``cs`` (by ``-theta`` if ``conjugate``), a new tensor."""
    return _new((x,), (cs,), interleaved, conjugate)[0]


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
    return _new((q, k), (cs_q, cs_k), interleaved, conjugate)


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
