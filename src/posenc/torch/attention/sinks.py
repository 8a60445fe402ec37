"""Attention sinks as a learned logit per head (GPT-OSS): a key that every query sees and
that carries no value.

With a sink logit ``s_h`` for head ``h``, the softmax of a query's scores ``z_1 .. z_n``
gains one term in its denominator::

    p_j = exp(z_j) / (exp(s_h) + sum_i exp(z_i))        out = sum_j p_j v_j

so a head can put weight "nowhere" instead of on some key (the weights sum to
``1 - sigmoid(s_h - lse)``, ``lse = log sum_i exp(z_i)``). Both backends compute it
exactly: SDPA with one more key whose value is zero and whose score is ``s_h`` (a column
of the float mask), FlexAttention by rescaling its output with its own log-sum-exp,
``out * sigmoid(lse - s_h)``. Sinks are not positions: any encoding runs with them.

Shape legend as in :mod:`.core`: ``q`` is ``(batch, heads, seq_q, head_dim)``, ``k, v``
are ``(batch, kv_heads, seq_k, ·)``; ``sinks`` is ``(heads,)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["check_sinks", "sink_key", "rescale"]


def check_sinks(sinks, heads, dtype):
    """``sinks``, a floating ``(heads,)`` tensor, or ``ValueError`` naming what is wrong."""
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise ValueError(f"sinks must be a floating tensor of shape ({heads},), got {sinks!r}")
    if sinks.shape != (heads,):
        raise ValueError(f"sinks must have shape ({heads},) (one logit per query head), "
                         f"got {tuple(sinks.shape)}")  # fmt: skip
    return sinks.to(dtype)


def sink_key(k, v, mask, is_causal, sinks):
    """Keys, values and mask with the sink as one more key: zero key, zero value, score
    ``s_h`` from the mask (the encoded ``q`` never meets it).

    ``mask`` is ``None`` (with ``is_causal``: causal, ``seq_q == seq_k``) or a float
    ``(b|1, h|1, seq_q, seq_k)``. Returns ``(k, v, mask)``: ``(b, kv_heads, seq_k + 1, ·)``
    twice and ``(b|1, heads, seq_q, seq_k + 1)``.
    """
    heads, seq_k = sinks.shape[0], k.shape[2]
    seq_q = seq_k if mask is None else mask.shape[-2]
    k = F.pad(k, (0, 0, 0, 1))  # (b, kv_heads, seq_k + 1, qk_dim): the sink's zero key
    v = F.pad(v, (0, 0, 0, 1))  # (b, kv_heads, seq_k + 1, v_dim): ... and zero value
    column = sinks.view(1, heads, 1, 1)  # (1, heads, 1, 1)
    if mask is None and not is_causal:  # every key visible: one row for every query
        return k, v, torch.cat([column.new_zeros(1, heads, 1, seq_k), column], dim=-1)
    if mask is None:  # causal, aligned to the end (seq_q == seq_k here)
        hidden = torch.ones(seq_q, seq_k, dtype=torch.bool, device=k.device).tril_().logical_not_()
        mask = torch.zeros(seq_q, seq_k, dtype=sinks.dtype, device=k.device)
        mask = mask.masked_fill_(hidden, float("-inf"))[None, None]  # (1, 1, sq, sk)
    rows = mask.shape[0]
    mask = mask.to(sinks.dtype).expand(rows, heads, seq_q, seq_k)  # (b|1, heads, sq, sk)
    return k, v, torch.cat([mask, column.expand(rows, heads, seq_q, 1)], dim=-1)


def rescale(out, lse, sinks):
    """FlexAttention's output with the sink in its softmax: ``out * sigmoid(lse - s_h)``.

    ``out`` ``(b, heads, seq_q, v_dim)``; ``lse`` ``(b, heads, seq_q)``, natural log (minus
    infinity where a query sees no key: its output stays zero, all weight on the sink).
    """
    keep = torch.sigmoid(lse.to(torch.float32) - sinks.to(torch.float32)[:, None])  # (b, h, sq)
    return out * keep[..., None].to(out.dtype)  # (b, heads, seq_q, v_dim)
