"""What each layer of a model is, by the rules of its model type: one table, a source each.

transformers 5.23.0 decides per layer, in a config class's ``__post_init__`` or in the
attention module of the modeling code, whether the layer attends at all, which type it is
(``layer_types``), whether its window is kept, whether it rotates, and whether its window
looks both ways. :mod:`posenc.hf.schedule` reads those rules here; each entry names the
code it follows (``models/<type>/configuration_<type>.py`` or ``modeling_<type>.py``), and
``tests/test_schedule_from_hf.py`` checks them against HF's attention modules.
"""

from __future__ import annotations

from collections.abc import Mapping

from posenc.hf.windows import BIDIRECTIONAL, BIDIRECTIONAL_FLAG, WINDOWED, applies_window

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
# layer types a config class derives in a property that to_dict() leaves out:
# BambaConfig.layers_block_type: "full_attention" at attn_layer_indices, else "linear_attention"
# (Mamba-2); RecurrentGemmaConfig.layers_block_type: block_types (default recurrent, recurrent,
# attention) repeated, its attention blocks sliding (attention_window_size, default 2048)
ATTN_LAYER_INDICES = frozenset(("bamba",))
BLOCK_TYPES = {"recurrent_gemma": ("recurrent", "recurrent", "attention")}
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
# NemotronHAttention.forward rotates nothing (apply_rotary_pos_emb only decorates the class)
# and NemotronHConfig has no rope parameters: its attention layers carry no position
NO_POSITION = frozenset(("nemotron_h",))
# OlmoHybridModel: rotary_emb only where rope_parameters' rope_theta is not None (the released
# checkpoints set it to None: no layer rotates)
ROPE_IF_THETA = frozenset(("olmo_hybrid",))
# AfmoeAttention: ``if self.is_local_attention`` (layer_types[i] == "sliding_attention"): the
# sliding layers rotate, the full ones do not
ROPE_IF_SLIDING = frozenset(("afmoe",))
# RoPE only where a config key has a value: model type -> (key, the value, the class default,
# the scheme otherwise: None, no position; else one from_hf does not build and refuses by name)
ROPE_IF_KEY = {
    # GraniteMoeHybridModel: rotary_emb only if config.position_embedding_type == "rope"
    "granitemoehybrid": ("position_embedding_type", "rope", None, None),
    # Zamba2Model: position_embeddings only if config.use_mem_rope
    "zamba2": ("use_mem_rope", True, False, None),
    # FalconModel: alibi=True adds ALiBi biases and no rotation
    "falcon": ("alibi", False, False, "ALiBi biases"),
    # EsmSelfAttention: rotary only for "rotary" (EsmEmbeddings adds learned absolute ones)
    "esm": ("position_embedding_type", "rotary", "absolute", "its position embeddings"),
}
# A RoPE base per layer, layer_rope_theta (0: the layer gets position_embeddings=None): model
# type -> whether a nonzero entry is the layer's base, and the class default's NoPE layers.
# MuseGlimmerTextConfig, MuseSparkTextConfig: 0 every 4th layer counted back from the last, and
# their one rotary embedding has rope_theta (a nonzero entry is not read); GraniteSWAModel,
# GraniteMoeSWAModel: one rotary embedding per nonzero entry, default rope_theta everywhere
LAYER_THETA = {"muse_glimmer_text": (False, 4), "muse_spark_text": (False, 4),
               "granite_swa": (True, 0), "granitemoe_swa": (True, 0)}  # fmt: skip


# The settings of one layer posenc reads from HF's per_layer_config (layer index -> the settings
# that layer overrides; a config object's to_dict() holds it too)
PER_LAYER_KEYS = ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")
# Config classes that derive per_layer_config where a config.json gives none: Gemma4TextConfig,
# Gemma4UnifiedTextConfig, DiffusionGemmaTextConfig, EmbeddingGemma2TextConfig give their
# full-attention layers head_dim = global_head_dim (default 512)
GLOBAL_HEAD_DIM = frozenset(("gemma4_text", "gemma4_unified_text", "diffusion_gemma_text",
                             "embedding_gemma2_text"))  # fmt: skip
# Dots3NoteTextConfig gives its sliding layers swa_head_dim (256), swa_qk_nope_head_dim (192)
# and swa_qk_rope_head_dim (default their difference)
SWA_WIDTHS = {"dots3_note_text": (256, 192)}


def prepare(cfg, model_type):
    """The config as the class holds it: legacy layer type names renamed, and the window
    dropped where the class keeps it only with ``use_sliding_window`` or the model never
    applies it (:func:`posenc.hf.windows.applies_window`)."""
    cfg = dict(cfg)
    if cfg.get("layer_types"):
        cfg["layer_types"] = [LEGACY_TYPES.get(t, t) for t in cfg["layer_types"]]
    if model_type in WINDOW_IF_USED and not cfg.get("use_sliding_window", False):
        cfg["sliding_window"] = None
    if not applies_window(model_type):  # HF's model never reads it: posenc.hf.windows
        cfg["sliding_window"] = None
    if model_type == "recurrent_gemma" and cfg.get("sliding_window") is None:
        cfg["sliding_window"] = cfg.get("attention_window_size", 2048)  # its attribute_map
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
    if model_type in ATTN_LAYER_INDICES:
        attn = cfg.get("attn_layer_indices") or ()
        return ["full_attention" if i in attn else "linear_attention" for i in range(depth)]
    if model_type in BLOCK_TYPES:
        blocks = list(cfg.get("block_types") or BLOCK_TYPES[model_type]) * depth
        return ["linear_attention" if b == "recurrent" else "sliding_attention"
                for b in blocks[:depth]]  # fmt: skip
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
    if not window:  # (those sliding every layer have theirs: posenc.hf.settled.every_layer)
        return ["full_attention"] * depth
    raise ValueError(
        f"config gives sliding_window but no layer_types, and which layers of {model_type!r} "
        "slide is its config class's rule: pass the transformers config object"
    )


def _slides(i, pattern):
    return _type(bool((i + 1) % pattern))


def _type(sliding):
    return "sliding_attention" if sliding else "full_attention"


def is_sliding(kind):
    """Whether layers of type ``kind`` slide where the config has a window (HF's
    ``"sliding_attention"``, and kinds named ``"*_sliding"``: ``"hybrid_sliding"``)."""
    return kind == "sliding_attention" or kind.endswith("_sliding")


def window(cfg, kind):
    """The look-back window of a layer of type ``kind`` (``None``: none)."""
    size = cfg.get("sliding_window")
    return int(size) if size and is_sliding(kind) else None


def rotates(cfg, model_type, kind, i):
    """Whether layer ``i`` (of type ``kind``, whose type has rope parameters) rotates (for
    an attention layer: a layer without attention, or of a ``NO_POSITION`` model type, has
    no rope parameters to begin with)."""
    windowed = kind == "sliding_attention" and cfg.get("sliding_window") is not None
    if model_type in ROPE_IF_WINDOW:
        return windowed
    if model_type in ROPE_IF_WINDOW_OR_DENSE:
        mlp = cfg.get("mlp_layer_types")  # else the class derives it: dense below the k
        dense = mlp[i] == "dense" if mlp else i < (cfg.get("first_k_dense_replace") or 0)
        forced = dense and cfg.get("prefix_dense_sliding_window_pattern", 1) == 1
        return windowed or forced
    if model_type in ROPE_IF_SLIDING_OR_NO_WINDOW:
        return cfg.get("sliding_window") is None or kind == "sliding_attention"
    if model_type in ROPE_IF_SLIDING:
        return kind == "sliding_attention"
    return keyed_rope(cfg, model_type)


def keyed_rope(cfg, model_type):
    """Whether a model type of ``ROPE_IF_KEY`` rotates by its config key (``True`` for any
    other model type)."""
    if model_type not in ROPE_IF_KEY:
        return True
    key, value, default, _ = ROPE_IF_KEY[model_type]
    return cfg.get(key, default) == value


def layer_base(cfg, model_type, depth):
    """Each layer's entry of ``layer_rope_theta`` where the model type reads one (0: no
    RoPE; ``None``: the layer type's base), else ``None``."""
    if model_type not in LAYER_THETA:
        return None
    own, every = LAYER_THETA[model_type]
    thetas = cfg.get("layer_rope_theta")
    if thetas is None:
        return [0 if every and (depth - 1 - i) % every == 0 else None for i in range(depth)]
    if len(thetas) != depth:
        raise ValueError(f"layer_rope_theta must have num_hidden_layers={depth} entries, "
                         f"got {len(thetas)}")  # fmt: skip
    return [float(t) if t and own else (None if t else 0) for t in thetas]


def refuse_bidirectional(cfg, model_type):
    """``ValueError`` naming the model type where its windows look both ways (a config
    without ``layer_types`` counts as windowed: its class's rule may give windows)."""
    types = cfg.get("layer_types") or ()
    windowed = any(is_sliding(t) for t in types)
    why = BIDIRECTIONAL.get(model_type)
    if why is None and cfg.get("use_bidirectional_attention"):
        why = BIDIRECTIONAL_FLAG.get(model_type)
        why = why and f"use_bidirectional_attention is set: {why}"
    if why is None and WINDOWED.get(model_type) == "both" and not cfg.get("is_decoder"):
        why = "an encoder's: posenc.hf.windows.WINDOWED"  # T5Gemma's and T5Gemma 2's encoders
    if why and (windowed or not cfg.get("layer_types")):
        raise ValueError(
            f"model_type {model_type!r} is not reproduced: its sliding windows are "
            f"bidirectional ({why}), and posenc's windows look back only"
        )


def per_layer(cfg, model_type, types):
    """Each layer's own settings of ``PER_LAYER_KEYS`` (HF's ``per_layer_config``, else the
    one its config class derives), one dict per layer of ``types``."""
    given = cfg.get("per_layer_config")
    if given is None:
        given = _class_per_layer(cfg, model_type, types)
    if not isinstance(given, Mapping):
        raise ValueError(f"per_layer_config must map layer indices to settings, got {given!r}")
    # a saved config's keys are strings, zero-padded ("05"); an object's per-layer-type views
    # are read by attribute (posenc.hf.config.layer_settings)
    given = {int(i): e for i, e in given.items() if str(i).isdigit() and isinstance(e, Mapping)}
    out = [{k: given.get(i, {}).get(k) for k in PER_LAYER_KEYS
            if given.get(i, {}).get(k) is not None} for i in range(len(types))]  # fmt: skip
    for i, e in enumerate(out):  # Dots3NoteTextConfig refuses such sliding layers too
        if model_type in SWA_WIDTHS and types[i] == "sliding_attention" and len(e) == 3 and \
                e["head_dim"] != e["qk_nope_head_dim"] + e["qk_rope_head_dim"]:  # fmt: skip
            raise ValueError(f"layer {i} (sliding_attention): head_dim={e['head_dim']} must be "
                             f"qk_nope_head_dim + qk_rope_head_dim, got {e['qk_nope_head_dim']} + "
                             f"{e['qk_rope_head_dim']}")  # fmt: skip
    return out


def _class_per_layer(cfg, model_type, types):
    if model_type in GLOBAL_HEAD_DIM:
        over, kind = {"head_dim": cfg.get("global_head_dim", 512)}, "full_attention"
    elif model_type in SWA_WIDTHS:
        head = cfg.get("swa_head_dim", SWA_WIDTHS[model_type][0])
        nope = cfg.get("swa_qk_nope_head_dim", SWA_WIDTHS[model_type][1])
        rope = cfg.get("swa_qk_rope_head_dim", head - nope)
        over = {"head_dim": head, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope}
        kind = "sliding_attention"
    else:
        return {}
    return {i: over for i, t in enumerate(types) if t == kind}
