"""A small pre-norm decoder-only language model for the experiments in the docs."""

from __future__ import annotations

import torch
from torch import nn

from posenc._checks import check_int
from posenc.torch.attention import MultiHeadAttention
from posenc.torch.base import PositionalEncoding, as_positions, check_encoding

__all__ = ["TransformerLM"]


class _Block(nn.Module):
    def __init__(self, dim, heads, encoding, causal):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, encoding=encoding, causal=causal)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, positions, padding_mask):  # x: (batch, seq, dim)
        x = x + self.attn(self.norm1(x), positions, padding_mask)
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Decoder-only transformer: embeddings, ``depth`` pre-norm blocks, a linear head.

    One encoding object serves the whole model: its input hook runs once on the token
    embeddings, its query/key and score hooks in every attention layer.

    Parameters
    ----------
    vocab_size : int
        Number of token ids.
    dim : int
        Model width.
    depth : int
        Number of blocks.
    heads : int
        Attention heads per block.
    encoding : PositionalEncoding
        Where and how position enters (:class:`~posenc.torch.NoPE` for none).
    max_len : int, optional
        If given, longer inputs raise :class:`ValueError`.
    causal : bool
        Causal self-attention (default) or bidirectional.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import SinusoidalEncoding, TransformerLM
    >>> _ = torch.manual_seed(0)
    >>> lm = TransformerLM(10, 16, 1, 2, encoding=SinusoidalEncoding(16, max_len=64))
    >>> lm(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 10])
    >>> lm.generate(torch.tensor([[1, 2, 3]]), 4).shape
    torch.Size([1, 7])
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        depth: int,
        heads: int,
        *,
        encoding: PositionalEncoding,
        max_len: int | None = None,
        causal: bool = True,
    ):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        check_int("depth", depth, minimum=1)
        self.max_len = None if max_len is None else check_int("max_len", max_len, minimum=1)
        self.encoding = check_encoding(encoding)
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads, encoding, causal) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for every position.

        Parameters
        ----------
        idx : torch.Tensor
            Token ids, int64 ``(batch, seq)``.
        positions : torch.Tensor, optional
            Int positions ``(seq,)`` or ``(batch, seq)``; default ``0 .. seq - 1``.
        padding_mask : torch.Tensor, optional
            Bool ``(batch, seq)``, ``True`` for real tokens.

        Returns
        -------
        torch.Tensor
            Logits, shape ``(batch, seq, vocab_size)``.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, seq), got {tuple(idx.shape)}")
        b, n = idx.shape
        if self.max_len is not None and n > self.max_len:
            raise ValueError(f"sequence length must be <= max_len={self.max_len}, got {n}")
        pos = as_positions(positions, b, n, device=idx.device)  # (b or 1, n)
        x = self.encoding.encode_input(self.embed(idx), pos)  # (b, n, dim)
        for block in self.blocks:
            x = block(x, pos, padding_mask)  # (b, n, dim)
        return self.head(self.norm(x))  # (b, n, vocab)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding: append the most likely token ``max_new_tokens`` times.

        Parameters
        ----------
        idx : torch.Tensor
            Prompt token ids, int64 ``(batch, seq)``.
        max_new_tokens : int
            How many tokens to append.

        Returns
        -------
        torch.Tensor
            Shape ``(batch, seq + max_new_tokens)``.
        """
        check_int("max_new_tokens", max_new_tokens, minimum=0)
        for _ in range(max_new_tokens):
            nxt = self(idx)[:, -1].argmax(-1, keepdim=True)  # (batch, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
