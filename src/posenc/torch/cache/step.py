"""One model step's plan with or without a cache: positions, cache slots, then the mask.

Shared by :class:`~posenc.torch.MultiHeadAttention` and :class:`~posenc.torch.TransformerLM`:
the positions of the ``n`` new tokens (given, or continued from the cache), the slots they
take in the cache and the keys they see, then the attention core's :func:`plan` for them.
"""

from __future__ import annotations

from posenc.torch.attention.core import Step, check_padding_mask, plan, resolve_backend
from posenc.torch.positions import position_arg

__all__ = ["plan_step"]


def plan_step(encoding, batch, n, positions, padding_mask, cache, **kw) -> Step:
    """Positions and cache slots of ``n`` new tokens, then :func:`plan` (for modules)."""
    if padding_mask is not None:
        check_padding_mask(padding_mask, batch, n)
    full_kv = False
    axes = encoding.position_axes
    if cache is None:
        q_pos = k_pos = position_arg(positions, batch, n, axes=axes)
        start, key_valid = 0, padding_mask
    else:
        if positions is not None:
            positions = position_arg(positions, batch, n, axes=axes)
        start, q_pos, k_pos, key_valid = cache._begin(positions, padding_mask, batch, n)
        if getattr(cache, "static", False):  # keys: the whole buffer, unfilled slots hidden
            full_kv = True
            if key_valid is None and not kw["causal"]:  # causal masking alone does not do
                key_valid = cache.valid & (cache.slots < start + n)  # (batch, max_len)
        elif resolve_backend(kw["backend"], encoding, kw["device"]) == "flex":
            # static shapes: every slot, unfilled ones hidden
            full_kv, k_pos, key_valid = True, cache.positions, cache.valid
    return plan(encoding, q_pos, k_pos, key_valid=key_valid, cache=cache, start=start,
                full_kv=full_kv, **kw)  # fmt: skip
