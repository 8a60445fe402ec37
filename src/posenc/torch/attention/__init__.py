"""The attention core: ``attend``, each step's mask or FlexAttention plan, the backends.

Knows position only through the hooks of :class:`~posenc.torch.PositionalEncoding`; never
special-cases an encoding. May import :mod:`posenc.torch.encodings` (the interface and its
checks) and :mod:`posenc.torch.positions`; never the caches or the model.
"""
