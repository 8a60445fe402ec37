"""A config dict's layer settings as HF's config class settles them, and the values it refuses.

:func:`posenc.hf.schedule.schedule_from_hf` calls :func:`settle`: :func:`derived` before
:func:`posenc.hf.layers.prepare` (what a class's ``__post_init__`` fills in where a
``config.json`` is silent), :func:`checked` after it (the values HF's strict config classes
refuse, or its model cannot use, refused here by name, and layer types whose mask is no
look-back window) and :func:`every_layer` (the masks of the models that slide every layer,
``SLIDE_EVERY_LAYER``); :func:`check_selection` refuses a layer whose keys HF selects by
content (Doge). Pure Python: transformers is not imported."""

from __future__ import annotations

from posenc._checks import check_int
from posenc.hf import layers as rules
from posenc.hf.defaults import CLASS_WINDOW, HF_VERSION, LAYER_TYPES

# The one table of the models whose every attention layer slides where sliding_window is set
# (transformers 5.23.0): model type -> whether a layer_types key is ignored. True: the model's
# forward builds one mask for all its layers, whatever layer_types says (a layer without
# attention keeps its type: MiniMax's linear ones) -- ``create_causal_mask if
# self.config.sliding_window is None else create_sliding_window_causal_mask`` in MistralModel,
# MixtralModel, MiniMaxModel, Ministral3Model, Phi3Model, Phi4MultimodalModel, PhimoeModel,
# Qwen3MoeModel, Starcoder2Model, DogeModel, BltPatcher, VoxtralRealtimeEncoder and
# VoxtralRealtimeTextModel, and create_sliding_window_causal_mask always in
# MimiTransformerModel and PocketTTSAudioTokenizerTransformerModel (the transformer of the
# codec and of its encoder and decoder halves). False: the config class derives
# layer_types, every layer "sliding_attention" if sliding_window is not None, and the model
# follows a given layer_types (MinistralConfig.__post_init__, MinistralModel's mask per type).
# tests/test_sliding_every_layer.py checks each against the masks of HF's models.
SLIDE_EVERY_LAYER = {
    **dict.fromkeys(("mistral", "mixtral", "minimax", "ministral3", "phi3", "phi4_multimodal",
        "phimoe", "qwen3_moe", "starcoder2", "doge", "blt_patcher", "voxtral_realtime_text",
        "voxtral_realtime_encoder", "mimi", "mimi_encoder", "mimi_decoder",
        "pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_encoder",
        "pocket_tts_audio_tokenizer_decoder"), True),
    "ministral": False,
}  # fmt: skip
# Layer types a config class derives where layer_types is absent, as a cycle over the layers:
# MiniMaxConfig.__post_init__, "full_attention" if (i + 1) % 2 else "linear_attention"
LAYER_CYCLE = {"minimax": ("full_attention", "linear_attention")}
# ... and as one type for every layer where the config has a window (else "full_attention"):
# UnlimitedOcrTextConfig.__post_init__ (whose window defaults to 128 and may not be None)
LAYER_IF_WINDOW = {"unlimited_ocr_text": "reference_sliding_attention"}
# Layer types whose HF mask is no look-back window: layer type -> why (posenc refuses them
# where the config has a window). UnlimitedOcrTextModel: create_reference_sliding_window_causal_mask
# (modeling_unlimited_ocr.py) ORs the window with every key of the prefill that its cache layer
# (UnlimitedOcrDynamicReferenceSlidingWindowLayer, which DynamicCache builds for the type) holds
MASK_OF_TYPE = {
    "reference_sliding_attention": "HF's model (UnlimitedOcrTextModel) attends to every key "
    "of the prefill and to the last sliding_window generated keys (a window over the "
    "generated tokens only, whose start is the cache's prefill length), which posenc's "
    "windows and chunks cannot express",
}  # fmt: skip
# Qwen2MoeConfig sets sliding_window = 0 (not None) without use_sliding_window: a layer that
# layer_types still names "sliding_attention" then gets a window of 0 (sliding_window_overlay:
# kv_idx > q_idx - 0) and attends to no key (its other Qwen classes set None: HF's model raises)
WINDOW_ZERO_IF_UNUSED = frozenset(("qwen2_moe",))
# Attention that keeps, per query, only the keys of the top k of a content score where more
# are visible: model type -> (the key of k, its class default). DogeAttention.prepare_dynamic_mask
# (modeling_doge.py): topk(dt_states, keep_window_size) once the keys outnumber it
KEY_SELECTION = {"doge": ("keep_window_size", 2048)}
# integer keys the layer rules divide or compare by: key -> the least value that works
COUNTS = {"sliding_window": 1, "attention_chunk_size": 1, "max_window_layers": 0,
          "first_k_dense_replace": 0, "no_rope_layer_interval": 1}  # fmt: skip
# ... and the patterns, where posenc's rule divides by them (EXAONE 4's may be "LLLG")
PATTERNS = {"sliding_window_pattern": 1, "prefix_dense_sliding_window_pattern": 1}


def derived(cfg, model_type, depth):
    """What the config class derives where the dict is silent: ModernBERT-decoder's layer
    types and window, MiniMax's and UnlimitedOCR's layer types (``LAYER_CYCLE``,
    ``LAYER_IF_WINDOW``), and a class's default
    ``sliding_window`` (``CLASS_WINDOW``) where the key is absent and ``layer_types`` is
    given, or every layer slides (``SLIDE_EVERY_LAYER``: Mistral); without
    ``layer_types`` a model type with a pattern rule is refused by that rule
    (:func:`posenc.hf.layers.layer_types`)."""
    cfg = dict(cfg)
    if model_type == "modernbert-decoder":
        cfg = _modernbert_decoder(cfg, depth)
    if model_type in LAYER_CYCLE and not cfg.get("layer_types"):
        cycle = LAYER_CYCLE[model_type]
        cfg["layer_types"] = [cycle[i % len(cycle)] for i in range(depth)]
    if model_type in LAYER_IF_WINDOW and not cfg.get("layer_types"):
        windowed = cfg.get("sliding_window", CLASS_WINDOW.get(model_type)) is not None
        kind = LAYER_IF_WINDOW[model_type] if windowed else "full_attention"
        cfg["layer_types"] = [kind] * depth
    if "sliding_window" not in cfg and model_type in CLASS_WINDOW:
        if cfg.get("layer_types") or model_type in SLIDE_EVERY_LAYER:
            cfg["sliding_window"] = CLASS_WINDOW[model_type]
    return cfg


def checked(cfg, model_type):
    """``ValueError`` naming the key for a value HF refuses (an unknown layer type, a window
    of ``"4"`` or ``4.5``) or cannot use (a window or chunk of 0, a pattern of 0, a
    ``no_rope_layers`` entry other than 0 and 1)."""
    cfg = dict(cfg)
    for kind in cfg.get("layer_types") or ():
        known = kind in LAYER_TYPES or kind in rules.NO_ATTENTION or rules.is_sliding(kind)
        if not known:
            raise ValueError(
                f"layer_types has {kind!r}, which is no layer type of transformers "
                f"{HF_VERSION} ({', '.join(LAYER_TYPES)})"
            )
    patterned = model_type in rules.PATTERN or model_type in rules.ROPE_IF_WINDOW_OR_DENSE
    for key, least in (COUNTS | PATTERNS if patterned else COUNTS).items():
        if cfg.get(key) is not None:
            check_int(key, cfg[key], minimum=least)
    uses = cfg.get("no_rope_layers")
    if uses is not None and any(u not in (0, 1) or isinstance(u, float) for u in uses):
        raise ValueError(f"no_rope_layers entries must be 0 (no RoPE) or 1 (RoPE), got {uses}")
    _refuse_unrunnable(cfg, model_type)
    return cfg


def _refuse_unrunnable(cfg, model_type):
    """``ValueError`` naming the key where HF's model applies no plain look-back window to a
    layer posenc would read as one: UnlimitedOCR's reference layers (``MASK_OF_TYPE``), and
    sliding layers of a Qwen2-MoE config without ``use_sliding_window``."""
    kinds = cfg.get("layer_types") or ()
    for kind in dict.fromkeys(kinds):
        if kind in MASK_OF_TYPE and cfg.get("sliding_window"):
            raise ValueError(
                f"Schedule.from_hf cannot reproduce layer_types {kind!r} with "
                f"sliding_window={cfg['sliding_window']}: {MASK_OF_TYPE[kind]}"
            )
    unused = model_type in WINDOW_ZERO_IF_UNUSED and not cfg.get("use_sliding_window", False)
    if unused and "sliding_attention" in kinds:
        raise ValueError(
            f"Schedule.from_hf cannot reproduce {model_type}'s layer_types 'sliding_attention' "
            "with use_sliding_window=False: its config class then sets sliding_window to 0, "
            "and HF's model masks every key of those layers; set use_sliding_window=True or "
            "make them 'full_attention'"
        )


def every_layer(cfg, model_type, depth):
    """The layer types of a ``SLIDE_EVERY_LAYER`` model where ``sliding_window`` is set (after
    :func:`posenc.hf.layers.prepare`): every attention layer slides, given ``layer_types``
    or not (only the class's derived ones, where the model follows a given list)."""
    ignored = SLIDE_EVERY_LAYER.get(model_type)
    if ignored is None or not cfg.get("sliding_window"):
        return cfg
    kinds = cfg.get("layer_types")
    if kinds and not ignored:
        return cfg
    kinds = kinds or ["sliding_attention"] * depth
    kinds = [k if k in rules.NO_ATTENTION else "sliding_attention" for k in kinds]
    return cfg | {"layer_types": kinds}


def settle(cfg, model_type, depth):
    """The config dict as HF's config class and model settle it, refused by name where HF
    refuses it: :func:`derived`, :func:`posenc.hf.layers.prepare`, :func:`checked` and
    :func:`every_layer`, in that order."""
    cfg = checked(rules.prepare(derived(cfg, model_type, depth), model_type), model_type)
    return every_layer(cfg, model_type, depth)


def _modernbert_decoder(cfg, depth):
    """ModernBertDecoderConfig.__post_init__: without layer_types, each layer but every
    ``global_attn_every_n_layers``-th (3) slides; ``sliding_window`` is always
    ``local_attention // 2`` (128 // 2), whatever the dict says."""
    if not cfg.get("layer_types"):
        every = cfg.get("global_attn_every_n_layers", 3)
        every = check_int("global_attn_every_n_layers", every, minimum=1)
        kinds = ("full_attention", "sliding_attention")
        cfg["layer_types"] = [kinds[i % every != 0] for i in range(depth)]
    local = cfg.get("local_attention", 128)
    if not local:  # the class sets sliding_window = -1
        raise ValueError(f"local_attention must be >= 2 for modernbert-decoder, got {local!r}")
    cfg["sliding_window"] = check_int("local_attention", local, minimum=2) // 2
    return cfg


def check_selection(cfg, model_type, layers):
    """``ValueError`` naming the key where a layer of a ``KEY_SELECTION`` model may see more
    keys than its content selection keeps (its window, else its RoPE's ``max_len``: posenc
    refuses positions beyond it), so that which keys it attends to depends on their values."""
    if model_type not in KEY_SELECTION:
        return
    key, default = KEY_SELECTION[model_type]
    keep = check_int(key, cfg.get(key, default), minimum=1)
    for i, layer in enumerate(layers):
        seen = [n for n in (layer["window"], (layer["rope"] or {}).get("max_len")) if n]
        if layer["attention"] and (not seen or min(seen) > keep):
            raise ValueError(
                f"Schedule.from_hf cannot reproduce {model_type} with {key}={keep}: layer {i} "
                f"lets a query see {min(seen) if seen else 'any number of'} keys (sliding_window="
                f"{cfg.get('sliding_window')}, max_position_embeddings="
                f"{cfg.get('max_position_embeddings')}), and where they outnumber {key} HF keeps "
                "the top ones by a content score (a dynamic mask), which no position scheme "
                f"expresses: set sliding_window or max_position_embeddings <= {key}"
            )
