"""A vision encoder's axial 2-D RoPE (``rope_type: "axial"``) as ``AxialRotaryEmbedding``
keyword arguments."""

from __future__ import annotations

from posenc._checks import check_int, check_positive
from posenc.hf import config as read

__all__ = ["axial_from_hf"]

# SAM 2 / SAM 3 trackers: the 2-D RoPE of the memory attention, adjacent pairs (their
# rotate_pairwise) over the (row, column) rates of posenc's axial layout
SAM_MEMORY = frozenset(("sam2_video", "sam3_tracker_video", "edgetam_video"))
AXIAL_INTERLEAVED = SAM_MEMORY | {"sam3_vit_model"}


def axial_from_hf(config):
    """Keyword arguments of :class:`posenc.torch.AxialRotaryEmbedding` for a vision config.

    transformers 5.23.0's ``"axial"`` rope (the vision encoders of Qwen2-VL and its
    descendants, SAM 2's memory attention): each head's first half of pairs turns with
    the patch row, the second with the column, at the rates ``rope_theta ** (-2j /
    (head_dim / 2))`` of a RoPE of half the head, paired as ``rotate_half`` pairs them
    (Qwen) or as adjacent dims (SAM 2 and 3: ``pairing="interleaved"``).

    Parameters
    ----------
    config : dict or object
        A vision config (``rope_parameters`` with ``rope_type: "axial"``).

    Returns
    -------
    dict
        ``head_dim``, ``n_axes`` (2), ``base``, ``pairing`` and ``max_len``.

    Examples
    --------
    >>> from posenc.hf import axial_from_hf
    >>> axial_from_hf({"embed_dim": 1280, "num_heads": 16,
    ...                "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}})
    {'head_dim': 80, 'n_axes': 2, 'base': 10000.0, 'pairing': 'half', 'max_len': 4096}
    """
    cfg = read.as_dict(config)
    params = cfg.get("rope_parameters") or {}
    kind = params.get("rope_type", params.get("type"))
    if kind != "axial":
        raise ValueError(f"config must have rope_type 'axial' (a vision encoder), got {kind!r}")
    model_type = cfg.get("model_type")
    head_dim = cfg.get("head_dim")
    if model_type in SAM_MEMORY:  # the memory attention's heads, downsampled
        width = cfg["memory_attention_hidden_size"]
        heads = (
            cfg["memory_attention_downsample_rate"] * cfg["memory_attention_num_attention_heads"]
        )
        head_dim = width // heads
    if not head_dim:
        width = cfg.get("embed_dim") or cfg.get("hidden_size")  # HF's order
        heads = cfg.get("num_heads") or cfg.get("num_attention_heads")
        if not width or not heads:
            raise ValueError("config must give head_dim, or embed_dim/hidden_size and num_heads")
        head_dim = check_int("embed_dim", width, minimum=1) // check_int(
            "num_heads", heads, minimum=1
        )
    head_dim = check_int("head_dim", head_dim, minimum=4)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 for 2-D RoPE, got {head_dim}")
    base = check_positive("rope_theta", params.get("rope_theta", 10_000.0))
    pairing = "interleaved" if model_type in AXIAL_INTERLEAVED else "half"
    return {"head_dim": head_dim, "n_axes": 2, "base": base, "pairing": pairing, "max_len": 4096}
