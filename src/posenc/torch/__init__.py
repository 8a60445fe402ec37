"""PyTorch modules of posenc (imports torch; ``import posenc`` alone does not).

Encodings implement the hooks of :class:`PositionalEncoding` for the place where they
act in attention; :class:`MultiHeadAttention` calls them. See the architecture page.
"""

from posenc.torch.absolute import LearnedEncoding, SinusoidalEncoding
from posenc.torch.attention import MultiHeadAttention
from posenc.torch.base import NoPE, PositionalEncoding, as_positions
from posenc.torch.model import TransformerLM

__all__ = [
    "LearnedEncoding",
    "MultiHeadAttention",
    "NoPE",
    "PositionalEncoding",
    "SinusoidalEncoding",
    "TransformerLM",
    "as_positions",
]
