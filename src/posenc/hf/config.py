"""Reading a config as transformers reads it: the dict, the rope parameters, each setting's rule.

A config is a parsed ``config.json`` (a dict) or a transformers config object (read through
its ``to_dict()``; transformers is never imported). Each reader returns one setting and
raises ``ValueError`` naming the key when the config cannot give it.
"""

from __future__ import annotations

from collections.abc import Mapping

from posenc._checks import check_int
from posenc.hf.defaults import (
    CLASS_HEAD_DIM,
    CLASS_ORIGINAL,
    CLASS_PARTIAL,
    DERIVED_PARTIAL,
    HF_VERSION,
    NEOX_PCT,
    NO_EQUIVALENT,
    ROPE_TYPES,
)


def as_dict(config):
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):  # a transformers PretrainedConfig (v4 or v5)
        return dict(to_dict())
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise ValueError(f"config must be a dict or a transformers config, got {config!r}")


def need(params, key, rope_type):
    if key not in params:  # HF raises KeyError when it validates the config
        raise ValueError(f"rope_scaling of type {rope_type!r} needs {key!r}, got {params}")
    return params[key]


def rope_params(cfg):
    """HF's flat rope dict: ``rope_scaling`` (v4) wins over ``rope_parameters`` (v5)."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_scaling/rope_parameters must be a dict, got {params!r}")
    labels = set(cfg.get("layer_types") or ())
    nested = [k for k, v in params.items() if k in labels or isinstance(v, Mapping)]
    if nested:
        raise ValueError(
            f"rope parameters are given per layer type {nested}; from_hf reads one flat set: "
            "pass a config holding one of them as rope_parameters"
        )
    return dict(params)


def rope_type(params, model_type):
    rope_type = params["rope_type"] if "rope_type" in params else params.get("type", "default")
    if rope_type == "su" or (model_type == "phi3" and rope_type == "yarn"):
        rope_type = "longrope"  # Phi3Config's legacy names for its LongRoPE
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
    factor = cfg.get("partial_rotary_factor")
    if factor is None and model_type in DERIVED_PARTIAL:
        raise ValueError(
            f"config has no partial_rotary_factor; for model_type={model_type!r} HF derives it "
            f"({DERIVED_PARTIAL[model_type]}): add it, or pass the transformers config object"
        )
    return CLASS_PARTIAL.get(model_type, 1.0) if factor is None else factor


def head_dim(cfg):
    if cfg.get("head_dim") is not None:  # 0 is refused, not taken for "absent"
        return check_int("head_dim", cfg["head_dim"], minimum=1)
    if cfg.get("model_type") in CLASS_HEAD_DIM:
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
