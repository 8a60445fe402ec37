"""Reading a config as transformers reads it: the dict, the rope parameters, each setting's rule.

A config is a parsed ``config.json`` (a dict) or a transformers config object (read through
its ``to_dict()``; transformers is never imported). Each reader returns one setting and
raises ``ValueError`` naming the key when the config cannot give it.
"""

from __future__ import annotations

from collections.abc import Mapping

from posenc._checks import check_int
from posenc.hf import convert, layers
from posenc.hf.defaults import (
    CLASS_HEAD_DIM,
    CLASS_ORIGINAL,
    CLASS_PARTIAL,
    DERIVED_PARTIAL,
    HALF,
    HF_VERSION,
    INTERLEAVED,
    LEGACY_PARTIAL,
    NEOX_PCT,
    NO_EQUIVALENT,
    PAIRING_KEYS,
    QK_HEAD_DIM_DEFAULT,
    ROPE_PART_HEAD_DIM,
    ROPE_PART_HEAD_DIM_DEFAULT,
    ROPE_TYPES,
)

# the settings read by attribute from a config object when its dict lacks them: an
# ``attribute_map`` alias (DBRX's ``d_model`` is ``hidden_size``, JetMoE's ``kv_channels`` is
# ``head_dim``) or a class default that ``to_dict()`` leaves out (GLM-4-MoE-Lite's head_dim)
ATTRIBUTES = (
    "head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings", "rope_theta",
    "partial_rotary_factor", "rotary_dim", "layer_types", "sliding_window",
    "qk_rope_head_dim", "qk_nope_head_dim", "num_hidden_layers",
)  # fmt: skip


# attribute_map aliases whose stored name is the other one (a config.json holds that name):
# ZambaConfig, Zamba2Config: layer_types -> layers_block_type, head_dim -> attention_head_dim
# (Zamba2's is 2 * hidden_size // num_attention_heads); NemotronHConfig: layers_block_type;
# JetMoeConfig: head_dim -> kv_channels
STORED_AS = {
    **dict.fromkeys(("zamba", "zamba2"), {"layer_types": "layers_block_type",
                                         "head_dim": "attention_head_dim"}),
    "nemotron_h": {"layer_types": "layers_block_type"},
    "jetmoe": {"head_dim": "kv_channels"},  # JetMoeConfig (its class default: CLASS_HEAD_DIM)
}  # fmt: skip


def as_dict(config):
    """A config as a dict: a mapping with its model type's aliases (``STORED_AS``); a config
    object's ``to_dict()`` plus the settings it answers by attribute only (its aliases and
    class defaults)."""
    if isinstance(config, Mapping):
        cfg = dict(config)
        for key, stored in STORED_AS.get(cfg.get("model_type"), {}).items():
            if cfg.get(key) is None and cfg.get(stored) is not None:
                cfg[key] = cfg[stored]
        if cfg.get("model_type") == "nemotron_h" and cfg.get("layer_types"):
            # NemotronHConfig.num_hidden_layers: a property, len(layers_block_type)
            cfg.setdefault("num_hidden_layers", len(cfg["layer_types"]))
        return cfg
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):  # a transformers PretrainedConfig (v4 or v5)
        cfg = dict(to_dict())
    elif hasattr(config, "__dict__"):
        cfg = dict(vars(config))
    else:
        raise ValueError(f"config must be a dict or a transformers config, got {config!r}")
    for key in ATTRIBUTES:
        if cfg.get(key) is None:
            try:
                value = getattr(config, key)
            except (AttributeError, KeyError, TypeError):
                continue
            if value is not None:
                cfg[key] = value
    if (
        cfg.get("head_dim") is None
        and cfg.get("model_type") not in CLASS_HEAD_DIM
        and not (
            cfg.get("embed_dim")  # a vision config: its hidden_size is the merger's output
        )
    ):
        hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
        if isinstance(hidden, int) and isinstance(heads, int) and 0 < heads <= hidden:
            # the object passed its class's checks; the modeling code then takes
            # hidden_size // num_attention_heads, rounded down (GLM-4-MoE's 4096 // 96)
            cfg["head_dim"] = hidden // heads
    return cfg


def text_model(config, *, flat_first=True):
    """A multimodal config's language model and the outer model type: ``(its text_config,
    the config's model_type)`` (an object's own ``text_config``: its ``to_dict()`` has lost
    the attribute-only settings), or ``(config, model_type)`` where it has none -- or, with
    ``flat_first``, where it gives ``num_hidden_layers`` itself (flat text settings)."""
    top = as_dict(config)
    inner = top.get("text_config")
    if inner and not (flat_first and top.get("num_hidden_layers")):
        return getattr(config, "text_config", None) or inner, top.get("model_type")
    return config, top.get("model_type")


def need(params, key, rope_type):
    if key not in params:  # HF raises KeyError when it validates the config
        raise ValueError(f"rope_scaling of type {rope_type!r} needs {key!r}, got {params}")
    return params[key]


def rope_params(cfg, layer_type=None):
    """HF's flat rope dict, as the model type's config class derives it from either layout
    (:func:`posenc.hf.convert.rope_parameters`: ``rope_scaling`` (v4) wins over
    ``rope_parameters`` (v5) in the base rule); where it is per layer type (Gemma 3:
    ``{"sliding_attention": {...}, "full_attention": {...}}``), the set of ``layer_type``."""
    params = convert.rope_parameters(cfg)
    nested = per_type_keys(params, cfg)
    if nested and layer_type is None:
        raise ValueError(
            f"rope parameters are given per layer type {nested}: pass layer_type= (one of "
            f"them), or build the whole model's schedule with Schedule.from_hf"
        )
    if layer_type is not None:
        if not nested:
            return dict(params)  # one set for every layer type
        if layer_type not in params:
            raise ValueError(f"layer_type must be one of {nested}, got {layer_type!r}")
        return dict(params[layer_type])
    return dict(params)


def per_type_keys(params, cfg):
    """The keys of a rope dict given per layer type: a label of ``layer_types`` or a nested
    dict (Gemma 3's ``{"sliding_attention": {...}, "full_attention": {...}}``)."""
    labels = set(cfg.get("layer_types") or ())
    return [k for k, v in params.items() if k in labels or isinstance(v, Mapping)]


def rope_type(params, model_type):
    rope_type = params["rope_type"] if "rope_type" in params else params.get("type", "default")
    if rope_type == "su":
        rope_type = "longrope"  # Phi-3's legacy name (its classes' renames: convert.RENAMED)
    if rope_type in NO_EQUIVALENT:
        why = NO_EQUIVALENT[rope_type]
        raise ValueError(f"rope_type {rope_type!r} has no posenc equivalent: {why}")
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"unknown rope_type {rope_type!r}; transformers {HF_VERSION} knows {ROPE_TYPES}"
        )
    return rope_type


def rope_base(cfg, params, model_type):
    if "rope_theta" in params:
        return params["rope_theta"]
    if model_type in NEOX_PCT:
        return cfg.get("rotary_emb_base", 10_000.0)
    if "rope_theta" in cfg:
        return cfg["rope_theta"]
    raise ValueError(
        "config has no rope_theta; HF's default depends on the model class (10000 for most, "
        "1e6 for e.g. Mixtral, 5e5 for Llama 4): add rope_theta or pass the transformers "
        "config object"
    )


def partial_factor(cfg, params, model_type):
    if "partial_rotary_factor" in params:
        return params["partial_rotary_factor"]
    if model_type in NEOX_PCT:
        return cfg.get("rotary_pct", NEOX_PCT[model_type])
    if model_type == "bamba":  # BambaConfig: kwargs["partial_rotary_factor"] = 0.5, whatever
        return CLASS_PARTIAL[model_type]  # the top level says ("hardcode for BC")
    factor = cfg.get("partial_rotary_factor")
    if factor is None and model_type in DERIVED_PARTIAL:
        top, bottom = DERIVED_PARTIAL[model_type].split(" / ")
        if cfg.get(top) is not None and cfg.get(bottom):
            return cfg[top] / cfg[bottom]  # as the config class derives it
        if model_type in LEGACY_PARTIAL:
            return 1.0  # the legacy key is absent: the class leaves the factor unset
        raise ValueError(
            f"config has no partial_rotary_factor; for model_type={model_type!r} HF derives it "
            f"({DERIVED_PARTIAL[model_type]}): add it, or pass the transformers config object"
        )
    return CLASS_PARTIAL.get(model_type, 1.0) if factor is None else factor


def head_dim(cfg):
    model_type, given = cfg.get("model_type"), cfg.get("head_dim")
    if model_type in ROPE_PART_HEAD_DIM or (
        given is None and model_type in ROPE_PART_HEAD_DIM_DEFAULT
    ):  # latent attention: the RoPE part of a head
        rope_part = cfg.get("qk_rope_head_dim")
        if rope_part is None:
            return CLASS_HEAD_DIM[model_type]
        return check_int("qk_rope_head_dim", rope_part, minimum=1)
    if given is None and model_type in QK_HEAD_DIM_DEFAULT:  # the whole query-key head
        nope, rope = QK_HEAD_DIM_DEFAULT[model_type]
        nope = check_int("qk_nope_head_dim", cfg.get("qk_nope_head_dim", nope), minimum=1)
        return nope + check_int("qk_rope_head_dim", cfg.get("qk_rope_head_dim", rope), minimum=1)
    if given is not None:  # 0 is refused, not taken for "absent"
        return check_int("head_dim", given, minimum=1)
    if model_type in CLASS_HEAD_DIM:
        return CLASS_HEAD_DIM[cfg["model_type"]]
    for key in ("hidden_size", "num_attention_heads"):
        if cfg.get(key) is None:
            hint = "; a multimodal config holds them in text_config" if "text_config" in cfg else ""
            raise ValueError(f"config has no head_dim and no {key}{hint}")
    hidden = check_int("hidden_size", cfg["hidden_size"], minimum=1)
    heads = check_int("num_attention_heads", cfg["num_attention_heads"], minimum=1)
    if hidden % heads:
        raise ValueError(
            f"hidden_size must be divisible by num_attention_heads={heads} when the config "
            f"has no head_dim, got hidden_size={hidden}"
        )
    return hidden // heads


def original_length(cfg, params, model_type, max_pos):
    if "original_max_position_embeddings" in cfg:  # top level wins (Phi-3)
        value = cfg["original_max_position_embeddings"]
    elif model_type in CLASS_ORIGINAL:
        value = CLASS_ORIGINAL[model_type]
    else:
        value = params.get("original_max_position_embeddings", max_pos)
    return check_int("original_max_position_embeddings", value, minimum=1)


def pairing(cfg, model_type):
    """``"interleaved"`` where the model's code (or its config key) rotates adjacent pairs,
    ``"half"`` where it uses HF's ``rotate_half`` (or the config names no model type);
    ``ValueError`` for a model type posenc does not know."""
    if model_type in PAIRING_KEYS:
        key, default = PAIRING_KEYS[model_type]
        return "interleaved" if cfg.get(key, default) else "half"
    if model_type in INTERLEAVED:
        return "interleaved"
    if not model_type or model_type in HALF:  # no model type named: a Llama-style config
        return "half"
    raise ValueError(
        f"model_type {model_type!r} is not one whose pairing posenc knows (transformers "
        f"{HF_VERSION}'s rotary models): pass pairing='half' or 'interleaved' as its "
        "modeling code rotates"
    )


def layer_settings(config, cfg, layer_type):
    """Settings a heterogeneous config overrides for one layer type (Gemma 4's
    ``per_layer_config``: its full-attention layers are 512 wide, the others 256): a dict's
    ``per_layer_config`` or its class's derived one (:func:`posenc.hf.layers.per_layer`), else
    a config object's view of that layer type. ``cfg`` is ``as_dict(config)``."""
    if layer_type is None:
        return {}
    types = list(cfg.get("layer_types") or ())
    if layer_type in types:
        own = layers.per_layer(cfg, cfg.get("model_type"), types)[types.index(layer_type)]
        if "head_dim" in own:
            return {"head_dim": own["head_dim"]}
    per_layer = None if isinstance(config, Mapping) else getattr(config, "per_layer_config", None)
    if per_layer is None:
        return {}
    try:
        view = per_layer[layer_type]
    except Exception:  # noqa: BLE001 -- types that vary by layer index: no one view
        return {}
    out = {}
    for key in ("head_dim",):
        try:
            value = getattr(view, key)
        except Exception:  # noqa: BLE001 -- a view answers only what it overrides
            continue
        if value is not None:
            out[key] = value
    return out
