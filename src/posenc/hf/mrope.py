"""A multimodal config's M-RoPE (Qwen-VL, GLM-4V, Cosmos 3, ...) as :class:`posenc.torch.MRoPE`
arguments, laid out as each model type's rotary class lays it out."""

from __future__ import annotations

from posenc.hf import config as read

__all__ = ["mrope_from_hf", "MROPE_LAYOUT", "NO_MROPE", "TEXT_OF"]

# M-RoPE as each model type's text rotary class and apply function (transformers 5.23.0) lay
# it out, whatever the config's keys say: model type -> (sections "interleaved" (Qwen3-VL's
# recomposition: pair j to axis j % 3 while that axis has pairs) or "consecutive" (Qwen2-VL's
# split), the apply function's pairing, the class's default mrope_section ("quarters": two
# axes of rotary_dim // 4 pairs each, NeoMME), whether the class reads partial_rotary_factor).
# tests/test_from_hf_mrope.py checks every entry against the class and its apply function.
_QWEN2 = ("consecutive", "half", (16, 24, 24), False)  # Qwen2VLRotaryEmbedding & kin
_QWEN3 = ("interleaved", "half", (24, 20, 20), False)  # Qwen3VLTextRotaryEmbedding & kin
_QWEN35 = ("interleaved", "half", (11, 11, 10), True)  # Qwen3_5TextRotaryEmbedding & kin
_GLM4V = ("consecutive", "interleaved", (8, 12, 12), True)  # repeat_interleave, rotate_half_llm
_GLM4V_MOE = ("consecutive", "half", (8, 12, 12), True)  # cat((freq, freq)), rotate_half
MROPE_LAYOUT = {
    **dict.fromkeys(("qwen2_vl_text", "qwen2_5_vl_text", "paddleocr_vl_text", "qwen2_5_omni_text",
                     "qwen2_5_omni_talker"), _QWEN2),
    **dict.fromkeys(("qwen3_vl_text", "qwen3_vl_moe_text", "cosmos3_edge_text",
                     "cohere_compass_text", "qwen3_omni_moe_text", "qwen3_omni_moe_talker_text"),
                    _QWEN3),
    **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"), _QWEN35),
    **dict.fromkeys(("glm4v_text", "glm_ocr_text"), _GLM4V),
    **dict.fromkeys(("glm4v_moe_text", "glm_image_text"), _GLM4V_MOE),
    "neomme": ("interleaved", "half", "quarters", True),  # NeoMMERotaryEmbedding: (row, col)
}  # fmt: skip
# a multimodal model type -> the model type of its text config class (which a text_config
# without a model type, or a flat v4 file, becomes in transformers)
TEXT_OF = {
    "qwen2_vl": "qwen2_vl_text", "qwen2_5_vl": "qwen2_5_vl_text",
    "paddleocr_vl": "paddleocr_vl_text", "qwen2_5_omni_thinker": "qwen2_5_omni_text",
    "qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text",
    "cosmos3_edge": "cosmos3_edge_text", "cosmos3_omni": "qwen3_vl_text",
    "cohere_compass": "cohere_compass_text", "qwen3_omni_moe_thinker": "qwen3_omni_moe_text",
    "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "qwen4_exp": "qwen4_exp_text",
    "minicpmv4_7": "qwen3_5_text", "glm4v": "glm4v_text", "glm46v": "glm4v_text",
    "glm_ocr": "glm_ocr_text", "glm4v_moe": "glm4v_moe_text", "glm_image": "glm_image_text",
    "ernie4_5_vl_moe": "ernie4_5_vl_moe_text", "hunyuan_vl": "hunyuan_vl_text",
}  # fmt: skip
# M-RoPE layouts posenc does not build, and why (mrope_from_hf refuses them by name)
NO_MROPE = {
    "ernie4_5_vl_moe_text": "Ernie4_5_VLMoeTextRotaryEmbedding alternates height and width "
    "pairs and puts time on the last pairs (sections read as (h, w, t)), a layout MRoPE does "
    "not offer",
    "hunyuan_vl_text": "HunYuanVLRotaryEmbedding splits the doubled angles [freq, freq] by "
    "2 * mrope_section, so the two halves of a rotated pair can turn with different axes",
}


def mrope_from_hf(config, *, layer_type=None):
    """Keyword arguments of :class:`posenc.torch.MRoPE` for a multimodal config.

    Reads the text model's head width, ``rope_theta``, ``mrope_section``,
    ``partial_rotary_factor`` and ``max_position_embeddings``, from ``rope_scaling`` (v4
    files) or ``rope_parameters`` (transformers 5). Where the model's rotary class fixes the
    layout (``MROPE_LAYOUT``: Qwen3-VL, Cosmos 3 and Qwen3.5 interleave their sections,
    Qwen2-VL and GLM-4V do not, whatever ``mrope_interleaved`` says; GLM-4V rotates adjacent
    pairs; Qwen3.5 and GLM-4V rotate the first ``partial_rotary_factor`` of a head), the
    model type decides, as in transformers; for another model type, ``mrope_interleaved``.

    Parameters
    ----------
    config : dict or object
        A parsed ``config.json`` (its ``text_config`` if it has one) or a transformers
        config object.
    layer_type : str, optional
        The layer type whose rope parameters to read, where they are given per layer type
        (NeoMME, Cohere Compass).

    Returns
    -------
    dict
        ``head_dim``, ``sections``, ``base``, ``interleaved``, ``rotary_dim`` (None: the
        whole head), ``pairing`` and ``max_len``.

    Examples
    --------
    >>> from posenc.hf import mrope_from_hf
    >>> cfg = {"hidden_size": 1536, "num_attention_heads": 12, "rope_theta": 1e6,
    ...        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    >>> mrope_from_hf(cfg)["sections"]
    (16, 24, 24)
    >>> qwen35 = {"model_type": "qwen3_5_text", "head_dim": 256, "hidden_size": 1024,
    ...           "num_attention_heads": 4, "rope_parameters": {"rope_theta": 1e7,
    ...           "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}}
    >>> {k: mrope_from_hf(qwen35)[k] for k in ("sections", "interleaved", "rotary_dim")}
    {'sections': (11, 11, 10), 'interleaved': True, 'rotary_dim': 64}
    """
    config, outer = read.text_model(config, flat_first=False)
    cfg = read.as_dict(config)
    model_type = cfg.get("model_type") or outer
    model_type = TEXT_OF.get(model_type, model_type)
    cfg = {**cfg, "model_type": model_type}
    if model_type in NO_MROPE:
        raise ValueError(f"model_type {model_type!r} is not reproduced: {NO_MROPE[model_type]}")
    given = cfg.get("rope_parameters")
    if layer_type is not None and isinstance(given, dict) and given.get(layer_type, 1) is None:
        raise ValueError(f"layer_type {layer_type!r} has no RoPE (its rope_parameters are None)")
    params = read.rope_params(cfg, layer_type)
    kind = params.get("rope_type", params.get("type", "default"))
    layout = MROPE_LAYOUT.get(model_type)  # what the model's rotary class does
    section = params.get("mrope_section") or (layout and layout[2])
    if kind not in ("default", "mrope") or not section:
        why = "" if kind not in ("default", "mrope") or layout else (
            f" (model_type={model_type!r} has no class default posenc knows)"
        )  # fmt: skip
        raise ValueError(f"config must give an unscaled rope with mrope_section{why}, got {params}")
    head_dim = read.head_dim(cfg)
    rotary = head_dim
    if layout and layout[3]:  # the class rotates int(head_dim * partial_rotary_factor)
        rotary = int(head_dim * read.partial_factor(cfg, params, model_type))
    if layout and layout[2] == "quarters":
        section = (rotary // 4, rotary // 4)
    # the model's code decides the layout where it fixes one; else the config's key does
    interleaved = layout[0] == "interleaved" if layout else bool(params.get("mrope_interleaved"))
    return {
        "head_dim": head_dim,
        "sections": _sections(tuple(section), rotary, interleaved),
        "base": params.get("rope_theta", cfg.get("rope_theta", 10_000.0)),
        "interleaved": interleaved,
        "rotary_dim": None if rotary == head_dim else rotary,
        "pairing": layout[1] if layout else "half",
        "max_len": cfg.get("max_position_embeddings", 4096),
    }


def _sections(section, rotary, interleaved):
    """The pairs each axis gets: Qwen3-VL's interleaving reads only the later axes' counts
    (pair ``j = a (mod n)``, ``a > 0``, turns with axis ``a`` while ``j < n * section[a]``)
    and gives every other pair to axis 0, whatever ``section[0]`` says."""
    if not interleaved or rotary % 2:
        return section  # MRoPE checks the sum
    n, pairs = len(section), rotary // 2
    later = [sum(1 for j in range(a, min(n * s, pairs), n)) for a, s in enumerate(section)][1:]
    return (pairs - sum(later), *later)
