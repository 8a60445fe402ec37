"""What of a scheme a transformers model can take, and which way (used by :func:`~.bind.use`).

Each layer's encoding is read without what HF's attention applies itself (its softmax
scale, Llama 4's temperature: :func:`positional`); :func:`rotary_fit` says whether HF's own
attention can apply the scheme (RoPE of the model's width, pairing and limits, one per
layer type); :func:`check_attention_layer` refuses what posenc's attention cannot stand in
for; :func:`cache_limits` reads how many keys transformers' cache keeps per layer.
"""

from __future__ import annotations

from posenc.hf.schedule import SINKS
from posenc.torch.encodings.base import NoPE
from posenc.torch.encodings.qk.rope import RotaryEmbedding
from posenc.torch.encodings.qk.rope_nd import MRoPE
from posenc.torch.encodings.qk.temperature import QueryTemperature
from posenc.torch.encodings.wrappers import ChannelSlice, SoftmaxFactor
from posenc.torch.hf import rotary
from posenc.torch.hf.export import peel

__all__ = ["positional", "rotary_fit", "check_attention_layer", "cache_limits", "per_type"]

# model types whose attention module multiplies the queries by a temperature itself
# (Llama4TextAttention on its NoPE layers; Ministral 3's and Mistral 4's llama_4_scaling_beta)
OWN_TEMPERATURE = frozenset(("llama4", "llama4_text", "ministral3", "mistral4"))


def positional(enc, own, i, model_type):
    """``(encoding, factor)``: the layer's encoding without what HF's attention applies
    itself, and the softmax factor the scheme asks for (``None``: the model's own scale).

    An outer :class:`SoftmaxFactor` sets the layer's factor on ``1 / sqrt(head_dim)`` in
    place of the model's (Gemma's ``query_pre_attn_scalar``): ``Schedule.from_hf``'s equals
    the model's. Llama 4's and Ministral 3's query temperature is applied by HF's attention
    module whatever the scheme: the layer must carry the model's own (then taken as it)."""
    factor = None
    while isinstance(enc, SoftmaxFactor):
        factor, enc = (factor or 1.0) * enc.factor, enc.inner
    if enc is None or type(enc) is NoPE:
        return None, factor
    theirs = own[i].encoding if own is not None and own[i].attention else None
    while isinstance(theirs, SoftmaxFactor):
        theirs = theirs.inner
    if model_type in OWN_TEMPERATURE:
        own_t = theirs if isinstance(theirs, QueryTemperature) else None
        mine_t = enc if isinstance(enc, QueryTemperature) else None
        if own_t is not None and (mine_t is None or peel(mine_t)[0][0] != peel(own_t)[0][0]):
            raise ValueError(f"layer {i}: {model_type}'s attention multiplies the queries by "
                             "its own temperature, which posenc cannot remove; give the "
                             "layer that QueryTemperature (Schedule.from_hf's)")  # fmt: skip
        if mine_t is not None and own_t is not None:
            enc = enc.inner
    return (None if type(enc) is NoPE else enc), factor


def rotary_fit(mine, own, config, modules):
    """``{layer_type: (RotaryEmbedding, the model's own)}`` where HF's attention can apply the
    scheme, else None; ``(None, own)`` for a layer type whose scheme is the model's own M-RoPE
    (kept: its multi-axis positions reach the model's rotary only). ``mine`` and ``own`` hold per layer ``(encoding, factor, limits)``
    (:func:`positional`); a factor must be the model's own (HF applies its scale)."""
    if own is None:
        return None
    types = list(getattr(config, "layer_types", None) or [None] * len(mine))
    ropes = {}
    for i, ((enc, factor, limits), (theirs, own_factor, own_limits)) in enumerate(
        zip(mine, own, strict=True)
    ):  # fmt: skip
        if modules[i] is None:
            continue
        if limits != own_limits or (enc is None) != (theirs is None):
            return None
        if factor is not None and abs(factor - (own_factor or 1.0)) > 1e-12 * factor:
            return None  # another softmax scale than HF's: posenc's attention applies it
        if enc is None:
            continue
        (wrap, rope), (own_wrap, own_rope) = peel(enc), peel(theirs)
        key = types[i] if per_type(config) else None
        if type(rope) is MRoPE and type(own_rope) is MRoPE:  # kept only as the model's own
            if wrap != own_wrap or _mrope(rope) != _mrope(own_rope):
                return None
            if ropes.setdefault(key, (None, own_rope))[0] is not None:
                return None
            continue
        if type(rope) is not RotaryEmbedding or type(own_rope) is not RotaryEmbedding:
            return None
        if wrap != own_wrap or (rope.head_dim, rope.rotary_dim, rope.pairing) != (
            own_rope.head_dim, own_rope.rotary_dim, own_rope.pairing
        ):  # fmt: skip
            return None
        if ropes.setdefault(key, (rope, own_rope))[0] is not rope:
            return None  # layers of one type with different RoPEs: HF has one per type
    return ropes or None


def _mrope(rope):
    """What an M-RoPE computes: its widths, sections, base and layout."""
    return (rope.head_dim, rope.rotary_dim, rope.sections, rope.base, rope.interleaved,
            rope.pairing)  # fmt: skip


def per_type(config):
    """Whether the model's rotary is one per layer type (Gemma 3)."""
    params = getattr(config, "rope_parameters", None)
    types = set(getattr(config, "layer_types", None) or ())
    return isinstance(params, dict) and bool(types) and types <= set(params)


def check_attention_layer(i, enc, layer, module, config, kept):
    """Refuse, by name, a layer posenc's attention cannot run in this model: M-RoPE's axes,
    a width or head count that does not fit, learned sinks of an unknown form, an apply function that reorders
    q and k, a window wider than the keys transformers' cache keeps (``kept``)."""
    if enc is not None and enc.position_axes != 1:
        raise ValueError(f"layer {i}: {type(enc).__name__} reads {enc.position_axes} position "
                         "axes (M-RoPE), which transformers passes to the model's rotary "
                         "only: posenc puts it in only as the model's own M-RoPE, unchanged")  # fmt: skip
    if enc is not None:
        width = getattr(module, "head_dim", None)
        need = enc.inner if isinstance(enc, ChannelSlice) else enc
        got = getattr(need, "head_dim", None)
        if not isinstance(enc, ChannelSlice) and None not in (got, width) and got != width:
            raise ValueError(f"layer {i}: {type(need).__name__} has head_dim={got}, the "
                             f"model's attention heads are {width} wide")  # fmt: skip
        heads, have = getattr(need, "heads", None), getattr(config, "num_attention_heads", None)
        if heads is not None and have is not None and heads != have:
            raise ValueError(f"layer {i}: {type(need).__name__} has heads={heads}, the model "
                             f"num_attention_heads={have}")  # fmt: skip
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap:
        raise ValueError(f"layer {i}: the model caps its attention logits "
                         f"(attn_logit_softcapping={softcap}, Gemma 2), which posenc's "
                         "attention does not: this model takes RoPE only, through its own "
                         "attention")  # fmt: skip
    sinks = [n for n, _ in module.named_parameters(recurse=False) if "sink" in n]
    if sinks and getattr(config, "model_type", None) not in SINKS:
        raise ValueError(f"layer {i}: {type(module).__name__} has learned attention sinks "
                         f"({sinks[0]}) in a form posenc does not know (it applies GPT-OSS's, "
                         "a logit per head passed as s_aux): this model takes RoPE only, "
                         "through its own attention")  # fmt: skip
    if getattr(module, "indexer", None) is not None:
        raise ValueError(f"layer {i}: {type(module).__name__} attends only to the keys its "
                         "indexer selects (sparse attention), which posenc's attention does "
                         "not: this model takes RoPE only, through its own attention")  # fmt: skip
    if enc is not None and "qk" in enc.places and (name := rotary.permutes(module)):
        raise ValueError(f"layer {i}: {type(module).__name__}'s {name} reorders the channels "
                         "of q and k before attention, so posenc cannot encode them there: "
                         f"{type(enc).__name__} on this model goes in only as RoPE in the "
                         "model's own layout")  # fmt: skip
    reach = min((x for x in layer.limits if x is not None), default=None)
    if kept is not None and (reach is None or reach > kept):
        sees = "every earlier key" if reach is None else f"{reach} positions"
        raise ValueError(f"layer {i}: transformers' cache keeps the last {kept} positions of "
                         f"this layer (the config's sliding window) while decoding, but the "
                         f"scheme's layer sees {sees}: give it a window or chunk of at most "
                         f"{kept} (one encoding passed alone keeps the model's windows)")  # fmt: skip


def cache_limits(config, depth):
    """Per layer, the positions transformers' dynamic cache keeps (``None``: all of them)."""
    try:
        from transformers.cache_utils import DynamicCache

        layers = DynamicCache(config=config).layers
    except Exception:  # a config the cache cannot read: it keeps every key
        return [None] * depth
    kept = [getattr(layer, "sliding_window", None) for layer in layers]
    return (kept + [None] * depth)[:depth]
