"""One model step's plan with or without a cache: positions, cache slots, then the masks.

Shared by :class:`~posenc.torch.MultiHeadAttention` and :class:`~posenc.torch.TransformerLM`:
:func:`place` gives the positions of the ``n`` new tokens (given, or continued from the
cache), the slots they take in the cache and the keys they see, once per step; then
:func:`plan_layer` plans the attention core's mask for one kind of layer (its encoding,
sliding window and chunk) from them, once per kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from posenc.torch.attention.core import Step, check_padding_mask, plan, resolve_backend
from posenc.torch.documents import check_agree, check_documents, default_positions
from posenc.torch.positions import position_arg

__all__ = ["Placed", "place", "plan_layer", "plan_step"]


@dataclass
class Placed:
    """Where one step's tokens go: positions of the new tokens and of the keys they see."""

    q_positions: object  # range or (b|1, n[, axes]) tensor
    k_positions: object  # range or (b|1, n_keys[, axes]) tensor
    start: object  # first cache slot of the step (int, or a 0-d tensor for a static cache)
    key_valid: object  # bool (batch, n_keys) or None
    cache: object  # KVCache or None
    documents: object = None  # (q_documents (b, n), k_documents (b, n_keys)) or None
    context: object = None  # context parallelism (posenc.torch.model.parallel.Context)


def place(axes, batch, n, positions, padding_mask, cache, documents=None) -> Placed:
    """Positions and cache slots of ``n`` new tokens (``axes``: coordinates per token);
    ``documents``: packed rows, positions restarting at each document unless given. Not
    given with a ``padding_mask``, they count its real tokens only (0 at each row's first,
    each document's first; with a cache, continuing each row: ``KVCache._new_positions``)."""
    if padding_mask is not None:
        check_padding_mask(padding_mask, batch, n)
    docs, given = None, positions is not None
    if documents is not None:
        docs = check_documents(documents, batch, n)
    if positions is None:  # a cache continues its rows itself, unless documents start anew
        real = padding_mask if cache is None or docs is not None else None
        positions = default_positions(real, docs, n)  # (batch, n), or None
    if positions is not None:
        positions = position_arg(positions, batch, n, axes=axes)
        if docs is not None and given:
            positions = check_agree(positions, docs)
    if cache is None:
        pos = range(n) if positions is None else positions
        return Placed(pos, pos, 0, padding_mask, None, None if docs is None else (docs, docs))
    start, q_pos, k_pos, key_valid, documents = cache._begin(
        positions, padding_mask, batch, n, documents=docs
    )
    return Placed(q_pos, k_pos, start, key_valid, cache, documents)


def plan_layer(encoding, placed: Placed, *, limits=(None, None), **kw) -> Step:
    """The attention core's plan for layers of one kind, from a step's :class:`Placed`."""
    full_kv, k_pos, key_valid, cache = False, placed.k_positions, placed.key_valid, placed.cache
    start, documents = placed.start, placed.documents
    if getattr(cache, "static", False):  # keys: the whole buffer, unfilled slots hidden
        full_kv = True
        if key_valid is None and not kw["causal"]:  # causal masking alone does not do
            key_valid = cache.valid & (cache.slots < start + len_new(placed))  # (b, max_len)
    elif cache is not None and resolve_backend(kw["backend"], encoding, kw["device"]) == "flex":
        # static shapes: every slot, unfilled ones hidden
        full_kv, k_pos, key_valid = True, cache.positions, cache.valid
        if documents is not None:
            documents = (documents[0], cache.documents)  # every slot's document
    ctx = placed.context
    order = None if ctx is None else (ctx.q_index, ctx.k_index)
    return plan(encoding, placed.q_positions, k_pos, key_valid=key_valid, cache=cache,
                start=start, full_kv=full_kv, limits=limits, documents=documents, order=order,
                context=ctx, **kw)  # fmt: skip


def len_new(placed: Placed) -> int:
    q = placed.q_positions
    return len(q) if isinstance(q, range) else q.shape[1]


def plan_step(encoding, batch, n, positions, padding_mask, cache, documents=None, **kw) -> Step:
    """:func:`place` then :func:`plan_layer`: one kind of layer (an attention module)."""
    placed = place(encoding.position_axes, batch, n, positions, padding_mask, cache, documents)
    return plan_layer(encoding, placed, **kw)
