"""A whole model's position scheme from its config: what each layer does, as plain data.

:func:`schedule_from_hf` reads, per layer, what transformers 5.23.0's modeling code does
with the config: the RoPE of the layer's type (or none), its sliding window or chunk, the
query temperature (Llama 4, Ministral 3), the slice of the head that rotates (DeepSeek's
multi-head latent attention) and the factor on the softmax scale. ``posenc.torch``'s
``Schedule.from_hf`` turns the result into modules. Pure Python: transformers is not
imported.
"""

from __future__ import annotations

import math

from posenc.hf import config as read
from posenc.hf import convert, settled
from posenc.hf import layers as rules
from posenc.hf.defaults import UNSUPPORTED
from posenc.hf.mrope import MROPE_LAYOUT, TEXT_OF, mrope_from_hf
from posenc.hf.rope import from_hf
from posenc.scaling.per_pair import yarn_mscale

__all__ = ["schedule_from_hf"]

# the settings of one layer (``attention`` first)
KEYS = ("attention", "rope", "window", "chunk", "temperature", "slice_start", "softmax_factor",
        "sinks")  # fmt: skip

# model types whose attention layers add a learned logit per head to their softmax
# (``self.sinks = nn.Parameter(...)``, HF's ``s_aux``: GptOssAttention and its kin) -> which
# layers: all, or the sliding ones only (MiMoV2FlashAttention: ``... if is_swa else None``)
SINKS = {**dict.fromkeys(("gpt_oss", "granite_swa", "granitemoe_swa", "flint", "hy_v4",
                          "openai_privacy_filter", "deepseek_v4"), "all"),
         "mimo_v2_flash": "sliding"}  # fmt: skip

# model types whose per-layer ``no_rope_layers`` (1: RoPE, 0: none) decides (Llama4TextAttention,
# SmolLM3Attention, MistralLarge4TextAttention: ``self.use_rope = config.no_rope_layers[i]``)
NO_ROPE_KEY = frozenset(("llama4", "llama4_text", "smollm3", "mistral_large4_text"))
# the Llama-4 query temperature on the layers without RoPE
TEMPERATURE_NOPE = frozenset(("llama4", "llama4_text"))
# the Llama-4-style temperature of rope_parameters' llama_4_scaling_beta on every layer
TEMPERATURE_BETA = frozenset(("ministral3", "mistral4"))
# softmax scale 1 (query and key norms instead): the factor is sqrt(head_dim)
# (DiaSelfAttention, of Dia's encoder and decoder: self.scaling = 1)
SCALE_ONE = frozenset(("gemma3n_text", "gemma4_text", "gemma4_unified_text",
                       "diffusion_gemma_text", "embedding_gemma2_text", "dia_decoder",
                       "dia_encoder"))  # fmt: skip
# ZambaAttention, Zamba2Attention: self.scaling = (head_dim / 2) ** -0.5, a factor sqrt(2)
SCALE_HALF_WIDTH = frozenset(("zamba", "zamba2"))
# Llama4TextConfig's defaults of the keys the schedule reads
LLAMA4_DEFAULTS = {"attention_chunk_size": 8192, "attn_temperature_tuning": True,
                   "attn_scale": 0.1, "floor_scale": 8192}  # fmt: skip
# schedules posenc does not build from a config, and why
NO_SCHEDULE = {
    "openai_privacy_filter": "its attention is bidirectional within a sliding window "
                             "(create_bidirectional_sliding_window_mask), and posenc's windows "
                             "look back only",
    # BltModel (modeling_blt.py): create_sliding_window_causal_mask of encoder_config, whose
    # sliding_window BltConfig.__post_init__ sets to local_attention_window_len, for the local
    # encoder's layers and for the local decoder's (whose config has no window)
    **dict.fromkeys(("blt", "blt_local_encoder", "blt_local_decoder"),
                    "Schedule.from_hf builds one transformer, but BltModel runs a patcher, a "
                    "local encoder, a global transformer and a local decoder, and every layer "
                    "of the local encoder and decoder slides by BltConfig's "
                    "local_attention_window_len, which their own configs do not hold "
                    "(BltModel passes the encoder's mask to the decoder); the patcher's "
                    "patcher_config is read alone"),
    "beam": "its layers without RoPE scale queries by (1 + (p + 1) / 2048) ** 0.1, which "
            "is not the Llama 4 temperature posenc offers",
}  # fmt: skip


def schedule_from_hf(config):
    """Every layer's position scheme of a transformers config, as plain settings.

    Parameters
    ----------
    config : dict or object
        A parsed ``config.json`` or a transformers config object (a multimodal config's
        ``text_config`` is read).

    Returns
    -------
    dict
        ``model_type``; ``head_dim`` (the width of the attention's queries and keys);
        ``layers``: one dict per layer with ``attention`` (``False`` for a layer without
        attention and so without position: a recurrent layer of type ``"linear_attention"``
        -- Mamba, Gated DeltaNet as in Qwen3-Next -- a ``"conv"`` or feed-forward one; its
        other settings are then all ``None``), ``rope`` (keyword arguments of
        ``RotaryEmbedding``, or of ``MRoPE`` with ``"mrope": True``, or ``None``: no
        position), ``window``, ``chunk``, ``temperature`` (``scale``, ``floor``,
        ``shift`` of ``QueryTemperature``, or ``None``), ``slice_start`` (the first rotated
        channel, or ``None``), ``softmax_factor`` (or ``None``) and ``sinks`` (``True``
        where the layer adds a learned logit per head to its softmax: GPT-OSS). Which layers slide, keep
        their window and rotate, and the widths of layers given their own
        (``per_layer_config``: Gemma 4's full layers, Dots3's sliding ones), follow the model
        type's rules (``posenc.hf.layers``). A window is a layer's only where HF's eager and
        SDPA attention apply it (``posenc.hf.windows``): a Llama config's ``sliding_window``
        reaches no mask, nor Moshi's (only HF's cache, keeping the last ``sliding_window - 1``
        keys while decoding), so their layers get none.

    Raises
    ------
    ValueError
        For what posenc cannot reproduce, by name: a model type whose windows look both
        ways (ModernBERT, EmbeddingGemma, Gemma 3 with ``use_bidirectional_attention``, ...),
        a mask that is no look-back window (UnlimitedOCR's reference layers, Doge's keys
        selected by content, BLT's local window), a rotation or temperature it does not
        offer, a rule the dict cannot settle.

    Examples
    --------
    >>> from posenc.hf import schedule_from_hf
    >>> cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 2,
    ...        "head_dim": 32, "max_position_embeddings": 1024, "num_hidden_layers": 3,
    ...        "sliding_window": 512, "query_pre_attn_scalar": 32,
    ...        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    ...        "rope_parameters": {
    ...            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    ...            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}
    >>> [(layer["rope"]["base"], layer["window"]) for layer in schedule_from_hf(cfg)["layers"]]
    [(10000.0, 512), (10000.0, 512), (1000000.0, None)]
    """
    config, _ = read.text_model(config)
    cfg = read.as_dict(config)
    model_type = cfg.get("model_type")
    for table in (UNSUPPORTED, NO_SCHEDULE):
        if model_type in table:
            raise ValueError(f"model_type {model_type!r} is not reproduced: {table[model_type]}")
    depth = cfg.get("num_hidden_layers")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"config must give num_hidden_layers >= 1, got {depth!r}")
    cfg = settled.settle(cfg, model_type, depth)  # as HF's class and model settle it
    rules.refuse_bidirectional(cfg, model_type)
    if model_type in NO_ROPE_KEY:
        cfg = _llama4_defaults(cfg, model_type, depth)
    types = rules.layer_types(cfg, model_type, depth)
    own = rules.per_layer(cfg, model_type, types)  # per_layer_config: widths of some layers
    of_type = {t: own[types.index(t)] for t in dict.fromkeys(types)}
    for t, o in zip(types, own, strict=True):
        if o != of_type[t]:
            raise ValueError(
                f"per_layer_config gives layers of type {t!r} different widths "
                f"({of_type[t]} and {o}): posenc builds one RoPE per layer type"
            )
    ropes = {t: _rope(config, cfg, model_type, t) for t in of_type}
    for t, r in ropes.items():
        if r is None or not _mla(cfg | of_type[t]):
            continue  # the rotated slice of latent attention is a RoPE of its own width
        rope_width = int((cfg | of_type[t])["qk_rope_head_dim"])
        if (r.get("rotary_dim") or r["head_dim"]) != rope_width:
            raise ValueError(
                f"{model_type}: the rotary width {r.get('rotary_dim') or r['head_dim']} is "
                f"not qk_rope_head_dim={rope_width}, posenc cannot place it"
            )
        ropes[t] = r | {"head_dim": rope_width, "rotary_dim": None}
    uses = cfg["no_rope_layers"] if model_type in NO_ROPE_KEY else None
    bases = rules.layer_base(cfg, model_type, depth)  # layer_rope_theta: 0 is no RoPE
    layers = []
    for i, kind in enumerate(types):
        rope, lcfg = ropes[kind], cfg | own[i]
        if (uses is not None and not uses[i]) or not rules.rotates(cfg, model_type, kind, i):
            rope = None
        if bases is not None and rope is not None and bases[i] is not None:
            rope = rope | {"base": bases[i]} if bases[i] else None
        if kind in rules.NO_ATTENTION:  # a recurrent, convolution or feed-forward layer
            layers.append(dict.fromkeys(KEYS) | {"attention": False})
            continue
        layers.append({
            "attention": True, "rope": rope, "window": rules.window(cfg, kind),
            "chunk": _chunk(cfg, kind), "temperature": _temperature(cfg, model_type, rope),
            "slice_start": lcfg.get("qk_nope_head_dim") if _mla(lcfg) and rope else None,
            "softmax_factor": _softmax_factor(lcfg, model_type, ropes[kind]),
            "sinks": SINKS.get(model_type) == "all"
            or (SINKS.get(model_type) == "sliding" and rules.is_sliding(kind)),
        })  # fmt: skip
    settled.check_selection(cfg, model_type, layers)  # Doge's dynamic mask
    width = _qk_width(cfg, ropes.values())
    return {"model_type": model_type, "head_dim": width, "layers": layers}


def _rope(config, cfg, model_type, layer_type):
    """RoPE keyword arguments of one layer type (``None`` where the type has no RoPE)."""
    if layer_type in rules.NO_ATTENTION or model_type in rules.NO_POSITION:
        return None  # no attention, no position (flat parameters serve the attention types)
    params = convert.rope_parameters(cfg)
    theta = params.get("rope_theta", cfg.get("rope_theta", 0))
    if model_type in rules.ROPE_IF_THETA and theta is None:
        return None  # rope_theta given as None: no rotary embedding
    per_type = bool(read.per_type_keys(params, cfg))
    if TEXT_OF.get(model_type, model_type) in MROPE_LAYOUT:
        if per_type and params.get(layer_type) is None:
            return None  # explicitly no RoPE on this layer type
        return {"mrope": True, **mrope_from_hf(config, layer_type=layer_type if per_type else None)}
    if per_type and layer_type not in params and "attention" in layer_type:
        raise ValueError(
            f"rope_parameters has no entry for the attention layer type {layer_type!r} "
            f"(it has {sorted(params)}): give it, or pass the transformers config object"
        )
    if per_type and params.get(layer_type) is None:
        return None  # explicitly no RoPE, or a layer type without attention (conv, mamba)
    return from_hf(config, layer_type=layer_type)  # flat parameters serve every type


def _llama4_defaults(cfg, model_type, depth):
    """Llama 4's and SmolLM3's class defaults where a config.json is silent: a layer
    without RoPE every ``no_rope_layer_interval`` (4), Llama 4's chunks and temperature."""
    cfg = dict(cfg)
    uses = cfg.get("no_rope_layers") or [
        int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0) for i in range(depth)
    ]  # an empty list means the default too, as in the config classes
    if len(uses) != depth:
        raise ValueError(f"no_rope_layers must have num_hidden_layers={depth} entries, "
                         f"got {len(uses)}")  # fmt: skip
    cfg["no_rope_layers"] = uses
    if model_type in TEMPERATURE_NOPE:
        for key, value in LLAMA4_DEFAULTS.items():
            cfg.setdefault(key, value)
        if not cfg.get("layer_types"):
            cfg["layer_types"] = ["chunked_attention" if u else "full_attention" for u in uses]
    return cfg


def _chunk(cfg, kind):
    chunk = cfg.get("attention_chunk_size")
    return int(chunk) if kind == "chunked_attention" and chunk else None


def _temperature(cfg, model_type, rope):
    if model_type in TEMPERATURE_NOPE and rope is None and cfg.get("attn_temperature_tuning"):
        return {"scale": float(cfg["attn_scale"]), "floor": float(cfg["floor_scale"]), "shift": 1}
    params = _flat_params(cfg)
    beta = params.get("llama_4_scaling_beta")
    if model_type in TEMPERATURE_BETA and beta:
        floor = params.get("original_max_position_embeddings")
        if not floor:
            raise ValueError(
                f"{model_type}'s llama_4_scaling_beta needs rope_parameters' "
                "original_max_position_embeddings, got none"
            )
        return {"scale": float(beta), "floor": float(floor), "shift": 0}
    return None


def _flat_params(cfg):
    """The flat rope dict, with HF's precedence (``rope_scaling`` first); ``{}`` where the
    parameters are given per layer type."""
    try:
        return read.rope_params(cfg)
    except ValueError:
        return {}


def _mla(cfg):
    return bool(cfg.get("qk_nope_head_dim")) and bool(cfg.get("qk_rope_head_dim"))


def _qk_width(cfg, ropes):
    """The width of queries and keys: nope + rope channels, else the RoPEs' one width."""
    if _mla(cfg):
        return int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    widths = {r["head_dim"] for r in ropes if r is not None}
    return widths.pop() if len(widths) == 1 else read.head_dim(cfg)


def _softmax_factor(cfg, model_type, rope):
    """The factor on ``1 / sqrt(head_dim)`` the model's attention uses, or None (1)."""
    width = _qk_width(cfg, [rope])
    if _mla(cfg):
        params = _flat_params(cfg)
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default" and params.get("mscale_all_dim"):
            return yarn_mscale(params["factor"], params["mscale_all_dim"]) ** 2
        return None
    if model_type in SCALE_ONE:
        return math.sqrt(width)
    if model_type in SCALE_HALF_WIDTH:
        return math.sqrt(2)
    if cfg.get("query_pre_attn_scalar"):
        factor = math.sqrt(width / cfg["query_pre_attn_scalar"])
        return None if factor == 1 else factor
    if cfg.get("attention_multiplier") and str(model_type).startswith("granite"):
        return cfg["attention_multiplier"] * math.sqrt(width)
    return None
