"""A Qwen2-VL / Qwen2.5-VL / Qwen3-VL config's M-RoPE as :class:`posenc.torch.MRoPE` arguments."""

from __future__ import annotations

from posenc.hf import config as read
from posenc.hf.defaults import MROPE_CLASS

__all__ = ["mrope_from_hf"]


def mrope_from_hf(config):
    """Keyword arguments of :class:`posenc.torch.MRoPE` for a Qwen-VL config.

    Reads the text model's head width, ``rope_theta``, ``mrope_section``,
    ``mrope_interleaved`` and ``max_position_embeddings``, from ``rope_scaling`` (v4
    files) or ``rope_parameters`` (transformers 5). Where the model's rotary class fixes
    the layout (Qwen3-VL interleaves its sections, Qwen2-VL does not, whatever the key
    says) or the default sections, the model type decides, as in transformers.

    Parameters
    ----------
    config : dict or object
        A parsed ``config.json`` (its ``text_config`` if it has one) or a transformers
        config object.

    Returns
    -------
    dict
        ``head_dim``, ``sections``, ``base``, ``interleaved`` and ``max_len``.

    Examples
    --------
    >>> from posenc.hf import mrope_from_hf
    >>> cfg = {"hidden_size": 1536, "num_attention_heads": 12, "rope_theta": 1e6,
    ...        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    >>> mrope_from_hf(cfg)["sections"]
    (16, 24, 24)
    """
    cfg = read.as_dict(config)
    outer = cfg.get("model_type")
    cfg = read.as_dict(cfg["text_config"]) if cfg.get("text_config") else cfg
    model_type = cfg.get("model_type") or outer
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    layout = MROPE_CLASS.get(model_type)  # what the model's rotary class does
    section = params.get("mrope_section") or (layout and layout[1])
    if kind not in ("default", "mrope") or not section:
        why = "" if kind not in ("default", "mrope") or layout else (
            f" (model_type={model_type!r} has no class default posenc knows)"
        )  # fmt: skip
        raise ValueError(f"config must give an unscaled rope with mrope_section{why}, got {params}")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    # the model's code decides the layout where it fixes one; else the config's key does
    interleaved = layout[0] if layout else bool(params.get("mrope_interleaved", False))
    return {
        "head_dim": head_dim,
        "sections": tuple(section),
        "base": params.get("rope_theta", cfg.get("rope_theta", 10_000.0)),
        "interleaved": interleaved,
        "max_len": cfg.get("max_position_embeddings", 4096),
    }
