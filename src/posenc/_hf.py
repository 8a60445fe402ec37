"""Hugging Face bridge: the RoPE of a ``config.json`` as ``RotaryEmbedding`` keyword arguments.

Pure Python/NumPy: transformers is never imported; a config object is read through its
``to_dict()``. The rules mirror transformers 5.23.0 -- ``modeling_rope_utils``
(``standardize_rope_params`` and each ``ROPE_INIT_FUNCTIONS`` entry) and the model
classes that read RoPE keys their own way (GPT-NeoX, Phi-3) -- and are tested against it
in ``tests/test_from_hf.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from posenc._checks import check_int, check_positive
from posenc.scaling import DynamicNTK, Linear, Llama3, LongRoPE, Proportional, YaRN

__all__ = ["from_hf", "HF_VERSION", "ROPE_TYPES"]

HF_VERSION = "5.23.0"
#: ``"default"`` plus the keys of ``ROPE_INIT_FUNCTIONS`` in transformers 5.23.0.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_NO_EQUIVALENT = {  # named in transformers 5.23.0 but not a 1-D RoPE posenc can express
    "axial": "'axial' is the multi-axis RoPE of vision models (2-D/3-D positions)",
}
# GPTNeoXConfig / GPTNeoXJapaneseConfig: `rotary_emb_base` and `rotary_pct` (default below)
_NEOX_PCT = {"gpt_neox": 0.25, "gpt_neox_japanese": 1.0}
# Phi3Config declares a top-level original_max_position_embeddings (default 4096), which
# standardize_rope_params copies over the one in rope_scaling
_CLASS_ORIGINAL = {"phi3": 4096}
# Config classes whose partial_rotary_factor is not 1.0 by default (their __post_init__
# sets it); tests/test_from_hf.py checks this against every class of transformers 5.23.0
_CLASS_PARTIAL = {
    "bamba": 0.5, "dots3_note_audio_encoder": 0.5, "glm": 0.5, "glm4": 0.5, "glm4_moe": 0.5,
    "glm4v_moe_text": 0.5, "glmasr_encoder": 0.5, "moonshine": 0.9, "moonshine_streaming": 0.8,
    "musicflamingo": 0.2, "nemotron": 0.5, "nemotron3_5_transcribe_asr_audio": 0.5,
    "nemotron3_5_transcribe_word_timestamp": 0.5, "persimmon": 0.5, "phi": 0.5,
    "qwen3_5_moe_text": 0.25, "qwen3_5_text": 0.25, "qwen3_next": 0.25, "recurrent_gemma": 0.5,
    "stablelm": 0.25, "efficientloftr": 4.0,
}  # fmt: skip
# ... and those that derive it from other keys: a dict without it cannot be read alone
_DERIVED_PARTIAL = {
    "mistral4": "qk_rope_head_dim / head_dim",
    "minimax_m2": "rotary_dim / head_dim",
    "deepseek_v4": "qk_rope_head_dim / head_dim",
}
# Config classes whose head_dim default is a number, not hidden_size // num_attention_heads
# (Gemma: 256, Qwen3: 128, ...): a dict without head_dim gets the class default, as HF's
# class does; tests/test_from_hf.py checks this against every class of transformers 5.23.0
_CLASS_HEAD_DIM = {
    **dict.fromkeys(("axk2", "minicpm3"), 32),
    **dict.fromkeys(("axk1", "bailing_hybrid", "deepseek_v2", "deepseek_v3", "deepseek_v32",
        "gemma4_vision", "glm_moe_dsa", "gpt_oss", "hy_v4", "kimi_linear",
        "kosmos_2_5_vision_model", "longcat_flash", "mistral_large4_text", "muse_spark_text",
        "neomme", "neucodec", "openai_privacy_filter", "qwen2_5_omni_dit",
        "voxtral_realtime_encoder", "xcodec2", "youtu"), 64),
    **dict.fromkeys(("molmo2_adapter", "molmo2_vision"), 72),
    **dict.fromkeys(("timesfm", "timesfm2_5"), 80),
    **dict.fromkeys(("afmoe", "canary_decoder", "cohere2_moe", "cosmos3_edge_text", "cwm",
        "dia_decoder", "dia_encoder", "ernie4_5", "flint", "glm", "glm4", "helium",
        "higgs_audio_v2", "hrm_text", "hy_v3", "inkling2_text", "inkling_text", "internlm3",
        "iquestcoder", "kolibri1", "laguna", "lfm3", "llama4_text", "mellum", "minimax_m2",
        "minimax_m3_vl_text", "ministral3", "mistral4", "molmo2_text", "muse_glimmer_assistant",
        "muse_glimmer_text", "nemotron_h", "paddleocr_vl_text", "pe_audio_encoder",
        "pe_audio_video_encoder", "pe_video_encoder", "qwen2_5_omni_talker", "qwen3",
        "qwen3_omni_moe_talker_code_predictor", "qwen3_vl_text", "seed_oss", "solar_open",
        "step3p5", "zaya"), 128),
    **dict.fromkeys(("mimo_v2_flash",), 192),
    **dict.fromkeys(("diffusion_gemma_text", "embedding_gemma2_text", "gemma", "gemma2",
        "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "qwen3_5_moe_text",
        "qwen3_5_text", "qwen3_next", "qwen4_exp_text", "t5_gemma_module", "t5gemma2_decoder",
        "t5gemma2_text", "vaultgemma"), 256),
    **dict.fromkeys(("deepseek_v4",), 512),
    **dict.fromkeys(("musicflamingo",), 1280),
}  # fmt: skip
_WITH_ORIGINAL = ("llama3", "yarn", "longrope")


def _as_dict(config):
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):  # a transformers PretrainedConfig (v4 or v5)
        return dict(to_dict())
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise ValueError(f"config must be a dict or a transformers config, got {config!r}")


def _need(params, key, rope_type):
    if key not in params:  # HF raises KeyError when it validates the config
        raise ValueError(f"rope_scaling of type {rope_type!r} needs {key!r}, got {params}")
    return params[key]


def _rope_params(cfg):
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


def _rope_type(params, model_type):
    rope_type = params["rope_type"] if "rope_type" in params else params.get("type", "default")
    if rope_type == "su" or (model_type == "phi3" and rope_type == "yarn"):
        rope_type = "longrope"  # Phi3Config's legacy names for its LongRoPE
    if rope_type in _NO_EQUIVALENT:
        why = _NO_EQUIVALENT[rope_type]
        raise ValueError(f"rope_type {rope_type!r} has no posenc equivalent: {why}")
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"unknown rope_type {rope_type!r}; transformers {HF_VERSION} knows {ROPE_TYPES}"
        )
    return rope_type


def _base(cfg, params, model_type):
    if "rope_theta" in params:
        return params["rope_theta"]
    if model_type in _NEOX_PCT:
        return cfg.get("rotary_emb_base", 10_000.0)
    if "rope_theta" in cfg:
        return cfg["rope_theta"]
    raise ValueError(
        "config has no rope_theta; HF's default depends on the model class (10000 for most, "
        "1e6 for e.g. Mixtral, 5e5 for Llama 4): add rope_theta or pass the transformers "
        "config object"
    )


def _partial_factor(cfg, params, model_type):
    if "partial_rotary_factor" in params:
        return params["partial_rotary_factor"]
    if model_type in _NEOX_PCT:
        return cfg.get("rotary_pct", _NEOX_PCT[model_type])
    factor = cfg.get("partial_rotary_factor")
    if factor is None and model_type in _DERIVED_PARTIAL:
        raise ValueError(
            f"config has no partial_rotary_factor; for model_type={model_type!r} HF derives it "
            f"({_DERIVED_PARTIAL[model_type]}): add it, or pass the transformers config object"
        )
    return _CLASS_PARTIAL.get(model_type, 1.0) if factor is None else factor


def _head_dim(cfg):
    if cfg.get("head_dim") is not None:  # 0 is refused, not taken for "absent"
        return check_int("head_dim", cfg["head_dim"], minimum=1)
    if cfg.get("model_type") in _CLASS_HEAD_DIM:
        return _CLASS_HEAD_DIM[cfg["model_type"]]
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


def _original(cfg, params, model_type, max_pos):
    if "original_max_position_embeddings" in cfg:  # top level wins (Phi-3)
        value = cfg["original_max_position_embeddings"]
    elif model_type in _CLASS_ORIGINAL:
        value = _CLASS_ORIGINAL[model_type]
    else:
        value = params.get("original_max_position_embeddings", max_pos)
    return check_int("original_max_position_embeddings", value, minimum=1)


def from_hf(config):
    """Keyword arguments of :class:`posenc.torch.RotaryEmbedding` for a Hugging Face config.

    Reads a ``config.json`` the way transformers 5.23.0 does: v4 ``rope_scaling`` (with
    ``type`` or ``rope_type``; it wins over ``rope_parameters`` when both are given) or v5
    ``rope_parameters``; ``rope_theta`` and ``partial_rotary_factor`` inside them or at the
    top level; GPT-NeoX's ``rotary_emb_base``/``rotary_pct`` (default 0.25); a top-level
    ``original_max_position_embeddings`` overriding the one in ``rope_scaling`` (Phi-3,
    whose class defaults it to 4096), else ``max_position_embeddings``. HF's defaults fill
    absent keys: YaRN's ``factor`` (if null) ``max_position_embeddings /
    original_max_position_embeddings``, ``beta_fast``/``beta_slow`` 32/1 (also when 0),
    ``truncate`` True, attention factor ``0.1 ln(factor) + 1`` or, with both ``mscale`` and
    ``mscale_all_dim``, their ratio; LongRoPE's ``factor`` the same ratio (attention factor
    ``sqrt(1 + ln(factor) / ln(original))``, 1.19 for Phi-3-mini-128k); dynamic NTK's
    original length is ``max_position_embeddings``. Phi-3's legacy ``"su"`` means
    ``"longrope"``.

    Parameters
    ----------
    config : dict or object
        A parsed ``config.json``, or a transformers ``PretrainedConfig`` (any object with
        ``to_dict()``; transformers is not imported). A dict without ``rope_theta`` raises,
        since HF's default depends on the model class; the config object carries it.

    Returns
    -------
    dict
        ``head_dim`` (``head_dim``, else the config class's default where it is a number, as
        Gemma's 256, else ``hidden_size // num_attention_heads``), ``base``,
        ``scaling`` (a :mod:`posenc.scaling` object, None for ``"default"``), ``rotary_dim``
        (``int(head_dim * partial_rotary_factor)``, None when the whole head rotates) and
        ``max_len`` (``max_position_embeddings``, or the context a scaling reaches if
        longer: ``factor`` times its original length -- 131072 for Qwen2.5 with YaRN x4).

    Raises
    ------
    ValueError
        For an unknown rope type (the message lists the known ones), ``"axial"`` (vision,
        no 1-D equivalent), rope parameters nested per layer type, a missing key HF requires,
        or a bad value (named, with the value).

    Examples
    --------
    >>> import posenc
    >>> phi3 = {  # Phi-3-mini-128k's RoPE keys, with 4 pairs instead of 48
    ...     "model_type": "phi3", "hidden_size": 32, "num_attention_heads": 4,
    ...     "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    ...     "rope_theta": 10000.0,
    ...     "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.0, 1.5, 2.0],
    ...                      "long_factor": [1.0, 2.0, 8.0, 32.0]},
    ... }
    >>> kwargs = posenc.scaling.from_hf(phi3)
    >>> kwargs["head_dim"], kwargs["rotary_dim"], kwargs["max_len"], kwargs["scaling"].factor
    (8, None, 131072, 32.0)
    >>> inv, scale = posenc.rope_frequencies(8, base=kwargs["base"], scaling=kwargs["scaling"])
    >>> round(scale, 4)  # HF's attention factor: sqrt(1 + ln 32 / ln 4096)
    1.1902

    ``posenc.torch.RotaryEmbedding(**kwargs)`` builds the module.
    """
    cfg = _as_dict(config)
    model_type = cfg.get("model_type")
    text = ("hidden_size", "head_dim", "rope_theta", "rope_parameters", "rope_scaling")
    if "text_config" in cfg and not any(key in cfg for key in text):
        raise ValueError(
            "config is multimodal: its language model's settings are in text_config; "
            "pass config['text_config'] (or config.text_config)"
        )
    params = _rope_params(cfg)
    rope_type = _rope_type(params, model_type)
    base = check_positive("rope_theta", _base(cfg, params, model_type))
    head_dim = _head_dim(cfg)
    if cfg.get("max_position_embeddings") is None:
        raise ValueError("config has no max_position_embeddings")
    max_pos = check_int("max_position_embeddings", cfg["max_position_embeddings"], minimum=1)
    fraction = check_positive("partial_rotary_factor", _partial_factor(cfg, params, model_type))
    rotary = int(head_dim * fraction)
    if rope_type != "proportional" and (rotary % 2 or not 2 <= rotary <= head_dim):
        raise ValueError(
            f"partial_rotary_factor={fraction} gives a rotary width of {rotary} for "
            f"head_dim={head_dim}: posenc needs an even width in [2, head_dim] "
            "(HF rounds an odd width up)"
        )
    original = _original(cfg, params, model_type, max_pos) if rope_type in _WITH_ORIGINAL else 0

    if rope_type == "default":
        scaling = None
    elif rope_type == "linear":
        scaling = Linear(_need(params, "factor", rope_type))
    elif rope_type == "dynamic":
        scaling = DynamicNTK(_need(params, "factor", rope_type), max_pos)
    elif rope_type == "yarn":
        factor = _need(params, "factor", rope_type)
        scaling = YaRN(
            max_pos / original if factor is None else factor,
            original,
            beta_fast=params.get("beta_fast") or 32.0,
            beta_slow=params.get("beta_slow") or 1.0,
            attention_factor=params.get("attention_factor"),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
        )
    elif rope_type == "longrope":
        factor = params.get("factor")
        short = _need(params, "short_factor", rope_type)
        mscales = {}
        if model_type == "phimoe":  # PhimoeRotaryEmbedding (5.23.0): its own scales, and the
            # rates of its rope init without a length, i.e. the short factors at every length
            mscales = {k: _need(params, k, rope_type) for k in ("short_mscale", "long_mscale")}
        scaling = LongRoPE(
            short,
            short if mscales else _need(params, "long_factor", rope_type),
            original,
            max_pos / original if factor is None else factor,
            attention_factor=params.get("attention_factor"),
            **mscales,
        )
    elif rope_type == "llama3":
        scaling = Llama3(
            _need(params, "factor", rope_type),
            _need(params, "low_freq_factor", rope_type),
            _need(params, "high_freq_factor", rope_type),
            original,
        )
    else:  # "proportional": the fraction shapes the rates, the whole head is passed on
        scaling, rotary = Proportional(fraction, params.get("factor", 1.0)), head_dim
    # the table must reach the context the scaling is for: factor x the length it extends
    reach = {"linear": max_pos, "dynamic": max_pos, "yarn": original, "llama3": original}
    reach["longrope"] = original
    if rope_type in reach:
        max_pos = max(max_pos, math.ceil(scaling.factor * reach[rope_type]))
    return {
        "head_dim": head_dim,
        "base": base,
        "scaling": scaling,
        "rotary_dim": None if rotary == head_dim else rotary,
        "max_len": max_pos,
    }
