"""The FlexAttention backend: the encoding's ``score_mod`` and a causal/padding block mask."""

from __future__ import annotations

import torch

from posenc.torch.positions import len_of

__all__ = ["flex_plan", "flex_attention_compiled"]


_FLEX = {}


def flex_attention_compiled():
    """``flex_attention`` compiled once per process (it materialises scores when eager)."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():  # already inside the user's torch.compile
        return flex_attention
    if "fn" not in _FLEX:
        # Static shapes: inductor's CPU flex lowering fails on symbolic ones (torch 2.13).
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def flex_plan(
    encoding, q_positions, k_positions, *, causal, key_valid=None, q_start=None, device=None
):
    """The encoding's ``score_mod`` and a causal/padding ``BlockMask`` for FlexAttention.

    Same semantics as :func:`attention_mask`: causal aligned to the end, padding keys
    hidden except a query's own slot. With a KV cache the keys are the whole preallocated
    buffer (static shapes: the compiled kernel is reused at every step), ``key_valid``
    hides the unfilled slots and ``q_start`` says which slot the first query is.

    Parameters
    ----------
    encoding : PositionalEncoding
        Supplies ``score_mod``.
    q_positions, k_positions : torch.Tensor or range
        Positions of queries and keys.
    causal : bool
        Causal attention.
    key_valid : torch.Tensor, optional
        Bool ``(batch, seq_k)``.
    q_start : int, optional
        Key slot of the first query; default ``seq_k - seq_q`` (the queries are the last).
    device : torch.device, optional
        Where the block mask lives.

    Returns
    -------
    score_mod : callable or None
        From the encoding.
    block_mask : BlockMask or None
        ``None`` when every key is visible.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    seq_q, seq_k = len_of(q_positions), len_of(k_positions)
    score_mod = encoding.score_mod(q_positions, k_positions)
    if not causal and key_valid is None:
        return score_mod, None
    offset = seq_k - seq_q if q_start is None else q_start
    if not isinstance(offset, torch.Tensor):  # a tensor: no recompile when it changes
        offset = torch.tensor(offset, device=device)

    def visible(b, h, q_idx, kv_idx):
        slot = q_idx + offset
        ok = kv_idx <= slot if causal else kv_idx >= 0
        if key_valid is not None:
            ok = (ok & key_valid[b, kv_idx]) | (kv_idx == slot)
        return ok

    batch = None if key_valid is None else key_valid.shape[0]
    return score_mod, create_block_mask(visible, batch, None, seq_q, seq_k, device=device)
