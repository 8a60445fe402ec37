"""A KV cache that evicts (StreamingLLM): the first tokens kept as sinks, then a recent window.

Xiao et al. (2024) decode far past a model's training length by keeping, of every token
seen, the first ``sink_tokens`` (where softmax attention piles the weight it must put
somewhere) and the last ``window``; everything between is dropped. Which position a kept
token has is a convention, a parameter here:

* ``positions="original"``: each token keeps the position it was encoded at; the queries
  go on counting (``0, 1, 2, ...`` over the whole text). Keys are cached as encoded.
* ``positions="cache"``: positions are slots in the cache, ``0 .. len(cache) - 1``, the
  query after the last (StreamingLLM's): the cache keeps raw keys and every step encodes
  them at their slots, so no position ever exceeds ``sink_tokens + window``.

Shape legend as in :mod:`posenc.torch.cache.kv`.
"""

from __future__ import annotations

import torch

from posenc._checks import check_int
from posenc.torch.cache.kv import KVCache
from posenc.torch.position_values import known_bounds, remember_bounds

__all__ = ["EvictingKVCache"]

CONVENTIONS = ("original", "cache")


class EvictingKVCache(KVCache):
    """A :class:`~posenc.torch.KVCache` that holds ``sink_tokens + window`` tokens at most.

    Before a step that would overflow it, the oldest tokens after the first
    ``sink_tokens`` are dropped from every layer. Build one for a model with
    :func:`~posenc.torch.evicting_cache`.

    Parameters
    ----------
    sink_tokens : int
        The first tokens, never evicted (0: a plain sliding window of tokens).
    window : int
        The most recent tokens kept.
    positions : {"original", "cache"}
        The position of a kept token: the one it was encoded at, or its slot in the cache
        (keys re-encoded every step; the model's encoding sees only ``0 ..
        sink_tokens + window - 1``).
    **kwargs
        The sizes of :class:`~posenc.torch.KVCache` except ``max_len``
        (``sink_tokens + window``) and ``position_axes`` (1).

    Attributes
    ----------
    evicted : int
        Tokens dropped so far.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import RotaryEmbedding, TransformerLM, evicting_cache
    >>> lm = TransformerLM(10, 16, 2, 4, encoding=RotaryEmbedding(4, max_len=64)).eval()
    >>> cache = evicting_cache(lm, 1, sink_tokens=2, window=4, positions="cache")
    >>> with torch.no_grad():
    ...     for token in range(10):
    ...         logits = lm(torch.tensor([[token]]), cache=cache)
    >>> len(cache), cache.evicted, cache.positions[0, :len(cache)].tolist()
    (6, 4, [0, 1, 2, 3, 4, 5])
    """

    def __init__(self, *, sink_tokens, window, positions="original", **kwargs):
        self.sink_tokens = check_int("sink_tokens", sink_tokens, minimum=0)
        self.window = check_int("window", window, minimum=1)
        if positions not in CONVENTIONS:
            raise ValueError(f"positions must be one of {CONVENTIONS}, got {positions!r}")
        for name in ("max_len", "position_axes"):
            if name in kwargs:
                raise ValueError(f"{name} is the evicting cache's own (sink_tokens + window; "
                                 f"1), got {name}={kwargs[name]!r}")  # fmt: skip
        self.convention = positions
        self.keeps_raw_keys = positions == "cache"  # encoded anew at their slots each step
        super().__init__(max_len=self.sink_tokens + self.window, **kwargs)

    def reset(self) -> None:
        """Empty the cache (the buffers are kept)."""
        super().reset()
        self.evicted = 0
        self._undo = None  # what the step's eviction dropped, until the step commits

    def _check_for(self, *, key_dim, value_dim, **kw):
        # raw keys are head_dim wide whatever width the encoding gives encoded ones
        super()._check_for(key_dim=value_dim if self.keeps_raw_keys else key_dim,
                           value_dim=value_dim, **kw)  # fmt: skip

    def _begin(self, positions, padding_mask, batch, n, documents=None):
        if padding_mask is not None or documents is not None:
            what = "padding_mask" if padding_mask is not None else "documents"
            raise ValueError(f"EvictingKVCache takes no {what}: its sinks are each row's "
                             "first tokens, which padding or packing would make differ")  # fmt: skip
        if positions is not None and self.convention == "cache":
            raise ValueError("positions must not be given with positions='cache': the slots "
                             "in the cache are the positions")  # fmt: skip
        over = self.length + n - self.max_len
        if over > max(self.length - self.sink_tokens, 0):
            raise ValueError(
                f"a step of {n} tokens does not fit: the cache keeps {self.sink_tokens} sink "
                f"tokens and a window of {self.window}, and holds {self.length} (a step may "
                "evict older tokens only, never its own)"
            )
        if over > 0:
            self._evict(over)
        return super()._begin(positions, None, batch, n)

    def _commit(self):
        super()._commit()
        self._undo = None

    def _rollback(self):
        """Undo a step that raised, its eviction too: the cache is as it was before it."""
        super()._rollback()
        undo, self._undo = self._undo, None
        if undo is None:
            return
        m, dropped, positions, nxt, contiguous, bounds = undo
        s, end = self.sink_tokens, self.length + m
        for buf, old in zip((*self.keys, *self.values), dropped, strict=True):
            buf[:, :, s + m : end] = buf[:, :, s : end - m].clone()  # back in place
            buf[:, :, s : s + m] = old
        self.positions.copy_(positions)
        self.next_position.copy_(nxt)
        self.valid[:, :end] = True
        self.length, self.evicted, self.contiguous = end, self.evicted - m, contiguous
        for t, known in zip((self.positions, self.next_position), bounds, strict=True):
            if known is not None:
                remember_bounds(t, *known)

    def _evict(self, m):
        """Drop the ``m`` oldest tokens after the sinks from every layer, keeping the order
        (and what is dropped, until the step commits)."""
        s, end = self.sink_tokens, self.length
        known = known_bounds(self.positions)  # the kept ones are some of them
        self._undo = (m, [buf[:, :, s : s + m].clone() for buf in (*self.keys, *self.values)],
                      self.positions.clone(), self.next_position.clone(), self.contiguous,
                      (known, known_bounds(self.next_position)))  # fmt: skip
        for buf in (*self.keys, *self.values):
            buf[:, :, s : end - m] = buf[:, :, s + m : end].clone()  # (b, kvh, kept, ·)
        self.positions[:, s : end - m] = self.positions[:, s + m : end].clone()
        self.valid[:, end - m : end] = False
        self.length, self.evicted = end - m, self.evicted + m
        if self.convention == "cache":  # the slots are the positions: 0 .. length - 1 again
            kept = torch.arange(self.length, device=self.positions.device)
            self.positions.zero_()[:, : self.length] = kept
            remember_bounds(self.positions, 0, max(self.length - 1, 0))
            remember_bounds(self.next_position.fill_(self.length), self.length, self.length)
        else:  # positions keep counting: no longer the slots
            self.contiguous = False
            if known is not None:
                remember_bounds(self.positions, *known)
