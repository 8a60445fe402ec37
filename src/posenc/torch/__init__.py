"""PyTorch modules of posenc (imports torch; ``import posenc`` alone does not).

Encodings implement the hooks of :class:`PositionalEncoding` for the place where they
act in attention; see the architecture page of the documentation.
"""

from posenc.torch.absolute import LearnedEncoding, SinusoidalEncoding
from posenc.torch.base import NoPE, PositionalEncoding, as_positions

__all__ = [
    "LearnedEncoding",
    "NoPE",
    "PositionalEncoding",
    "SinusoidalEncoding",
    "as_positions",
]
