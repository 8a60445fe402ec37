"""Running a planned step: SDPA with the step's float mask, or FlexAttention with its
``score_mod`` and block mask (compiled once per shape). Shape legend as in :mod:`.core`.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from posenc.torch.attention.flex import flex_attention_compiled
from posenc.torch.attention.sinks import rescale, sink_inputs

__all__ = []


def _sdpa(q, k, v, mask, is_causal, scale, gqa, sinks=None):
    """SDPA of encoded ``q, k`` over ``v`` with a planned mask (``None``: ``is_causal``);
    ``sinks`` ``(heads,)``: a sink logit per head, as one more key (``posenc.torch.attention.sinks``)."""
    width, dummy = v.shape[-1], False
    if sinks is not None:  # seq_k + 1 keys, the sink first (and a first query, if dummy)
        q, k, v, mask, dummy = sink_inputs(q, k, v, mask, is_causal, sinks, scale)
    if q.shape[-1] > v.shape[-1]:  # the fused kernels need one head width: zero-pad v, 2-5x faster
        v = F.pad(v, (0, q.shape[-1] - v.shape[-1]))  # (b, kv_heads, seq_k, qk_dim)
    with _kernels_for(mask):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
        )  # (b, heads, seq_q, qk_dim|v_dim)
    out = out[..., :width] if out.shape[-1] > width else out  # (b, heads, seq_q [+ 1], v_dim)
    return out[:, :, 1:] if dummy else out  # (b, heads, seq_q, v_dim)


def _run(q, k, v, step, scale, sinks=None):
    """Attention of encoded ``q, k`` over values ``v`` with a planned mask, either backend;
    ``sinks``: a checked ``(heads,)`` sink logit per head, or ``None``."""
    gqa = q.shape[1] != k.shape[1]
    sinks = None if sinks is None else sinks.to(q.dtype)  # a parameter: autocast's q may differ
    if step.backend == "sdpa":
        return _sdpa(q, k, v, step.mask, step.is_causal, scale, gqa, sinks)
    needs_grad = q.requires_grad or k.requires_grad or v.requires_grad
    if q.device.type == "cpu" and needs_grad:
        if torch.is_grad_enabled():
            raise ValueError(
                "backend='flex' has no backward on the CPU (torch 2.13): use backend='sdpa' "
                "to train, or run under torch.no_grad()"
            )
        q, k, v = q.detach(), k.detach(), v.detach()  # no graph anyway; flex refuses them
    flex = flex_attention_compiled(q.device.type)
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        q, k, v = q.float(), k.float(), v.float()  # the CPU kernel is ~1.5x faster in float32
    kw = {"score_mod": step.score_mod, "block_mask": step.block_mask, "scale": scale,
          "enable_gqa": gqa}  # fmt: skip
    if sinks is not None:
        return _flex_sinks(q, k, v, kw, sinks).to(dtype)
    return _call_flex(q, k, v, kw).to(dtype)  # (b, heads, seq_q, v_dim)


def _call_flex(q, k, v, kw):
    """The compiled FlexAttention of ``q``'s device on ``q, k, v`` with keywords ``kw``."""
    flex = flex_attention_compiled(q.device.type)
    if torch.compiler.is_compiling():  # inside the user's torch.compile: part of its graph
        return flex(q, k, v, **kw)
    # Each new shape or score_mod compiles once; past dynamo's default limit of 8 it would
    # fall back to the eager kernel (slow, materialised scores), so allow more, here only.
    with torch._dynamo.config.patch(recompile_limit=64):
        return flex(q, k, v, **kw)


def _flex_sinks(q, k, v, kw, sinks):
    """FlexAttention with its log-sum-exp, rescaled for the sinks (``posenc.torch.attention.sinks.rescale``).
    The compiled CPU kernel of torch 2.13 returns no log-sum-exp: on the CPU (inference
    only anyway) FlexAttention runs uncompiled, the scores materialised."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    kw = kw | {"return_aux": AuxRequest(lse=True)}
    if q.device.type != "cpu":
        out, aux = _call_flex(q, k, v, kw)  # (b, heads, seq_q, v_dim), lse (b, heads, seq_q)
        return rescale(out, aux.lse, sinks)
    if torch.compiler.is_compiling():
        raise ValueError("backend='flex' with sinks does not compile on the CPU (torch 2.13's "
                         "kernel returns no log-sum-exp): use backend='sdpa'")  # fmt: skip
    with warnings.catch_warnings():  # it warns that it is not compiled: known, said above
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, aux = flex_attention(q, k, v, **kw)  # (b, heads, seq_q, v_dim), (b, heads, seq_q)
    return rescale(out, aux.lse, sinks)


_ANY = contextlib.nullcontext()  # no restriction (reusable: it keeps no state)


def _kernels_for(mask):
    """SDPA's math kernel for a learned bias under ``torch.func`` (``grad``, ``vjp``...): the
    CPU flash kernel has no gradient for ``attn_mask`` and the transforms hide from it that
    the mask needs one. Otherwise no restriction."""
    if mask is None or torch.compiler.is_compiling():
        return _ANY
    if torch._C._functorch.is_functorch_wrapped_tensor(mask) and mask.device.type == "cpu":
        return sdpa_kernel(SDPBackend.MATH)
    return _ANY
