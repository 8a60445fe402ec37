"""The Triton RoPE kernel as ``torch.library`` custom ops: autograd and ``torch.compile``.

``rope`` and ``rope_qk`` return new tensors; their gradient is the same kernel with
``conjugate`` flipped (the rotation by ``-theta``), and their fake implementations let
``torch.compile`` trace through them (the compiler treats the kernel as opaque). Imports
triton, through :mod:`.rope_triton`.
"""

from __future__ import annotations

import torch

from posenc.torch.kernels import rope_triton

__all__ = ["rope", "rope_qk"]


@torch.library.custom_op("posenc::rope_triton", mutates_args=())
def rope(x: torch.Tensor, cs: torch.Tensor, interleaved: bool, conjugate: bool) -> torch.Tensor:
    """``x`` rotated by ``cs`` (by ``-theta`` if ``conjugate``), a new tensor."""
    return rope_triton.launch([(x, cs, torch.empty_like(x))], interleaved, conjugate)[0]


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
    return rope_triton.launch(pairs, interleaved, conjugate)


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
