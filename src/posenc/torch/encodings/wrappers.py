"""Encodings around an encoding: a slice of the head, a factor on the softmax scale.

Real models put pieces around their rotation that are not cos/sin: DeepSeek's multi-head
latent attention rotates only the trailing channels of a ``[no position, rotated]`` head
(:class:`ChannelSlice`) and multiplies the softmax scale by YaRN's ``mscale ** 2``
(:class:`SoftmaxFactor`). Each wrapper is itself a :class:`PositionalEncoding`, so the
attention code still calls the same hooks and never asks which encoding it holds.

Shape legend: ``q`` is ``(batch, heads, seq_q, head_dim)``, ``k`` is
``(batch, kv_heads, seq_k, head_dim)``.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from posenc._checks import check_int
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.positions import position_arg

__all__ = ["ChannelSlice", "SoftmaxFactor"]


def delegate_attribute(module, name, child):
    """``module``'s attribute ``name`` (a parameter, buffer or submodule), else the one of its
    submodule ``child``: a module standing in for another (a wrapper, posenc's stand-in for
    a transformers model's ``rotary_emb``) answers what it does not hold itself. Private
    names and ``child`` itself are never looked up in ``child``."""
    try:
        return nn.Module.__getattr__(module, name)
    except AttributeError:
        if name == child or name.startswith("_"):
            raise
        return getattr(module._modules[child], name)


class _Wrapped(PositionalEncoding):
    """Delegates every hook and attribute of the interface to ``self.inner``."""

    def __init__(self, inner):
        super().__init__()
        if not isinstance(inner, PositionalEncoding):
            raise ValueError(f"encoding must be a PositionalEncoding, got {type(inner).__name__}")
        self.inner = inner

    caches_encoded_keys = property(lambda self: self.inner.caches_encoded_keys)
    position_axes = property(lambda self: self.inner.position_axes)
    requires_causal = property(lambda self: self.inner.requires_causal)
    places = property(lambda self: self.inner.places)

    def __getattr__(self, name):  # heads, max_len, ...: what checks ask of the inner encoding
        return delegate_attribute(self, name, "inner")

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)  # hooks other than the wrapped one: the inner's

    def _qk_forward(self, q, k, positions=None):
        """Encode ``q`` and ``k`` that share positions (as RoPE's ``forward``).

        Parameters
        ----------
        q : torch.Tensor
            Queries ``(batch, heads, seq, head_dim)``.
        k : torch.Tensor
            Keys ``(batch, kv_heads, seq, head_dim)``.
        positions : torch.Tensor or range, optional
            ``(seq,)`` or ``(batch, seq)``; default ``0 .. seq - 1``.

        Returns
        -------
        tuple of torch.Tensor
            The encoded queries and keys, shapes kept.
        """
        if q.dim() != 4 or k.dim() != 4 or q.shape[2] != k.shape[2]:
            raise ValueError(
                f"q and k must be 4-D with the same seq, got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        pos = position_arg(positions, q.shape[0], q.shape[2])
        return self.encode_qk(q, k, pos, pos)

    def encode_input(self, x, positions):
        return self.inner.encode_input(x, positions)

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        return self.inner.encode_qk(q, k, q_positions, k_positions, inplace=inplace)

    def score_bias(self, q_positions, k_positions, *, out=None):
        if "out" not in inspect.signature(self.inner.score_bias).parameters:
            return self.inner.score_bias(q_positions, k_positions)  # written without out=
        return self.inner.score_bias(q_positions, k_positions, out=out)

    def score_mod(self, q_positions, k_positions):
        return self.inner.score_mod(q_positions, k_positions)

    def qk_dim(self, head_dim):
        return self.inner.qk_dim(head_dim)

    def softmax_scale(self, head_dim):
        return self.inner.softmax_scale(head_dim)

    def _materialize(self, device=None):
        self.inner._materialize(device)


class ChannelSlice(_Wrapped):
    """A query/key encoding on the channels ``start`` to ``start + width - 1`` of each head.

    The rest of the head passes through unchanged: DeepSeek-V2/V3's decoupled RoPE
    rotates the trailing ``qk_rope_head_dim`` channels of a ``[nope, rope]`` head, which is
    ``ChannelSlice(RotaryEmbedding(rope_dim, pairing="interleaved"), start=nope_dim)``.

    Parameters
    ----------
    encoding : PositionalEncoding
        A query/key encoding whose ``head_dim`` is the slice's width (RoPE, xPos, M-RoPE):
        it must keep the width of the queries and the softmax scale.
    start : int
        First channel of the slice.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import ChannelSlice, RotaryEmbedding
    >>> enc = ChannelSlice(RotaryEmbedding(4), start=6)  # heads of 10: 6 plain, 4 rotated
    >>> q = k = torch.randn(1, 2, 3, 10)
    >>> q2, k2 = enc.encode_qk(q, k, range(3), range(3))
    >>> bool((q2[..., :6] == q[..., :6]).all()), q2.shape
    (True, torch.Size([1, 2, 3, 10]))
    """

    def __init__(self, encoding, *, start):
        super().__init__(encoding)
        self.start = check_int("start", start, minimum=0)
        width = getattr(encoding, "head_dim", None)
        if set(encoding.places) - {"qk"} or width is None:
            raise ValueError(
                "encoding must be a query/key encoding with a head_dim (RoPE, xPos, M-RoPE), "
                f"got {type(encoding).__name__} acting at {encoding.places}"
            )
        if encoding.qk_dim(width) != width or (
            type(encoding).softmax_scale is not PositionalEncoding.softmax_scale
        ):
            raise ValueError(
                f"encoding must keep the width and softmax scale of the slice, "
                f"{type(encoding).__name__} changes them"
            )
        self.width = int(width)

    forward = _Wrapped._qk_forward

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        a, b = self.start, self.start + self.width
        if q.shape[-1] < b or k.shape[-1] < b:
            raise ValueError(
                f"q and k must have at least start + width = {b} channels, "
                f"got {q.shape[-1]} and {k.shape[-1]}"
            )
        qs, ks = self.inner.encode_qk(q[..., a:b], k[..., a:b], q_positions, k_positions)
        q = torch.cat([q[..., :a], qs, q[..., b:]], dim=-1)  # (b, h, sq, head_dim)
        k = torch.cat([k[..., :a], ks, k[..., b:]], dim=-1)  # (b, kvh, sk, head_dim)
        return q, k

    def softmax_scale(self, head_dim):
        """``1 / sqrt(head_dim)`` of the whole head, not of the slice.

        Parameters
        ----------
        head_dim : int
            Width of one head.

        Returns
        -------
        float
            The attention's scale.
        """
        return head_dim**-0.5

    def extra_repr(self):
        return f"start={self.start}, width={self.width}"


class SoftmaxFactor(_Wrapped):
    """The inner encoding with its softmax scale multiplied by ``factor``.

    DeepSeek's YaRN multiplies ``1 / sqrt(head_dim)`` by ``mscale(factor, mscale_all_dim)
    ** 2`` (see :func:`posenc.scaling.yarn_mscale`); other models fix the scale outright.

    Parameters
    ----------
    encoding : PositionalEncoding
        Any encoding.
    factor : float
        Positive, finite.

    Examples
    --------
    >>> from posenc.torch import NoPE, SoftmaxFactor
    >>> SoftmaxFactor(NoPE(), factor=2.0).softmax_scale(64)
    0.25
    """

    def __init__(self, encoding, *, factor):
        super().__init__(encoding)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
            math.isfinite(factor) and factor > 0
        ):  # fmt: skip
            raise ValueError(f"factor must be a positive finite number, got {factor!r}")
        self.factor = float(factor)

    def softmax_scale(self, head_dim):
        """The inner encoding's scale times ``factor``.

        Parameters
        ----------
        head_dim : int
            Width of one head.

        Returns
        -------
        float
            The attention's scale.
        """
        return self.inner.softmax_scale(head_dim) * self.factor

    def extra_repr(self):
        return f"factor={self.factor}"
