"""One multi-head attention module for every encoding.

It calls the query/key hook and the score hook of its :class:`PositionalEncoding`
and knows nothing else about position; encodings that act on the input are applied
by the model before the first block. Shape legend: ``x`` is ``(batch, seq, dim)``;
``q, k, v`` are ``(batch, heads, seq, head_dim)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posenc._checks import check_int
from posenc.torch.base import NoPE, PositionalEncoding, as_positions, check_encoding

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with a pluggable positional encoding.

    Uses :func:`torch.nn.functional.scaled_dot_product_attention`; a score bias from
    the encoding, the causal mask and the padding mask are merged into one float
    ``attn_mask``.

    Parameters
    ----------
    dim : int
        Model width; must be divisible by ``heads``.
    heads : int
        Number of attention heads; ``head_dim = dim // heads``.
    encoding : PositionalEncoding, optional
        Supplies ``encode_qk`` and ``score_bias``; default :class:`NoPE`.
    causal : bool
        If true, query ``i`` attends to keys ``0 .. i`` only.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import MultiHeadAttention
    >>> attn = MultiHeadAttention(16, 4, causal=True)
    >>> attn(torch.randn(2, 5, 16)).shape
    torch.Size([2, 5, 16])
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        encoding: PositionalEncoding | None = None,
        causal: bool = True,
    ):
        super().__init__()
        self.dim = check_int("dim", dim, minimum=1)
        self.heads = check_int("heads", heads, minimum=1)
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads={heads}, got dim={dim}")
        self.head_dim = dim // heads
        self.encoding = NoPE() if encoding is None else check_encoding(encoding)
        self.causal = bool(causal)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend over ``x``.

        Parameters
        ----------
        x : torch.Tensor
            Input, shape ``(batch, seq, dim)``.
        positions : torch.Tensor, optional
            Int positions ``(seq,)`` or ``(batch, seq)``; default ``0 .. seq - 1``.
            Per-row positions let left-padded rows start at 0 at their first real token.
        padding_mask : torch.Tensor, optional
            Bool ``(batch, seq)``, ``True`` for real tokens. Padding keys get no weight.

        Returns
        -------
        torch.Tensor
            Shape ``(batch, seq, dim)``.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape (batch, seq, dim={self.dim}), got {tuple(x.shape)}"
            )
        b, n, _ = x.shape
        pos = as_positions(positions, b, n, device=x.device)  # (b or 1, n)
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, heads, n, head_dim) each
        q, k = self.encoding.encode_qk(q, k, pos, pos)
        mask = self._attn_mask(b, n, pos, padding_mask, x)  # None or (b|1, h|1, n, n)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal and mask is None
        )  # (b, heads, n, head_dim)
        return self.out(y.transpose(1, 2).reshape(b, n, self.dim))  # (b, n, dim)

    def _attn_mask(self, b, n, pos, padding_mask, x):
        bias = self.encoding.score_bias(pos, pos)  # None or (b|1, h|1, n, n)
        if bias is None and padding_mask is None:
            return None  # SDPA's own is_causal path
        allowed = torch.ones(n, n, dtype=torch.bool, device=x.device)
        if self.causal:
            allowed = allowed.tril()
        allowed = allowed[None, None]  # (1, 1, n, n)
        if padding_mask is not None:
            if padding_mask.shape != (b, n) or padding_mask.dtype != torch.bool:
                raise ValueError(
                    f"padding_mask must be a bool tensor of shape ({b}, {n}), "
                    f"got {padding_mask.dtype} {tuple(padding_mask.shape)}"
                )
            allowed = allowed & padding_mask[:, None, None, :]  # (b, 1, n, n)
            # a padding query may have no real key to its left: let it see itself
            allowed = allowed | torch.eye(n, dtype=torch.bool, device=x.device)
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~allowed, float("-inf"))
        return mask if bias is None else mask + bias.to(x.dtype)
