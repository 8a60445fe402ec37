"""PyTorch modules of posenc (imports torch; ``import posenc`` alone does not).

Encodings implement the hooks of :class:`PositionalEncoding` for the place where they
act in attention; :func:`attend` and :class:`MultiHeadAttention` call them. See the
architecture page.
"""

from posenc.torch.absolute import LearnedEncoding, SinusoidalEncoding
from posenc.torch.absolute_2d import SinusoidalEncoding2D
from posenc.torch.attention import attend, attention_mask
from posenc.torch.base import NoPE, PositionalEncoding
from posenc.torch.bias import ALiBi, T5RelativeBias
from posenc.torch.cache import KVCache
from posenc.torch.learned_bias import FIRE, KERPLE
from posenc.torch.mha import MultiHeadAttention
from posenc.torch.model import TransformerLM
from posenc.torch.pairing import half_to_interleaved, interleaved_to_half
from posenc.torch.pope import PoPE
from posenc.torch.positions import as_positions, position_tensor
from posenc.torch.rotary import RotaryEmbedding, apply_rope
from posenc.torch.rotary_nd import AxialRotaryEmbedding, MRoPE
from posenc.torch.static_cache import StaticKVCache
from posenc.torch.xpos import XPos

__all__ = [
    "ALiBi",
    "AxialRotaryEmbedding",
    "FIRE",
    "KERPLE",
    "T5RelativeBias",
    "KVCache",
    "LearnedEncoding",
    "MRoPE",
    "MultiHeadAttention",
    "NoPE",
    "PoPE",
    "PositionalEncoding",
    "RotaryEmbedding",
    "SinusoidalEncoding",
    "SinusoidalEncoding2D",
    "StaticKVCache",
    "TransformerLM",
    "XPos",
    "apply_rope",
    "as_positions",
    "attend",
    "attention_mask",
    "half_to_interleaved",
    "interleaved_to_half",
    "position_tensor",
]
