"""A config's RoPE as :class:`posenc.torch.RotaryEmbedding` keyword arguments (``from_hf``)."""

from __future__ import annotations

import math

from posenc._checks import check_int, check_positive
from posenc.hf import config as read
from posenc.hf import layers as rules
from posenc.hf.defaults import (
    CLASS_MAX_LEN,
    PARTIAL_DEFAULT,
    QK_HEAD_DIM_DEFAULT,
    ROPE_PART_HEAD_DIM,
    ROPE_PART_HEAD_DIM_DEFAULT,
    UNSUPPORTED,
    WITH_ORIGINAL,
)
from posenc.scaling import DynamicNTK, Linear, Llama3, LongRoPE, Proportional, YaRN

__all__ = ["from_hf"]

# latent attention, whose attention rotates a slice of qk_rope_head_dim channels: HF's default
# init ignores a factor there too, and its model then fails (a table wider than the slice), so
# posenc keeps the factor's width, which schedule_from_hf checks against qk_rope_head_dim
LATENT = ROPE_PART_HEAD_DIM | ROPE_PART_HEAD_DIM_DEFAULT | frozenset(QK_HEAD_DIM_DEFAULT)


def from_hf(config, *, layer_type=None, pairing=None):
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
    ``"longrope"``. Where a model type's config class converts the flat 4.x keys its own way,
    they are read as it converts them (``posenc.hf.convert``): Gemma 3's ``rope_scaling``
    and ``rope_theta`` are its full-attention layers', ``rope_local_base_freq`` its sliding
    layers' (pass ``layer_type``); OLMo 3's ``rope_scaling`` is its full-attention layers'.

    Parameters
    ----------
    config : dict or object
        A parsed ``config.json``, or a transformers ``PretrainedConfig`` (any object with
        ``to_dict()``; transformers is not imported). A dict without ``rope_theta`` raises,
        since HF's default depends on the model class; the config object carries it.
    layer_type : str, optional
        Where ``rope_parameters`` is nested per layer type (Gemma 3's
        ``"sliding_attention"`` and ``"full_attention"``), the layer type to read.
    pairing : {"half", "interleaved"}, optional
        The model's pairing, for a model type posenc's tables do not hold (they hold
        every rotary model of transformers 5.23.0: a model type outside them is refused
        without it).

    Returns
    -------
    dict
        ``head_dim`` (``head_dim``, else the config class's default where it is a number, as
        Gemma's 256, else ``hidden_size // num_attention_heads``), ``pairing``
        (``"interleaved"`` where the model's code rotates adjacent pairs, as GLM-4, Cohere
        and DeepSeek-V3 do, else ``"half"``), ``base``,
        ``scaling`` (a :mod:`posenc.scaling` object, None for ``"default"``), ``rotary_dim``
        (``int(head_dim * partial_rotary_factor)``, None when the whole head rotates; for
        rope type ``"default"`` only where the model type's rotary class reads the factor,
        ``posenc.hf.defaults.PARTIAL_DEFAULT`` -- GLM, Phi, StableLM, ...: Llama's and most
        others' default RoPE ignores it and rotates the whole head) and
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
    cfg = read.as_dict(config)
    cfg |= read.layer_settings(config, cfg, layer_type)
    model_type = cfg.get("model_type")
    if model_type in UNSUPPORTED:
        raise ValueError(f"model_type {model_type!r} is not reproduced: {UNSUPPORTED[model_type]}")
    if not rules.keyed_rope(cfg, model_type):
        key, value, default, other = rules.ROPE_IF_KEY[model_type]
        if other is not None:  # another scheme, not merely no position
            raise ValueError(
                f"{model_type} with {key}={cfg.get(key, default)!r} uses {other}, not RoPE "
                f"(only {key}={value!r} rotates): posenc builds no RoPE for it"
            )
    text = ("hidden_size", "head_dim", "rope_theta", "rope_parameters", "rope_scaling")
    if "text_config" in cfg and not any(key in cfg for key in text):
        raise ValueError(
            "config is multimodal: its language model's settings are in text_config; "
            "pass config['text_config'] (or config.text_config)"
        )
    params = read.rope_params(cfg, layer_type)
    rope_type = read.rope_type(params, model_type)
    base = check_positive("rope_theta", read.rope_base(cfg, params, model_type))
    head_dim = read.head_dim(cfg)
    if cfg.get("max_position_embeddings") is None and model_type in CLASS_MAX_LEN:
        cfg["max_position_embeddings"] = CLASS_MAX_LEN[model_type]  # the class sets none
    if cfg.get("max_position_embeddings") is None:
        raise ValueError("config has no max_position_embeddings")
    max_pos = check_int("max_position_embeddings", cfg["max_position_embeddings"], minimum=1)
    # a factor derived from head_dim (MiniMax-M2) uses the class's where the config has none
    derived = read.partial_factor({**cfg, "head_dim": head_dim}, params, model_type)
    fraction = check_positive("partial_rotary_factor", derived)
    rotary = int(head_dim * fraction)
    if rope_type != "proportional" and (rotary % 2 or not 2 <= rotary <= head_dim):
        raise ValueError(
            f"partial_rotary_factor={fraction} gives a rotary width of {rotary} for "
            f"head_dim={head_dim}: posenc needs an even width in [2, head_dim] "
            "(HF rounds an odd width up)"
        )
    if rope_type == "default" and model_type and model_type not in PARTIAL_DEFAULT | LATENT:
        rotary = head_dim  # its class's default init ignores the factor: the whole head rotates
    original = 0
    if rope_type in WITH_ORIGINAL:
        original = read.original_length(cfg, params, model_type, max_pos)

    if rope_type == "default":
        scaling = None
    elif rope_type == "linear":
        scaling = Linear(read.need(params, "factor", rope_type))
    elif rope_type == "dynamic":
        scaling = DynamicNTK(read.need(params, "factor", rope_type), max_pos)
    elif rope_type == "yarn":
        factor = read.need(params, "factor", rope_type)
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
        short = read.need(params, "short_factor", rope_type)
        mscales = {}
        if model_type == "phimoe":  # PhimoeRotaryEmbedding (5.23.0): its own scales, and the
            # rates of its rope init without a length, i.e. the short factors at every length
            mscales = {k: read.need(params, k, rope_type) for k in ("short_mscale", "long_mscale")}
            # it switches scales past rope_parameters' original length: a top-level key is
            # overwritten there (PhimoeConfig declares none), so max_position_embeddings
            original = check_int(
                "original_max_position_embeddings",
                params.get("original_max_position_embeddings", max_pos),
                minimum=1,
            )
        scaling = LongRoPE(
            short,
            short if mscales else read.need(params, "long_factor", rope_type),
            original,
            max_pos / original if factor is None else factor,
            attention_factor=params.get("attention_factor"),
            **mscales,
        )
    elif rope_type == "llama3":
        scaling = Llama3(
            read.need(params, "factor", rope_type),
            read.need(params, "low_freq_factor", rope_type),
            read.need(params, "high_freq_factor", rope_type),
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
        "pairing": read.pairing(cfg, model_type) if pairing is None else pairing,
        "base": base,
        "scaling": scaling,
        "rotary_dim": None if rotary == head_dim else rotary,
        "max_len": max_pos,
    }
