"""Query temperature (Llama 4's layers without RoPE, Ministral 3): queries scaled by position.

The factor is :func:`posenc.query_temperature`'s ``1 + s ln(1 + floor((p + c) / f))``;
the NumPy function is the reference this module is tested against.

Shape legend: ``q`` is ``(batch, heads, seq_q, head_dim)``, ``k`` is
``(batch, kv_heads, seq_k, head_dim)``.
"""

from __future__ import annotations

import math

import torch

from posenc._checks import check_positive
from posenc.torch.encodings.base import NoPE
from posenc.torch.encodings.checks import check_hook
from posenc.torch.encodings.wrappers import _Wrapped
from posenc.torch.positions import position_tensor

__all__ = ["QueryTemperature"]


class QueryTemperature(_Wrapped):
    """Queries multiplied by ``1 + scale * ln(1 + floor((p + shift) / floor))`` after
    ``encoding``'s own query/key hook; keys unchanged.

    Parameters
    ----------
    encoding : PositionalEncoding, optional
        The layer's encoding on a line (default :class:`~posenc.torch.NoPE`: Llama 4's
        layers without RoPE; a RoPE for Ministral 3).
    scale : float
        Finite; 0 switches the temperature off.
    floor : float
        Positive: the run of positions that share one factor.
    shift : int
        Non-negative offset added to the position (1 in Llama 4, 0 in Ministral 3).

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import QueryTemperature
    >>> enc = QueryTemperature(scale=0.5, floor=2)
    >>> q = k = torch.ones(1, 1, 5, 2)
    >>> enc.encode_qk(q, k, range(5), range(5))[0][0, 0, :, 0]
    tensor([1.0000, 1.0000, 1.3466, 1.3466, 1.5493])
    """

    def __init__(self, encoding=None, *, scale, floor, shift=0):
        super().__init__(NoPE() if encoding is None else encoding)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(
            scale
        ):  # fmt: skip
            raise ValueError(f"scale must be a finite number, got {scale!r}")
        self.scale, self.floor = float(scale), check_positive("floor", floor)
        if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
            raise ValueError(f"shift must be an int >= 0, got {shift!r}")
        self.shift = shift
        if self.inner.position_axes != 1:
            raise ValueError(
                f"encoding must read positions on a line, {type(encoding).__name__} reads "
                f"{self.inner.position_axes} coordinates"
            )

    forward = _Wrapped._qk_forward

    @property
    def places(self):
        return tuple(p for p in ("input", "qk", "scores") if p == "qk" or p in self.inner.places)

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        check_hook(q, k, q_positions, k_positions, head_dim=q.shape[-1])
        q, k = self.inner.encode_qk(q, k, q_positions, k_positions, inplace=inplace)
        p = position_tensor(q_positions, q.device).to(self.work_dtype)  # (b|1, sq)
        tau = 1 + self.scale * torch.log1p(torch.floor((p + self.shift) / self.floor))
        return q * tau[:, None, :, None].to(q.dtype), k  # (b, h, sq, hd)

    def extra_repr(self):
        return f"scale={self.scale}, floor={self.floor}, shift={self.shift}"
