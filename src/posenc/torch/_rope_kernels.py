"""Moved to :mod:`posenc.torch.kernels`; these names stay importable from here."""

from posenc.torch.kernels import needs_expr, rotate, rotate_qk
from posenc.torch.kernels.rope_eager import check_out, cos_sin

__all__ = ["check_out", "cos_sin", "needs_expr", "rotate", "rotate_qk"]
