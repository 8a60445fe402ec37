"""PyTorch modules of posenc (imports torch; ``import posenc`` alone does not).

The subpackages are the layers, each importing only the ones below it::

    model/        MultiHeadAttention, TransformerLM
    cache/        KVCache, StaticKVCache, EvictingKVCache, the planning of a cached step
    attention/    attend, the mask or FlexAttention plan, the backends
    encodings/    PositionalEncoding and the encodings: input/, qk/, scores/
    kernels/      the rotation kernels (eager CPU, Triton) and their dispatch
    positions     positions as hooks receive them (shared by every layer)
    documents     packed rows: document ids, their positions, cu_seqlens

Every public name is importable from here. See the architecture page.
"""

from posenc.torch import kernels  # noqa: F401  (posenc.torch.kernels.use, .TABLE)
from posenc.torch.attention.core import attend
from posenc.torch.attention.mask import attention_mask
from posenc.torch.cache.evicting import EvictingKVCache
from posenc.torch.cache.kv import KVCache
from posenc.torch.cache.static import StaticKVCache
from posenc.torch.documents import (
    cu_seqlens_from_documents,
    documents_from_cu_seqlens,
    documents_from_positions,
    positions_from_documents,
)
from posenc.torch.encodings.base import NoPE, PositionalEncoding
from posenc.torch.encodings.input.absolute import LearnedEncoding, SinusoidalEncoding
from posenc.torch.encodings.input.sinusoidal_2d import SinusoidalEncoding2D
from posenc.torch.encodings.qk.pairing import half_to_interleaved, interleaved_to_half
from posenc.torch.encodings.qk.pope import PoPE
from posenc.torch.encodings.qk.rope import RotaryEmbedding
from posenc.torch.encodings.qk.rope_apply import apply_rope
from posenc.torch.encodings.qk.rope_nd import AxialRotaryEmbedding, MRoPE
from posenc.torch.encodings.qk.temperature import QueryTemperature
from posenc.torch.encodings.qk.xpos import XPos
from posenc.torch.encodings.scores.bias import ALiBi, T5RelativeBias
from posenc.torch.encodings.scores.learned_bias import FIRE, KERPLE
from posenc.torch.encodings.wrappers import ChannelSlice, SoftmaxFactor
from posenc.torch.model.evicting import evicting_cache
from posenc.torch.model.lm import TransformerLM
from posenc.torch.model.mha import MultiHeadAttention
from posenc.torch.model.parallel import causal_work, context_parallel_forward, shard_index
from posenc.torch.model.schedule import Layer, Schedule
from posenc.torch.positions import as_positions, position_tensor

__all__ = [
    "ALiBi",
    "AxialRotaryEmbedding",
    "ChannelSlice",
    "EvictingKVCache",
    "FIRE",
    "KERPLE",
    "T5RelativeBias",
    "KVCache",
    "Layer",
    "LearnedEncoding",
    "MRoPE",
    "MultiHeadAttention",
    "NoPE",
    "PoPE",
    "PositionalEncoding",
    "QueryTemperature",
    "RotaryEmbedding",
    "Schedule",
    "SinusoidalEncoding",
    "SinusoidalEncoding2D",
    "SoftmaxFactor",
    "StaticKVCache",
    "TransformerLM",
    "XPos",
    "apply_rope",
    "as_positions",
    "attend",
    "causal_work",
    "evicting_cache",
    "context_parallel_forward",
    "attention_mask",
    "cu_seqlens_from_documents",
    "documents_from_cu_seqlens",
    "documents_from_positions",
    "half_to_interleaved",
    "interleaved_to_half",
    "position_tensor",
    "positions_from_documents",
    "shard_index",
]
