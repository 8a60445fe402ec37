"""KV caches for decoding (growing and static) and the planning of a step with one.

Both caches share one position path, so both take every kind of position (1-D, per row,
grid coordinates). May import the attention core, :mod:`posenc.torch.positions` and the
encodings' interface; never the model.
"""
