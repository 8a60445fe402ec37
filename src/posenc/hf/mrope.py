"""A Qwen2-VL / Qwen2.5-VL / Qwen3-VL config's M-RoPE as :class:`posenc.torch.MRoPE` arguments."""

from __future__ import annotations

from posenc.hf import config as read

__all__ = ["mrope_from_hf"]


def mrope_from_hf(config):
    """Keyword arguments of :class:`posenc.torch.MRoPE` for a Qwen-VL config.

    Reads the text model's head width, ``rope_theta``, ``mrope_section``,
    ``mrope_interleaved`` and ``max_position_embeddings``, from ``rope_scaling`` (v4
    files) or ``rope_parameters`` (transformers 5).

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
    cfg = read.as_dict(cfg["text_config"]) if cfg.get("text_config") else cfg
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "mrope") or "mrope_section" not in params:
        raise ValueError(f"config must give an unscaled rope with mrope_section, got {params}")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return {
        "head_dim": head_dim,
        "sections": tuple(params["mrope_section"]),
        "base": params.get("rope_theta", cfg.get("rope_theta", 10_000.0)),
        "interleaved": bool(params.get("mrope_interleaved", False)),
        "max_len": cfg.get("max_position_embeddings", 4096),
    }
