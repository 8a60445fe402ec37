"""The one interface every torch encoding implements: hooks at the places position enters.

Attention has three places where position can enter, and an encoding overrides the
hook for the place where it acts (and only that one):

========================  =====================================  ==========================
place                     hook                                   examples
========================  =====================================  ==========================
the input                 ``encode_input(x, positions)``         sinusoidal, learned
the queries and keys      ``encode_qk(q, k, q_pos, k_pos)``      RoPE
the scores                ``score_bias(q_pos, k_pos)``           ALiBi, T5 buckets
========================  =====================================  ==========================

Shape legend: ``x`` is ``(batch, seq, dim)``; ``q`` and ``k`` are
``(batch, heads, seq, head_dim)``; positions are int64 ``(batch, seq)`` (or
``(1, seq)`` when shared by the batch).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PositionalEncoding", "NoPE", "as_positions"]

PLACES = ("input", "qk", "scores")


class PositionalEncoding(nn.Module):
    """Base class: subclasses override the hook(s) of the place(s) where they act.

    The defaults do nothing, so an encoding that acts only on the input never
    touches queries, keys or scores. :attr:`places` reports which hooks a subclass
    overrides; the attention module calls the query/key and
    score hooks, the model calls the input hook once before its first block.
    """

    def __init__(self) -> None:
        super().__init__()

    def encode_input(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Add position to token embeddings (default: return ``x`` unchanged).

        Parameters
        ----------
        x : torch.Tensor
            Embeddings, shape ``(batch, seq, dim)``.
        positions : torch.Tensor
            Int64 positions, shape ``(batch, seq)`` or ``(1, seq)``.

        Returns
        -------
        torch.Tensor
            Same shape and dtype as ``x``.
        """
        return x

    def encode_qk(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform queries and keys by their positions (default: unchanged).

        Parameters
        ----------
        q : torch.Tensor
            Queries, shape ``(batch, heads, seq_q, head_dim)``.
        k : torch.Tensor
            Keys, shape ``(batch, heads, seq_k, head_dim)``.
        q_positions : torch.Tensor
            Int64 positions of the queries, ``(batch, seq_q)`` or ``(1, seq_q)``.
        k_positions : torch.Tensor
            Int64 positions of the keys, ``(batch, seq_k)`` or ``(1, seq_k)``.

        Returns
        -------
        q : torch.Tensor
            Same shape and dtype as the input ``q``.
        k : torch.Tensor
            Same shape and dtype as the input ``k``.
        """
        return q, k

    def score_bias(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> torch.Tensor | None:
        """Bias added to the scaled scores before the softmax (default: none).

        Parameters
        ----------
        q_positions : torch.Tensor
            Int64 positions of the queries, ``(batch, seq_q)`` or ``(1, seq_q)``.
        k_positions : torch.Tensor
            Int64 positions of the keys, ``(batch, seq_k)`` or ``(1, seq_k)``.

        Returns
        -------
        torch.Tensor or None
            Float bias broadcastable to ``(batch, heads, seq_q, seq_k)``, or ``None``.
        """
        return None

    @property
    def places(self) -> tuple[str, ...]:
        """The places (``"input"``, ``"qk"``, ``"scores"``) whose hooks this class overrides."""
        hooks = ("encode_input", "encode_qk", "score_bias")
        cls = type(self)
        return tuple(
            place
            for place, hook in zip(PLACES, hooks, strict=True)
            if getattr(cls, hook) is not getattr(PositionalEncoding, hook)
        )


class NoPE(PositionalEncoding):
    """No positional encoding: every hook is the default no-op.

    Without a causal mask, attention is then permutation-equivariant; with one,

    a decoder can still infer order from the mask itself (Haviv et al., 2022;
    Kazemnejad et al., 2023).

    Examples
    --------
    >>> from posenc.torch import NoPE
    >>> NoPE().places
    ()
    """


def as_positions(
    positions: torch.Tensor | None, batch: int, seq: int, *, device=None
) -> torch.Tensor:
    """Validate positions and return them as an int64 tensor of shape (batch or 1, seq).

    ``None`` means ``0 .. seq - 1`` shared by the batch. A 1-D tensor of length
    ``seq`` is shared by the batch; a 2-D tensor must be ``(batch, seq)``.

    Parameters
    ----------
    positions : torch.Tensor or None
        Int positions, ``(seq,)`` or ``(batch, seq)``; values must be non-negative.
    batch : int
        Batch size of the tensor the positions belong to.
    seq : int
        Sequence length of that tensor.
    device : torch.device, optional
        Where to put the result.

    Returns
    -------
    torch.Tensor
        Int64, shape ``(batch, seq)`` or ``(1, seq)``.

    Raises
    ------
    ValueError
        If the shape does not match, the dtype is not an integer type, or a
        position is negative.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import as_positions
    >>> as_positions(None, 2, 3)
    tensor([[0, 1, 2]])
    >>> as_positions(torch.tensor([[5, 6, 7], [0, 1, 2]]), 2, 3).shape
    torch.Size([2, 3])
    """
    if positions is None:
        return torch.arange(seq, device=device).unsqueeze(0)  # (1, seq)
    if not isinstance(positions, torch.Tensor):
        positions = torch.as_tensor(positions)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)  # (1, seq)
    if positions.dim() != 2 or positions.shape[1] != seq or positions.shape[0] not in (1, batch):
        raise ValueError(
            f"positions must have shape (seq,) or (batch, seq) = ({batch}, {seq}), "
            f"got {tuple(positions.shape)}"
        )
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be non-negative, got {int(positions.min())}")
    return positions.to(device=device, dtype=torch.long)


def check_encoding(encoding) -> PositionalEncoding:
    """Return ``encoding`` if it is a :class:`PositionalEncoding`, else raise ``ValueError``."""
    if not isinstance(encoding, PositionalEncoding):
        raise ValueError(f"encoding must be a PositionalEncoding, got {type(encoding).__name__}")
    return encoding
