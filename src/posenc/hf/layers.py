"""What each layer of a model is, by the rules of its model type: one table, a source each.

transformers 5.23.0 decides per layer, in a config class's ``__post_init__`` or in the
attention module of the modeling code, whether the layer attends at all, which type it is
(``layer_types``), whether its window is kept, whether it rotates, and whether its window
looks both ways. :mod:`posenc.hf.schedule` reads those rules here; each entry names the
code it follows (``models/<type>/configuration_<type>.py`` or ``modeling_<type>.py``), and
``tests/test_schedule_from_hf.py`` checks them against HF's attention modules.
"""

from __future__ import annotations

# Layer types whose layers have no attention, and so no position (HF's
# ALLOWED_LAYER_TYPES: "linear_attention" is a recurrent layer -- Mamba, Mamba-2, Gated
# DeltaNet, MiniMax lightning -- as "recurrent" is RecurrentGemma's; "conv" a convolution;
# "moe", "mlp", "sparse" and "dense" a feed-forward block)
NO_ATTENTION = frozenset(
    ("linear_attention", "mamba", "recurrent", "conv", "moe", "mlp", "sparse", "dense")
)
# configuration_utils.remap_legacy_layer_types: old names of layer types
LEGACY_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
# Config classes that keep sliding_window only where use_sliding_window (default False) is set
# (``self.sliding_window = self.sliding_window if self.use_sliding_window else None``, 0 for
# Qwen2-MoE): Qwen2Config, Qwen3Config, Qwen3MoeConfig, Qwen2MoeConfig, Qwen2VLTextConfig,
# Qwen2_5_VLTextConfig, Qwen2_5OmniTextConfig, Qwen2_5OmniTalkerConfig,
# DeepseekOcr2VisionEncoderConfig
WINDOW_IF_USED = frozenset(("qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "qwen2_vl_text",
                            "qwen2_5_vl_text", "qwen2_5_omni_text", "qwen2_5_omni_talker",
                            "deepseek_ocr2_encoder"))  # fmt: skip
# ... of which these slide from max_window_layers on (their default here) where the config gives
# no layer_types: "sliding_attention" if sliding_window is not None and i >= max_window_layers
SLIDE_FROM = {"qwen2": 28, "qwen3": 28, "qwen2_5_omni_text": 28, "qwen2_5_omni_talker": 28,
              "deepseek_ocr2_encoder": 28, "qwen2_vl_text": 80, "qwen2_5_vl_text": 80}  # fmt: skip
# Qwen2MoeConfig: the even-numbered (1-based odd) layers below max_window_layers (28) slide
SLIDE_ODD_BELOW = {"qwen2_moe": 28}
# "sliding_attention" if (i + 1) % pattern else "full_attention": model type -> default pattern
# (Gemma3TextConfig._sliding_window_pattern and Cohere2Config: the config's
# sliding_window_pattern, default 6 and 4)
PATTERN = {"gemma3_text": 6, "cohere2": 4}
# model types whose every layer slides when sliding_window is set (no layer_types): their
# attention passes config.sliding_window to every layer (Mistral, Qwen3-MoE, ...)
WINDOW_EVERY_LAYER = frozenset(("mistral", "mixtral", "ministral", "starcoder2", "phi3", "phimoe",
                                "mimi", "moshi", "kyutai_speech_to_text", "blt_patcher",
                                "pocket_tts_audio_tokenizer", "voxtral_realtime_text",
                                "qwen3_moe"))  # fmt: skip
# Which layers rotate, where the model type decides (elsewhere every attention layer whose type
# has rope parameters rotates):
# Cohere2Attention, FlintAttention, CohereCompassAttention: ``if self.sliding_window is not
# None`` -- only layers with a window (a sliding layer of a config without one does not rotate)
ROPE_IF_WINDOW = frozenset(("cohere2", "flint", "cohere_compass_text"))
# Cohere2MoeAttention: ``if self.sliding_window is not None or self.force_rope``, force_rope for
# the dense prefix layers (mlp_layer_types[i] == "dense") when prefix_dense_sliding_window_pattern
# is 1; Cohere2MoeConfig derives both lists from first_k_dense_replace
ROPE_IF_WINDOW_OR_DENSE = frozenset(("cohere2_moe",))
# Exaone4Attention, ExaoneMoeAttention, Kolibri1Attention (and EXAONE 4.5's text model, an
# exaone4): ``if self.sliding_window is None or self.is_sliding`` -- every layer where the config
# has no window, else the sliding layers only
ROPE_IF_SLIDING_OR_NO_WINDOW = frozenset(("exaone4", "exaone_moe", "kolibri1"))
# Windows that look both ways (|i - j| <= w), which posenc's look-back windows cannot build:
# model types whose windows always do, and why (OpenAI's privacy filter, whose every layer
# does, is refused whole: posenc.hf.schedule.NO_SCHEDULE)
BIDIRECTIONAL = {
    "modernbert": "ModernBertModel's local attention is create_bidirectional_sliding_window_mask "
                  "(|i - j| <= local_attention // 2)",
    "ultrabert": "UltraBertModel's sliding layers use create_bidirectional_sliding_window_mask",
    "muse_glimmer_assistant": "MuseGlimmerAssistantModel's sliding layers use "
                              "create_bidirectional_sliding_window_mask",
    "embedding_gemma2_text": "EmbeddingGemma2TextModel's sliding layers use "
                             "create_bidirectional_sliding_window_mask",
    "neomme": "NeoMMEModel's sliding layers use create_bidirectional_sliding_window_mask",
}  # fmt: skip
# ... and those whose windows do where a config flag is set: model type -> (flag, why)
BIDIRECTIONAL_FLAG = {
    # Gemma3TextModel (EmbeddingGemma): or_mask_function=_bidirectional_window_overlay
    "gemma3_text": "Gemma3TextModel ORs its sliding masks with |i - j| < sliding_window",
    # Step3p7's text model (a step3p5 config): the same overlay
    "step3p5": "its text model ORs its sliding masks with |i - j| < sliding_window",
}


def prepare(cfg, model_type):
    """The config as the class holds it: legacy layer type names renamed, and the window
    dropped where the class keeps it only with ``use_sliding_window``."""
    cfg = dict(cfg)
    if cfg.get("layer_types"):
        cfg["layer_types"] = [LEGACY_TYPES.get(t, t) for t in cfg["layer_types"]]
    if model_type in WINDOW_IF_USED and not cfg.get("use_sliding_window", False):
        cfg["sliding_window"] = None
    return cfg


def layer_types(cfg, model_type, depth):
    """Every layer's type: the config's ``layer_types``, else the rule of its class."""
    types = cfg.get("layer_types")
    if types:
        if len(types) != depth:
            raise ValueError(
                f"layer_types must have num_hidden_layers={depth} entries, got {len(types)}"
            )
        return list(types)
    if model_type in ROPE_IF_WINDOW_OR_DENSE:  # Cohere2MoeConfig.__post_init__
        dense = cfg.get("first_k_dense_replace") or 0
        prefix = cfg.get("prefix_dense_sliding_window_pattern", 1)
        rest = cfg.get("sliding_window_pattern", 4)
        return [_slides(i, prefix) for i in range(dense)] + [
            _slides(i, rest) for i in range(depth - dense)
        ]
    if model_type in PATTERN:
        if "sliding_window" not in cfg:  # the class's default window would slide them
            raise ValueError(
                "config gives neither layer_types nor sliding_window, and the config class "
                f"of model_type={model_type!r} has a default window: add sliding_window, or "
                "pass the transformers config object"
            )
        return [_slides(i, cfg.get("sliding_window_pattern", PATTERN[model_type]))
                for i in range(depth)]  # fmt: skip
    window = cfg.get("sliding_window")
    if model_type in SLIDE_FROM:
        first = cfg.get("max_window_layers", SLIDE_FROM[model_type])
        return [_type(window is not None and i >= first) for i in range(depth)]
    if model_type in SLIDE_ODD_BELOW:
        below = cfg.get("max_window_layers", SLIDE_ODD_BELOW[model_type])
        used = cfg.get("use_sliding_window", False)
        return [_type(bool((i + 1) % 2) and i < below and used) for i in range(depth)]
    if not window:
        return ["full_attention"] * depth
    if model_type in WINDOW_EVERY_LAYER:
        return ["sliding_attention"] * depth
    raise ValueError(
        f"config gives sliding_window but no layer_types, and which layers of {model_type!r} "
        "slide is its config class's rule: pass the transformers config object"
    )


def _slides(i, pattern):
    return _type(bool((i + 1) % pattern))


def _type(sliding):
    return "sliding_attention" if sliding else "full_attention"


def window(cfg, kind):
    """The look-back window of a layer of type ``kind`` (``None``: none)."""
    size = cfg.get("sliding_window")
    if size and (kind == "sliding_attention" or kind.endswith("_sliding")):
        return int(size)
    return None


def rotates(cfg, model_type, kind, i):
    """Whether layer ``i`` (of type ``kind``, whose type has rope parameters) rotates."""
    if kind in NO_ATTENTION:
        return False
    windowed = kind == "sliding_attention" and cfg.get("sliding_window") is not None
    if model_type in ROPE_IF_WINDOW:
        return windowed
    if model_type in ROPE_IF_WINDOW_OR_DENSE:
        dense = cfg.get("mlp_layer_types") or [
            "dense" if j < (cfg.get("first_k_dense_replace") or 0) else "sparse"
            for j in range(i + 1)
        ]
        forced = dense[i] == "dense" and cfg.get("prefix_dense_sliding_window_pattern", 1) == 1
        return windowed or forced
    if model_type in ROPE_IF_SLIDING_OR_NO_WINDOW:
        return cfg.get("sliding_window") is None or kind == "sliding_attention"
    return True


def refuse_bidirectional(cfg, model_type):
    """``ValueError`` naming the model type where its windows look both ways (a config
    without ``layer_types`` counts as windowed: its class's rule may give windows)."""
    types = cfg.get("layer_types") or ()
    windowed = any(t == "sliding_attention" or t.endswith("_sliding") for t in types)
    why = BIDIRECTIONAL.get(model_type)
    if why is None and cfg.get("use_bidirectional_attention"):
        why = BIDIRECTIONAL_FLAG.get(model_type)
        why = why and f"use_bidirectional_attention is set: {why}"
    if why and (windowed or not cfg.get("layer_types")):
        raise ValueError(
            f"model_type {model_type!r} is not reproduced: its sliding windows are "
            f"bidirectional ({why}), and posenc's windows look back only"
        )
