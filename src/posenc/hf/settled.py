"""A config dict's layer settings as HF's config class settles them, and the values it refuses.

:func:`posenc.hf.schedule.schedule_from_hf` calls :func:`derived` before
:func:`posenc.hf.layers.prepare` (what a class's ``__post_init__`` fills in where a
``config.json`` is silent) and :func:`checked` after it (the values HF's strict config classes
refuse, or its model cannot use, refused here by name; and the masks of models that slide every
layer whatever ``layer_types`` says). Pure Python: transformers is not imported.
"""

from __future__ import annotations

from posenc._checks import check_int
from posenc.hf import layers as rules
from posenc.hf.defaults import CLASS_WINDOW, HF_VERSION, LAYER_TYPES

# models whose forward builds create_sliding_window_causal_mask for every attention layer
# whenever config.sliding_window is set, whatever a layer_types key says (MistralModel,
# MixtralModel, MiniMaxModel, Ministral3Model, Phi3Model, Phi4MultimodalModel, PhimoeModel,
# Qwen3MoeModel, Starcoder2Model, DogeModel, BltPatcher, VoxtralRealtime's encoder and text
# model: ``create_causal_mask if self.config.sliding_window is None else
# create_sliding_window_causal_mask``)
SLIDE_EVERY_LAYER = frozenset(("mistral", "mixtral", "minimax", "ministral3", "phi3",
                               "phi4_multimodal", "phimoe", "qwen3_moe", "starcoder2", "doge",
                               "blt_patcher", "voxtral_realtime_text",
                               "voxtral_realtime_encoder"))  # fmt: skip
# integer keys the layer rules divide or compare by: key -> the least value that works
COUNTS = {"sliding_window": 1, "attention_chunk_size": 1, "max_window_layers": 0,
          "first_k_dense_replace": 0, "no_rope_layer_interval": 1}  # fmt: skip
# ... and the patterns, where posenc's rule divides by them (EXAONE 4's may be "LLLG")
PATTERNS = {"sliding_window_pattern": 1, "prefix_dense_sliding_window_pattern": 1}


def derived(cfg, model_type, depth):
    """What the config class derives where the dict is silent: ModernBERT-decoder's layer
    types and window, and a class's default ``sliding_window`` (``CLASS_WINDOW``) where the key
    is absent and ``layer_types`` is given, or every layer slides (Mistral); without
    ``layer_types`` a model type with a pattern rule is refused by that rule
    (:func:`posenc.hf.layers.layer_types`)."""
    cfg = dict(cfg)
    if model_type == "modernbert-decoder":
        cfg = _modernbert_decoder(cfg, depth)
    if "sliding_window" not in cfg and model_type in CLASS_WINDOW:
        if cfg.get("layer_types") or model_type in rules.WINDOW_EVERY_LAYER:
            cfg["sliding_window"] = CLASS_WINDOW[model_type]
    return cfg


def checked(cfg, model_type):
    """``ValueError`` naming the key for a value HF refuses (an unknown layer type, a window
    of ``"4"`` or ``4.5``) or cannot use (a window or chunk of 0, a pattern of 0, a
    ``no_rope_layers`` entry other than 0 and 1); then every attention layer of the
    ``SLIDE_EVERY_LAYER`` models slides where ``sliding_window`` is set."""
    cfg = dict(cfg)
    for kind in cfg.get("layer_types") or ():
        if (
            kind not in LAYER_TYPES
            and kind not in rules.NO_ATTENTION
            and not kind.endswith(
                "_sliding"  # posenc's name for sliding kinds (rules.window), as "hybrid_sliding"
            )
        ):
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
    if model_type in SLIDE_EVERY_LAYER and cfg.get("sliding_window") and cfg.get("layer_types"):
        kinds = cfg["layer_types"]  # a layer_types key does not reach their masks
        cfg["layer_types"] = [k if k in rules.NO_ATTENTION else "sliding_attention" for k in kinds]
    return cfg


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
