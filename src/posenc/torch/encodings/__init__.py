"""The encodings, by the place where they act: ``input``, ``qk`` (queries and keys), ``scores``.

Every encoding implements the hooks of :class:`~posenc.torch.PositionalEncoding`
(``base``) for its place, and its formula is the NumPy reference of the same name under
:mod:`posenc.encodings`. May import :mod:`posenc.torch.positions`, :mod:`posenc.torch.kernels`
and the NumPy side of posenc; never the attention core, the caches or the model above it.
"""
