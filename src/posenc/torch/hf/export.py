"""``to_hf``: a posenc RoPE scheme as the config keys that make transformers build it natively.

The inverse of :func:`posenc.hf.from_hf` and :func:`posenc.hf.schedule_from_hf`: a
:class:`~posenc.torch.RotaryEmbedding` (every layer) or a :class:`~posenc.torch.Schedule`
of RoPE layers becomes ``rope_parameters`` (flat, or per layer type where the model's config
nests them, as Gemma 3's). The result is read back with posenc's rules for the same model
type, and anything HF would build differently -- another pairing or width, a scaling
without an HF rope type, a window the config does not give -- raises ``ValueError`` by
name: a config written here never claims a scheme HF builds otherwise. :func:`mark` writes
into a ``use``d model's config what it runs: ``to_hf``'s parameters, or, where HF cannot
build the scheme, its own parameters with ``"rope_type": "posenc"`` (the model's own type
kept beside it), which transformers refuses to build (its rotary classes know no such
type): a saved model never reloads as a RoPE model by mistake (posenc.hf.from_pretrained
reloads it).
"""

from __future__ import annotations

from posenc.hf import config as read
from posenc.hf import convert
from posenc.scaling import NTK, DynamicNTK, Linear, Llama3, LongRoPE, Proportional, YaRN

__all__ = ["to_hf", "mark", "unmark"]

MARK = "posenc"  # the rope type of a config whose scheme runs in posenc's attention
SAVED = "posenc_saved_rope_type"  # beside it: the model's own rope type

# keys of rope_parameters that are no RoPE setting, kept as the config gives them (Ministral
# 3's and Mistral 4's query temperature reads llama_4_scaling_beta and the original length)
NOT_ROPE = ("llama_4_scaling_beta",)
# keys that carry RoPE settings outside rope_parameters (dropped: rope_parameters says it all)
OLD_KEYS = ("rope_scaling", "rope_theta", "partial_rotary_factor", "rotary_pct",
            "rotary_emb_base", "rope_local_base_freq")  # fmt: skip


def to_hf(scheme, config):
    """The config that makes transformers build ``scheme`` itself.

    Parameters
    ----------
    scheme : RotaryEmbedding or Schedule
        A RoPE (with any :mod:`posenc.scaling`, partial rotary) for every layer, or a
        schedule whose attention layers each have a RoPE of their layer type (Gemma 3's
        local and global bases), or none where the model type has layers without it.
    config : dict or object
        The model's config (a parsed ``config.json`` or a transformers config object):
        its model type decides which keys HF reads.

    Returns
    -------
    dict
        ``config`` as a dict with ``rope_parameters`` set and the older RoPE keys
        (``rope_scaling``, top-level ``rope_theta``, ...) removed; ``config_class.from_dict``
        of it builds the scheme.

    Raises
    ------
    ValueError
        Naming what HF cannot express for the model type: an encoding other than RoPE
        (ALiBi, xPos, ... run through :func:`posenc.hf.use <posenc.torch.hf.use>`), a pairing or rotary width
        the model's code does not rotate, layers of one type with different RoPEs, a
        window or chunk the config does not give, a scaling HF has no rope type for.

    Examples
    --------
    >>> from posenc.hf import to_hf
    >>> from posenc.scaling import YaRN
    >>> from posenc.torch import RotaryEmbedding
    >>> cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    ...        "num_hidden_layers": 2, "max_position_embeddings": 4096, "rope_theta": 1e4}
    >>> rope = RotaryEmbedding(16, scaling=YaRN(4.0, 4096), max_len=16384)
    >>> to_hf(rope, cfg)["rope_parameters"]["rope_type"]
    'yarn'
    """
    cfg = read.as_dict(config)
    from posenc.torch import RotaryEmbedding, Schedule

    if isinstance(scheme, RotaryEmbedding):
        layers, factors = [scheme] * int(cfg.get("num_hidden_layers") or 1), None
        windows = None
    elif isinstance(scheme, Schedule):
        factors, layers = zip(*(peel(layer.encoding) for layer in scheme), strict=True)
        windows = [layer.limits for layer in scheme]
    else:
        raise ValueError(f"scheme must be a RotaryEmbedding or a Schedule of them, got "
                         f"{type(scheme).__name__}: other encodings run through "
                         "posenc.hf.use")  # fmt: skip
    for i, enc in enumerate(layers):
        if enc is not None and type(enc) is not RotaryEmbedding:
            raise ValueError(f"layer {i}: HF builds no {type(enc).__name__} for model_type "
                             f"{cfg.get('model_type')!r}: run it through posenc.hf.use")  # fmt: skip
    out = {k: v for k, v in cfg.items() if k not in OLD_KEYS and not k.startswith("_attn")}
    types = list(cfg.get("layer_types") or [])
    params = convert.rope_parameters(cfg)
    if types and read.per_type_keys(params, cfg):
        by_type = {}
        for i, (kind, enc) in enumerate(zip(types, layers, strict=True)):
            if by_type.setdefault(kind, enc) is not enc and _settings(by_type[kind]) != (
                _settings(enc)
            ):  # fmt: skip
                raise ValueError(f"layers of type {kind!r} have different RoPEs (layer {i}): "
                                 "HF builds one per layer type")  # fmt: skip
        out["rope_parameters"] = {k: None if e is None else _params(e) for k, e in by_type.items()}
    else:
        ropes = [e for e in layers if e is not None]
        if not ropes or any(_settings(e) != _settings(ropes[0]) for e in ropes):
            raise ValueError(f"model_type {cfg.get('model_type')!r} has one RoPE for every "
                             "layer: the scheme's layers differ")  # fmt: skip
        out["rope_parameters"] = _params(ropes[0])
        old = {} if read.per_type_keys(params, cfg) else dict(params)
        if any(k in old for k in NOT_ROPE):  # the temperature's keys, kept
            keep = (*NOT_ROPE, "original_max_position_embeddings")
            out["rope_parameters"] = {k: old[k] for k in keep if k in old} | out["rope_parameters"]
    _check_round_trip(out, layers, windows, factors)
    return out


def _params(rope):
    """HF's ``rope_parameters`` of one RoPE (``rope_theta`` and ``partial_rotary_factor``
    inside, as transformers 5 writes them)."""
    s, base = rope.scaling, rope.base
    p = {"rope_type": "default", "rope_theta": base}
    if isinstance(s, NTK):  # HF has no static NTK: the same rates are a raised base
        d = rope.rotary_dim
        p["rope_theta"] = base * s.factor ** (d / (d - 2))
    elif isinstance(s, Linear):
        p |= {"rope_type": "linear", "factor": s.factor}
    elif isinstance(s, DynamicNTK):
        p |= {"rope_type": "dynamic", "factor": s.factor}
    elif isinstance(s, YaRN):
        p |= {"rope_type": "yarn", "factor": s.factor, "beta_fast": s.beta_fast,
              "beta_slow": s.beta_slow, "original_max_position_embeddings": s.original_max_len,
              "truncate": s.truncate}  # fmt: skip
        p |= {k: getattr(s, k) for k in ("attention_factor", "mscale", "mscale_all_dim")
              if getattr(s, k) is not None}  # fmt: skip
    elif isinstance(s, Llama3):
        p |= {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
              "high_freq_factor": s.high_freq_factor,
              "original_max_position_embeddings": s.original_max_len}  # fmt: skip
    elif isinstance(s, LongRoPE):
        if s.short_mscale is not None or s.long_mscale is not None:
            raise ValueError("LongRoPE with short_mscale/long_mscale is PhiMoE's own rotary: "
                             "to_hf writes the rope types of modeling_rope_utils only")  # fmt: skip
        p |= {"rope_type": "longrope", "short_factor": list(s.short_factor),
              "long_factor": list(s.long_factor), "factor": s.factor,
              "original_max_position_embeddings": s.original_max_len}  # fmt: skip
        if s.attention_factor is not None:
            p["attention_factor"] = s.attention_factor
    elif isinstance(s, Proportional):
        p |= {"rope_type": "proportional", "partial_rotary_factor": s.fraction,
              "factor": s.factor}  # fmt: skip
    elif s is not None:
        raise ValueError(f"HF has no rope type for the scaling {type(s).__name__}")
    if rope.rotary_dim != rope.head_dim and not isinstance(s, Proportional):
        p["partial_rotary_factor"] = rope.rotary_dim / rope.head_dim
    return p


def _settings(rope):
    """What a RoPE computes: widths, pairing, rates and attention scale (rounded to 1e-12),
    and a length-dependent scaling's settings."""
    import posenc

    if rope is None:
        return None
    inv, scale = posenc.rope_frequencies(rope.head_dim, base=rope.base, scaling=rope.scaling,
                                         rotary_dim=rope.rotary_dim)  # fmt: skip
    rates = tuple(float(f"{x:.12e}") for x in inv)
    dynamic = rope.scaling if getattr(rope.scaling, "length_dependent", False) else None
    return (rope.head_dim, rope.rotary_dim, rope.pairing, rates, float(f"{scale:.12e}"), dynamic)


def peel(enc):
    """``(wrappers, inner)``: the wrappers' settings outside-in (``(type name, settings)``)
    and the innermost encoding (``None`` for none or NoPE)."""
    from posenc.torch.encodings.wrappers import _Wrapped

    chain = []
    while isinstance(enc, _Wrapped):
        settings = {k: v for k, v in vars(enc).items() if not k.startswith("_")}
        chain.append((type(enc).__name__, tuple(sorted(settings.items()))))
        enc = enc.inner
    return tuple(chain), (None if type(enc).__name__ == "NoPE" else enc)


def _model_own(chain):
    """The wrappers a config gives a model whatever its RoPE: its softmax factor and query
    temperature (a scheme may leave them out: the model keeps its own)."""
    return tuple(w for w in chain if w[0] not in ("SoftmaxFactor", "QueryTemperature"))


def _check_round_trip(out, layers, windows, chains=None):
    """Read ``out`` back as posenc reads HF's config; refuse what differs, by layer. The
    wrappers of a layer (``chains``) must be what the config gives, but for the model's own
    softmax factor and query temperature, which a layer may leave out (not a position
    scheme: the model keeps them)."""
    from posenc.torch import Schedule

    try:
        back = Schedule.from_hf(out)
    except ValueError as err:
        raise ValueError(f"HF would not build this scheme from the config: {err}") from err
    for i, enc in enumerate(layers):
        theirs, got = peel(back[i].encoding)
        given = () if chains is None else chains[i]
        if given not in (theirs, _model_own(theirs)):
            raise ValueError(f"layer {i}: the wrappers {[w[0] for w in given]} are not what "
                             f"the config gives ({[w[0] for w in theirs]}): to_hf writes "
                             "RoPE only")  # fmt: skip
        mine = _settings(enc)
        theirs = _settings(got) if got is None or type(got).__name__ == "RotaryEmbedding" else got
        if mine != theirs:
            raise ValueError(_differs(i, enc, got, out.get("model_type")))
        if windows is not None and back[i].limits != windows[i]:
            raise ValueError(f"layer {i}: window and chunk {windows[i]} are not what the "
                             f"config gives ({back[i].limits}): to_hf writes RoPE only")  # fmt: skip


def _differs(i, enc, got, model_type):
    def say(e):
        if e is None:
            return "no RoPE"
        if type(e).__name__ != "RotaryEmbedding":
            return type(e).__name__
        return (
            f"RoPE(head_dim={e.head_dim}, rotary_dim={e.rotary_dim}, pairing={e.pairing!r}, "
            f"base={e.base:g}, scaling={type(e.scaling).__name__ if e.scaling else None})"
        )

    return f"layer {i}: HF's {model_type} would build {say(got)} from the config, not {say(enc)}"


def mark(config, schedule, path):
    """Make ``config`` say what the model now runs (see the module docstring); ``path`` is
    ``use``'s ``"rotary"`` or ``"attention"``. Keys other than ``rope_type`` stay, for the
    models that read them while running (Ministral 3's temperature)."""
    old = unmark(config.rope_parameters)
    if path == "rotary":
        try:
            config.rope_parameters = to_hf(schedule, config)["rope_parameters"]
            if _reads_as(config, schedule):  # the object's other keys agree too
                return
        except ValueError:
            pass  # HF cannot express it after all: the marked form below
    config.rope_parameters = _marked(old)


def _nested(params):
    return bool(params) and all(v is None or isinstance(v, dict) for v in params.values())


def _marked(params):
    if not isinstance(params, dict):
        return params
    if _nested(params):  # per layer type (Gemma 3)
        return {k: _marked(v) for k, v in params.items()}
    return params | {"rope_type": MARK, SAVED: params.get("rope_type", "default")}


def unmark(params):
    """``rope_parameters`` as they were before :func:`mark` (unchanged if not marked)."""
    if not isinstance(params, dict):
        return params
    if _nested(params):
        return {k: unmark(v) for k, v in params.items()}
    if params.get("rope_type") != MARK:
        return params
    return {k: v for k, v in params.items() if k != SAVED} | {"rope_type": params[SAVED]}


def _reads_as(config, schedule):
    """Whether posenc reads ``config`` (HF's rules) as ``schedule``'s RoPE in every layer."""
    from posenc.torch import Schedule

    back = Schedule.from_hf(config)
    return all(_settings(peel(a.encoding)[1]) == _settings(peel(b.encoding)[1])
               for a, b in zip(back, schedule, strict=True))  # fmt: skip
