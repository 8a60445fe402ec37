"""The rope parameters a transformers config class derives from a config dict.

transformers 5.23.0 reads a ``config.json``'s RoPE settings in its config class's
``convert_rope_params_to_dict`` (the base one in ``modeling_rope_utils.py``; 26 classes
override it): the flat keys a 4.x file holds (``rope_theta``, ``rope_scaling``,
``rope_local_base_freq``, ...) become v5 ``rope_parameters``, one dict or one per layer type.
:func:`rope_parameters` does the same for a dict, per model type; each table entry names the
class it follows, and ``tests/test_from_hf_layouts.py`` checks every one against that class.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from posenc.hf.defaults import WITH_ORIGINAL

_FULL, _SLIDING = "full_attention", "sliding_attention"
_GEMMA = ((_FULL,), ((_FULL, "rope_theta", 1e6), (_SLIDING, "rope_local_base_freq", 1e4)))
# Per-layer-type classes that convert the flat layout: model type -> (the layer types a flat
# ``rope_scaling`` is merged into, ((layer type, the flat key of its base, the class's default
# base), ...)). Each key is popped once, in this order: a second read gets the default.
PER_TYPE = {
    # Gemma3TextConfig.convert_rope_params_to_dict (models/gemma3/configuration_gemma3.py):
    # rope_scaling and rope_theta go to the full layers, rope_local_base_freq to the sliding ones
    "gemma3_text": _GEMMA,
    # Gemma3nTextConfig (models/gemma3n/configuration_gemma3n.py): Gemma 3's conversion
    "gemma3n_text": _GEMMA,
    # T5Gemma2TextConfig, T5Gemma2DecoderConfig (models/t5gemma2/configuration_t5gemma2.py)
    "t5gemma2_text": _GEMMA,
    "t5gemma2_decoder": _GEMMA,
    # Olmo3Config (models/olmo3/configuration_olmo3.py): rope_scaling to the full layers only;
    # both read rope_theta, but the full layers pop it, so the sliding ones keep 5e5
    "olmo3": ((_FULL,), ((_FULL, "rope_theta", 5e5), (_SLIDING, "rope_theta", 5e5))),
    # ModernBertConfig, ModernBertDecoderConfig (models/modernbert*/configuration_*.py):
    # rope_scaling to both layer types, global_rope_theta and local_rope_theta their bases
    **dict.fromkeys(
        ("modernbert", "modernbert-decoder"),
        (
            (_FULL, _SLIDING),
            ((_FULL, "global_rope_theta", 160_000.0), (_SLIDING, "local_rope_theta", 1e4)),
        ),
    ),  # fmt: skip
}
# ... of which these refuse a flat rope_parameters (ModernBertConfig's field is typed
# dict[Literal["full_attention", "sliding_attention"], dict]); the others ignore its keys
NESTED_ONLY = frozenset(("modernbert", "modernbert-decoder"))
# Classes whose conversion posenc does not repeat, and why: a dict without rope_parameters
# is refused for them (their rope_parameters, or the config object, are read as HF reads them)
NEEDS_V5 = {
    # their convert_rope_params_to_dict returns at once: the flat keys are ignored (rope_scaling
    # even replaces rope_parameters unchecked) and the class defaults stand
    **dict.fromkeys(
        (
            "beam",
            "diffusion_gemma_text",
            "embedding_gemma2_text",
            "gemma4_text",
            "gemma4_unified_text",
            "laguna",
            "mellum",
            "mimo_v2_flash",
            "zaya",
            "cohere_compass_text",
        ),
        "its config class ignores the flat keys (rope_theta, rope_scaling) and keeps its own "
        "per-layer-type defaults",
    ),  # fmt: skip
    # NeoMMEConfig: per-layer-type default bases and partial factors of its own
    "neomme": "its config class derives per-layer-type bases and partial factors of its own",
    # Dots3NoteTextConfig: swa_rope_theta, and a partial factor per layer from per_layer_config
    "dots3_note_text": "its config class derives per-layer-type bases (swa_rope_theta) and "
    "partial factors (qk_rope_head_dim / head_dim per layer) of its own",
}
# rope types a class renames while converting: model type -> {name in the file: HF's name}
RENAMED = {
    # Phi3Config, Phi4MultimodalConfig: "su" and "yarn" were their names for LongRoPE
    **dict.fromkeys(("phi3", "phi4_multimodal"), {"su": "longrope", "yarn": "longrope"}),
    # HunYuanVLTextConfig: "xdrope" is dynamic NTK
    "hunyuan_vl_text": {"xdrope": "dynamic"},
}


def rope_parameters(cfg):
    """HF's ``config.rope_parameters`` for a config dict: flat, or one dict per layer type.

    The base rule (``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``): a v4
    ``rope_scaling`` replaces ``rope_parameters``; the readers of :mod:`posenc.hf.config` then
    take ``rope_theta`` and ``partial_rotary_factor`` from it or from the top level. The classes
    in ``PER_TYPE`` build the per-layer-type dicts from the flat keys; those in ``NEEDS_V5``
    need ``rope_parameters`` given. The input is not modified.

    Examples
    --------
    >>> from posenc.hf.convert import rope_parameters
    >>> gemma3 = {"model_type": "gemma3_text", "rope_theta": 1e6,  # a 4.x config.json
    ...           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    >>> params = rope_parameters(gemma3)  # the scaling is the full layers' only
    >>> params["sliding_attention"], params["full_attention"]["factor"]
    ({'rope_type': 'default', 'rope_theta': 10000.0}, 8.0)
    """
    model_type = cfg.get("model_type")
    for key in ("rope_scaling", "rope_parameters"):
        if cfg.get(key) is not None and not isinstance(cfg[key], Mapping):
            raise ValueError(f"rope_scaling/rope_parameters must be a dict, got {cfg[key]!r}")
    if model_type in PER_TYPE:
        params = _per_type(cfg, model_type, *PER_TYPE[model_type])
    elif model_type in NEEDS_V5 and not cfg.get("rope_parameters"):
        raise ValueError(
            f"config has no rope_parameters, and for model_type={model_type!r} "
            f"{NEEDS_V5[model_type]}: give rope_parameters per layer type, or pass the "
            "transformers config object"
        )
    else:
        params = copy.deepcopy(dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}))
    renamed = RENAMED.get(model_type, {})
    for entry in [params, *(v for v in params.values() if isinstance(v, dict))]:
        kind = entry.get("rope_type", entry.get("type"))
        if kind in renamed:
            entry["rope_type"] = renamed[kind]
    return params


def _per_type(cfg, model_type, scaled, bases):
    given = cfg.get("rope_parameters")
    if model_type in NESTED_ONLY and given and set(given) - {_FULL, _SLIDING}:
        raise ValueError(
            f"rope_parameters must be given per layer type ({_FULL!r}, {_SLIDING!r}) for "
            f"model_type={model_type!r}, as its config class requires, got {given}"
        )
    plain = {"rope_type": "default"}  # so a merged v4 {"type": ...} leaves it the default
    params = copy.deepcopy(dict(given)) if given is not None else {_SLIDING: plain, _FULL: plain}
    scaling = cfg.get("rope_scaling")
    if scaling is not None:
        for kind in scaled:
            if not isinstance(params.get(kind), Mapping):
                raise ValueError(
                    f"{model_type}'s config class merges rope_scaling into rope_parameters"
                    f"[{kind!r}], which is {params.get(kind)!r}"
                )
            params[kind] = {**params[kind], **scaling}
    popped = set()
    for kind, key, default in bases:
        value = default if key in popped or cfg.get(key) is None else cfg[key]
        popped.add(key)
        entry = params[kind] = dict(params.get(kind) or plain)
        entry.setdefault("rope_theta", value)
        # standardize_rope_params, per layer type: the type, and the length a scaling extends
        entry.setdefault("rope_type", entry.get("type", "default"))
        if entry["rope_type"] in WITH_ORIGINAL and cfg.get("max_position_embeddings"):
            entry.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    return params
