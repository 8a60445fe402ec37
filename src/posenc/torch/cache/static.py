"""A KV cache whose shapes never change between steps, for compiled decoding and CUDA graphs.

:class:`StaticKVCache` keeps the number of filled slots in a 0-d int64 *tensor*, writes
each step's keys and values by index at that position, and lets attention run over the
whole preallocated buffer with the unfilled slots masked out. Nothing a compiled graph
depends on changes between decode steps (no Python int grows, no shape changes), so
``torch.compile(lm, fullgraph=True)`` compiles the prefill and the decode step once each
and replays them. Shape legend as in :mod:`posenc.torch.cache.kv`.
"""

from __future__ import annotations

import torch

from posenc.torch.cache.kv import KVCache
from posenc.torch.position_values import (
    bounds,
    carry_bounds,
    checked_positions,
    joined,
    known_bounds,
    remember_bounds,
)

__all__ = ["StaticKVCache"]


class StaticKVCache(KVCache):
    """A :class:`~posenc.torch.KVCache` with a tensor length: one compiled graph per step kind.

    Same buffers and arguments as :class:`~posenc.torch.KVCache`; build one with
    ``lm.new_cache(batch, max_len, static=True)``. Every step writes its keys and values at
    slots ``length .. length + n - 1`` (an index tensor), and attention covers all
    ``max_len`` slots, the unfilled ones hidden by the mask (built from tensors). The
    buffers are marked as static addresses for CUDA graphs.

    Parameters
    ----------
    **kwargs
        As :class:`~posenc.torch.KVCache`.

    Attributes
    ----------
    filled : torch.Tensor
        0-d int64: the number of filled slots (``len(cache)`` reads it, in eager mode).

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import ALiBi, TransformerLM
    >>> _ = torch.manual_seed(0)
    >>> lm = TransformerLM(10, 16, 2, 4, encoding=ALiBi(4)).eval()
    >>> cache = lm.new_cache(1, max_len=8, static=True)
    >>> step = lm  # or torch.compile(lm, fullgraph=True): prefill and decode compile once each
    >>> with torch.no_grad():
    ...     logits = step(torch.tensor([[1, 2, 3]]), cache=cache)
    ...     logits = step(logits[:, -1:].argmax(-1), cache=cache)
    >>> len(cache), cache.filled, cache.keys[0].shape  # the buffers keep their shape
    (4, tensor(4), torch.Size([1, 4, 8, 4]))
    """

    static = True

    def __init__(self, **kwargs):
        device = kwargs.get("device")
        self.filled = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.arange(kwargs["max_len"], device=device)  # (max_len,)
        super().__init__(**kwargs)
        for t in (*self.keys, *self.values, self.positions, self.valid, self.filled,
                  self.next_position):  # fmt: skip
            torch._dynamo.mark_static_address(t)

    def reset(self) -> None:
        """Empty the cache (the buffers are kept, in place)."""
        super().reset()
        remember_bounds(self.filled.zero_(), 0, 0)
        self.per_row = False  # were positions or padding ever given (rows may differ)?

    @property
    def length(self) -> int:
        """Number of filled slots (eager mode: known on the host, else read once)."""
        known = known_bounds(self.filled)
        return known[0] if known is not None else bounds(self.filled)[0]

    @length.setter
    def length(self, value) -> None:  # KVCache.reset assigns 0
        if value != 0:
            raise ValueError(f"a StaticKVCache's length is its tensor 'filled', got {value}")

    def _keep_positions(self, positions):
        """Replace the stored positions (a first grid step widened them): a static address."""
        self.positions = positions
        torch._dynamo.mark_static_address(positions)

    def _slots(self, n):
        """Slots ``filled .. filled + n - 1`` of ``n`` new tokens, checked against ``max_len``.

        Eager: the count is known on the host (or read once), so the slots and their bounds
        are too, and a full cache raises ``ValueError``. Compiled: the check is the checking
        op on the slots, which every write depends on, so it runs before them (on CUDA an
        assert on the device: no sync, and no write past the buffer).
        """
        start = self.filled
        if torch.compiler.is_compiling():
            slots = start + torch.arange(n, device=start.device)  # (n,)
            why = f"; the StaticKVCache is full (adding {n})"
            return checked_positions(slots, 0, self.max_len, "cache slots", "max_len", why)
        have = self.length  # a host int: remembered after each eager step
        if have + n > self.max_len:
            raise ValueError(
                f"cache is full: max_len={self.max_len}, holds {have} tokens, got {n} more"
            )
        slots = torch.arange(have, have + n, device=start.device)  # (n,)
        return remember_bounds(slots, have, have + n - 1)

    def _begin(self, positions, padding_mask, batch, n, documents=None):
        """Record ``n`` new tokens at slots ``filled .. filled + n - 1`` (not yet counted).

        Returns ``(start, q_positions, k_positions, key_valid, None)`` like
        :meth:`KVCache._begin`, but over the whole buffer: ``start`` is a 0-d tensor,
        ``k_positions`` covers every slot (``(1, max_len)`` while the rows share their
        positions), and ``key_valid`` hides the unfilled slots (``None`` while the causal
        mask alone does, i.e. causal attention over shared positions without padding).
        """
        self._check_batch(batch)
        if documents is not None:
            raise ValueError(
                "documents are not supported with a StaticKVCache: use a KVCache for a "
                "packed prefill"
            )
        start = self.filled
        stop = start + n
        new = self._slots(n)  # (n,)
        if positions is not None or padding_mask is not None:
            self.per_row = True
        default = None if self.per_row else carry_bounds(new, new[None])  # position == slot
        stored = known_bounds(self.positions)  # before this step writes into them
        q_pos = self._new_positions(positions, batch, n, default, padding_mask)
        if isinstance(q_pos, range):
            q_pos = carry_bounds(
                q_pos, torch.arange(q_pos.start, q_pos.stop, device=new.device)[None]
            )
        q_pos = carry_bounds(q_pos, q_pos.to(self.positions.device))  # (b|1, n[, n_axes])
        self.positions.index_copy_(1, new, q_pos.expand(batch, *q_pos.shape[1:]))
        real = torch.ones(batch, n, dtype=torch.bool, device=self.valid.device)
        mask = real if padding_mask is None else padding_mask.to(self.valid.device)
        self.valid.index_copy_(1, new, mask)  # (batch, max_len)
        self._pending = (n, *self._next_after(q_pos), known_bounds(new))
        hi = joined(stored, known_bounds(q_pos))
        remember_bounds(self.positions, 0, hi)  # what the host knows of every stored position
        if self.per_row:
            k_pos, key_valid = self.positions, self.valid & (self.slots < stop)  # (b, max_len)
        else:  # (1, max_len): causal hides the rest
            k_pos, key_valid = remember_bounds(self.positions[:1], 0, hi), None
        self._new_slots = new
        return start, q_pos, k_pos, key_valid, None

    def _commit(self):
        """The step finished: count its tokens."""
        if self._pending is not None:
            n, nxt, hi, slots = self._pending
            remember_bounds(self.next_position.copy_(nxt.expand_as(self.next_position)), 0, hi)
            filled = None if slots is None else slots[1] + 1  # the count, known on the host
            remember_bounds(self.filled.add_(n), filled, filled)
        self._pending = None

    def _rollback(self):
        """Undo an uncommitted ``_begin``: its slots are unfilled again."""
        if getattr(self, "_pending", None) is None:
            return
        unfilled = self.slots >= self.filled  # (max_len,)
        self.valid.masked_fill_(unfilled, False)
        self.positions.masked_fill_(unfilled.view(-1, *(1,) * (self.positions.dim() - 2)), 0)
        self._pending = None

    def _store(self, layer, start, k, v, full=True):
        """Write ``k``, ``v`` ``(batch, kv_heads, n, ·)`` at the step's slots; return the
        whole buffers ``(batch, kv_heads, max_len, ·)``."""
        keys, values = self.keys[layer], self.values[layer]
        self._check_kv(k, keys)
        keys.index_copy_(2, self._new_slots, k.to(keys.dtype))
        values.index_copy_(2, self._new_slots, v.to(values.dtype))
        return keys, values  # (batch, kv_heads, max_len, ·)
