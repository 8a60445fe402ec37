"""Whether a config's position scheme is one RoPE: the check behind every ``from_hf``.

``RotaryEmbedding.from_hf`` and ``MRoPE.from_hf`` build one rotation. A model whose layers
need more -- a query temperature (Llama 4, Ministral 3), the trailing-channel slice of a
``[nope | rope]`` head (DeepSeek, Mistral 4), attention layers without RoPE, sets that differ
by layer, M-RoPE positions -- would be reproduced in part, silently; :func:`check_one_rope`
refuses it, naming ``Schedule.from_hf``, which builds every layer's scheme. The layers are
read by :func:`posenc.hf.schedule_from_hf`, so both readers agree.
"""

from __future__ import annotations

from collections.abc import Mapping

from posenc.hf import config as read
from posenc.hf.layers import NO_ATTENTION
from posenc.hf.mrope import MROPE_LAYOUT, NO_MROPE, TEXT_OF
from posenc.hf.schedule import schedule_from_hf

__all__ = ["check_one_rope"]

# layers read where a config dict gives no num_hidden_layers (two of Llama 4's NoPE periods)
PROBE_DEPTH = 8


def check_one_rope(config, *, layer_type=None, mrope=False, built=None, pairing=None):
    """Raise ``ValueError`` unless the config's attention layers (of ``layer_type``) all use
    one rotation and nothing else that depends on position.

    Parameters
    ----------
    config : dict or object
        A parsed ``config.json`` or a transformers config object.
    layer_type : str, optional
        The layer type the rotation is for; ``None``: every layer.
    mrope : bool
        Checking for ``MRoPE.from_hf`` (else ``RotaryEmbedding.from_hf``).
    built : dict, optional
        The keyword arguments the caller reads (``posenc.hf.from_hf``'s): they must be the
        schedule's for these layers.
    pairing : str, optional
        The pairing the caller was given, for a model type posenc does not know: such a
        model's layers are read by the rules of a config that names no model type.

    Examples
    --------
    >>> from posenc.hf.whole import check_one_rope
    >>> ministral3 = {"model_type": "ministral3", "hidden_size": 64, "num_attention_heads": 2,
    ...     "num_hidden_layers": 2, "max_position_embeddings": 4096,
    ...     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
    ...         "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 4096}}
    >>> check_one_rope(ministral3)
    Traceback (most recent call last):
    ...
    ValueError: RotaryEmbedding.from_hf builds one RoPE, but model_type 'ministral3': layer 0 \
has a query temperature (scale 0.1, floor 4096.0); Schedule.from_hf builds every layer's scheme
    """
    cfg = _text(config)
    model_type = cfg.get("model_type")
    call, one = ("MRoPE.from_hf", "M-RoPE") if mrope else ("RotaryEmbedding.from_hf", "RoPE")
    hint = []

    def refuse(what):
        what += "".join(hint)
        raise ValueError(f"{call} builds one {one}, but model_type {model_type!r}: {what}; "
                         "Schedule.from_hf builds every layer's scheme")  # fmt: skip

    if not mrope and _is_mrope(cfg):
        refuse("its positions are M-RoPE's (time, height, width), which MRoPE.from_hf builds "
               "(text positions p mean (p, p, p))")  # fmt: skip
    if layer_type in NO_ATTENTION:
        refuse(f"its {layer_type} layers have no attention, so no positions")
    spec = _schedule(config, cfg, pairing)
    if isinstance(spec, ValueError):
        if mrope:
            return  # its text layers are read as RoPE there; mrope_from_hf reads the layout
        refuse(f"its layers cannot be read as Schedule.from_hf reads them ({spec})")
    layers = spec["layers"]
    types = list(cfg.get("layer_types") or ())
    types = types if len(types) == len(layers) else [None] * len(layers)
    if layer_type is not None and types[0] is not None and layer_type not in types:
        raise ValueError(f"layer_type must be one of {sorted(set(types))}, got {layer_type!r}")
    kinds = sorted({t for t in types if t and t not in NO_ATTENTION})
    if layer_type is None and len(kinds) > 1:
        hint.append(f" (layer_type= one of {kinds} builds the layers of one type)")
    mine = [
        (i, layer) for i, (kind, layer) in enumerate(zip(types, layers, strict=True))
        if layer["attention"] and kind not in NO_ATTENTION and layer_type in (None, kind)
    ]  # fmt: skip
    for i, layer in mine:
        what = _extras(layer)
        if what:
            where = f"layer {i}" + (f" ({types[i]})" if types[i] else "")
            refuse(f"{where} has {' and '.join(what)}")
    ropes = []
    for _, layer in mine:
        if layer["rope"] not in ropes:
            ropes.append(layer["rope"])
    if len(ropes) > 1:
        refuse(f"its layers use {len(ropes)} different rotations")
    if built is not None and ropes and not mrope:
        got = {k: v for k, v in ropes[0].items() if k in built}
        if got != built:
            refuse(f"its layers' RoPE is {got}, not {built}")


def _extras(layer):
    """What a layer does with positions beyond one rotation of the leading channels."""
    what = []
    if layer["rope"] is None:
        what.append("no RoPE")
    if layer["temperature"]:
        t = layer["temperature"]
        what.append(f"a query temperature (scale {t['scale']}, floor {t['floor']})")
    if layer["slice_start"] is not None:
        what.append(
            f"its rotation on the trailing channels from {layer['slice_start']} on (HF's "
            "[nope | rope] head), where a RoPE rotates the leading ones"
        )
    return what


def _text(config):
    """The text model's settings, as a dict (a multimodal config's ``text_config``)."""
    inner, outer = read.text_model(config)
    return read.as_dict(config) if inner is config else {"model_type": outer, **read.as_dict(inner)}


def _is_mrope(cfg):
    model_type = TEXT_OF.get(cfg.get("model_type"), cfg.get("model_type"))
    if model_type in MROPE_LAYOUT or model_type in NO_MROPE:
        return True
    sets = [p for p in (cfg.get("rope_scaling"), cfg.get("rope_parameters")) if isinstance(p, dict)]
    sets += [v for p in sets for v in p.values() if isinstance(v, Mapping)]
    return any("mrope_section" in p for p in sets)


def _schedule(config, cfg, pairing):
    """:func:`schedule_from_hf` of the config (a dict without a depth read at ``PROBE_DEPTH``
    layers), or the ``ValueError`` it raised."""
    if isinstance(config, Mapping):
        depth = len(cfg.get("layer_types") or cfg.get("no_rope_layers") or ()) or PROBE_DEPTH
        config = cfg if cfg.get("num_hidden_layers") else {**cfg, "num_hidden_layers": depth}
    try:
        return schedule_from_hf(config)
    except ValueError as error:
        first, retry = error, dict(read.as_dict(config))
    if pairing is not None and not _known(cfg):
        retry["model_type"] = None  # no class rules: read as a Llama-style config
    if retry.get("sliding_window"):  # which layers slide (a class rule it may not know)
        retry["sliding_window"] = None  # does not change a rotation
    try:
        return first if retry == read.as_dict(config) else schedule_from_hf(retry)
    except ValueError:
        return first


def _known(cfg):
    try:
        read.pairing(cfg, cfg.get("model_type"))
    except ValueError:
        return False
    return True
