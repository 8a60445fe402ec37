"""The evicting cache of a model: :class:`~posenc.torch.EvictingKVCache` sized for it."""

from __future__ import annotations

from posenc.torch.cache.evicting import EvictingKVCache
from posenc.torch.model.mha import MultiHeadAttention, _cache_shape

__all__ = ["evicting_cache"]


def evicting_cache(model, batch, *, sink_tokens, window, positions="original"):
    """An empty :class:`~posenc.torch.EvictingKVCache` for ``model``, in its dtype and device.

    Parameters
    ----------
    model : TransformerLM or MultiHeadAttention
        The model (every layer) or one attention layer.
    batch : int
        Batch size of the calls that will use it.
    sink_tokens, window : int
        The first tokens kept for good, and the recent ones kept.
    positions : {"original", "cache"}
        A kept token's position: the one it was encoded at, or its slot in the cache.

    Returns
    -------
    posenc.torch.EvictingKVCache
        Pass it as ``cache=`` to the model's forward, one step at a time.

    Examples
    --------
    >>> from posenc.torch import ALiBi, TransformerLM, evicting_cache
    >>> lm = TransformerLM(10, 16, 2, 4, encoding=ALiBi(4))
    >>> evicting_cache(lm, 2, sink_tokens=4, window=60).max_len
    64
    """
    schedule = getattr(model, "schedule", None)
    if positions == "cache" and schedule is not None and schedule.input is not None:
        raise ValueError(f"positions='cache' re-encodes the cached keys at their slots, but "
                         f"{type(schedule.input).__name__} added positions to the input "
                         "embeddings, which cannot be redone: use positions='original'")  # fmt: skip
    layers = 1 if isinstance(model, MultiHeadAttention) else len(model.blocks)
    shape = _cache_shape(model, layers)
    if shape.pop("position_axes") != 1:
        raise ValueError("an evicting cache keeps positions of one axis: the model's encoding "
                         "reads grid coordinates")  # fmt: skip
    if positions == "cache":  # raw keys, encoded at their slots at every step
        shape["key_dim"] = shape["value_dim"]
    return EvictingKVCache(batch=batch, sink_tokens=sink_tokens, window=window,
                           positions=positions, **shape)  # fmt: skip
