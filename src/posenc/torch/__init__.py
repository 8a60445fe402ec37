"""PyTorch modules of posenc (imports torch; ``import posenc`` alone does not).

Encodings implement the hooks of :class:`PositionalEncoding` for the place where they
act in attention; :class:`MultiHeadAttention` calls them. See the architecture page.
"""

from posenc.torch.absolute import LearnedEncoding, SinusoidalEncoding
from posenc.torch.attention import MultiHeadAttention
from posenc.torch.base import NoPE, PositionalEncoding, as_positions
from posenc.torch.model import TransformerLM
from posenc.torch.pairing import half_to_interleaved, interleaved_to_half
from posenc.torch.rotary import RotaryEmbedding, apply_rope

__all__ = [
    "LearnedEncoding",
    "MultiHeadAttention",
    "NoPE",
    "PositionalEncoding",
    "RotaryEmbedding",
    "SinusoidalEncoding",
    "TransformerLM",
    "apply_rope",
    "as_positions",
    "half_to_interleaved",
    "interleaved_to_half",
]
