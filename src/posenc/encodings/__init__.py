"""The NumPy reference formulas, by the place where an encoding acts: ``input``, ``qk``, ``scores``.

Each formula has a torch module of the same name under :mod:`posenc.torch.encodings`
(``posenc.encodings.qk.rope`` <-> ``posenc.torch.encodings.qk.rope``). Imports NumPy and
:mod:`posenc.scaling` only; the public names are re-exported by :mod:`posenc`.
"""
