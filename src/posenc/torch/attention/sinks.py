"""Attention sinks as a learned logit per head (GPT-OSS): a key that every query sees and
that carries no value.

With a sink logit ``s_h`` for head ``h``, the softmax of a query's scores ``z_1 .. z_n``
gains one term in its denominator::

    p_j = exp(z_j) / (exp(s_h) + sum_i exp(z_i))        out = sum_j p_j v_j

so a head can put weight "nowhere" instead of on some key (the weights sum to
``1 - sigmoid(s_h - lse)``, ``lse = log sum_i exp(z_i)``). Both backends compute it
exactly: SDPA with one more key whose value is zero and whose score is ``s_h`` (through
one more channel of the queries: no dense mask is built for it), FlexAttention by
rescaling its output with its own log-sum-exp, ``out * sigmoid(lse - s_h)``. Sinks are
not positions: any encoding runs with them.

Shape legend as in :mod:`.core`: ``q`` is ``(batch, heads, seq_q, head_dim)``, ``k, v``
are ``(batch, kv_heads, seq_k, ·)``; ``sinks`` is ``(heads,)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["check_sinks", "sink_inputs", "rescale"]


def check_sinks(sinks, heads):
    """``sinks``, a floating ``(heads,)`` tensor, or ``ValueError`` naming what is wrong
    (the attention casts it to the queries' dtype)."""
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise ValueError(f"sinks must be a floating tensor of shape ({heads},), got {sinks!r}")
    if sinks.shape != (heads,):
        raise ValueError(f"sinks must have shape ({heads},) (one logit per query head), "
                         f"got {tuple(sinks.shape)}")  # fmt: skip
    return sinks


def sink_inputs(q, k, v, mask, is_causal, sinks, scale):
    """SDPA's arguments with the sink as one more key, first: a zero value, and a score of
    ``s_h`` from one more channel (``q`` gains ``s_h / scale``, the sink's key a 1 there,
    every other key a 0), so GQA's shared keys serve each query head its own sink and the
    mask needs no head axis for it.

    ``q`` ``(b, h, sq, d)``; ``k, v`` ``(b, kv_heads, sk, ·)``; ``mask`` ``None`` (with
    ``is_causal``: ``sq == sk``) or float ``(b|1, h|1, sq, sk)``. Returns ``q, k, v,
    mask, dummy``: ``q`` ``(b, h, sq [+ 1], d + pad)`` (``pad`` to a multiple of 8, at
    least 1), ``k`` ``(b, kv_heads, sk + 1, d + pad)``, ``v`` ``(b, kv_heads, sk + 1,
    max(v_dim, d + pad))`` (zero-padded: slice the output back to ``v_dim``), ``mask`` ``(b|1, h|1, sq, sk + 1)`` or ``None``; ``dummy``: a causal call
    without a mask gets one more query first (SDPA's causal mask aligns to the start, so
    the sink, key 0, is seen by every query); drop its output row.
    """
    b, h, sq, d = q.shape
    pad = 8 - d % 8  # the sink's channel, then zeros to a width the fused kernels take
    column = (sinks / scale).view(1, h, 1, 1).expand(b, h, sq, 1)  # (b, h, sq, 1)
    q = torch.cat([q, column, q.new_zeros(b, h, sq, pad - 1)], dim=-1)  # (b, h, sq, d + pad)
    sink = k.new_zeros(k.shape[0], k.shape[1], 1, d + pad)  # (b, kv_heads, 1, d + pad)
    sink[..., d] = 1.0
    k = torch.cat([sink, F.pad(k, (0, pad))], dim=2)  # (b, kv_heads, sk + 1, d + pad)
    widen = max(d + pad - v.shape[-1], 0)  # v as wide as q, k for the fused kernels: one copy
    v = F.pad(v, (0, widen, 1, 0))  # (b, kv_heads, sk + 1, max(v_dim, d + pad)): sink's is 0
    dummy = mask is None and is_causal
    if mask is not None:
        mask = F.pad(mask, (1, 0))  # (b|1, h|1, sq, sk + 1): the sink always seen
    elif dummy:
        q = F.pad(q, (0, 0, 1, 0))  # (b, h, sq + 1, d + pad): query i + 1 sees keys 0 .. i + 1
    return q, k, v, mask, dummy


def rescale(out, lse, sinks):
    """FlexAttention's output with the sink in its softmax: ``out * sigmoid(lse - s_h)``.

    ``out`` ``(b, heads, seq_q, v_dim)``; ``lse`` ``(b, heads, seq_q)``, natural log (minus
    infinity where a query sees no key: its output stays zero, all weight on the sink).
    """
    keep = torch.sigmoid(lse.to(torch.float32) - sinks.to(torch.float32)[:, None])  # (b, h, sq)
    return out * keep[..., None].to(out.dtype)  # (b, heads, seq_q, v_dim)
