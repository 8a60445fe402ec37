"""``use``: a posenc position scheme put into a loaded transformers model, in place.

Two ways in, chosen per model (:func:`use` says which in ``model.posenc_path``):

* ``"rotary"``: the scheme is RoPE that HF's own attention can apply -- each layer type's
  layers share one :class:`~posenc.torch.RotaryEmbedding` in the model's pairing and rotary
  width, with the model's own windows, chunks and wrappers -- so the model's ``rotary_emb``
  is replaced (:class:`~posenc.torch.hf.rotary.Rotary`) and HF's attention, masks and caches run
  as before;
* ``"attention"``: anything else (score biases, xPos, PoPE, NoPE layers, another window)
  runs in posenc's :func:`~posenc.torch.attend`, registered with transformers'
  ``AttentionInterface`` as ``"posenc"``; HF's rotation becomes the identity.
"""

from __future__ import annotations

import copy
import functools
import inspect

from torch import nn

from posenc.torch.encodings.base import NoPE, PositionalEncoding
from posenc.torch.hf import fit, hooks, rotary
from posenc.torch.hf.export import mark
from posenc.torch.model.schedule import Layer, Schedule

__all__ = ["use"]


def use(model, scheme, *, path="auto", backend="auto"):
    """Put a posenc position scheme into a transformers model, in place.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A decoder (``LlamaForCausalLM``, ``Gemma3ForCausalLM``, their base models, ...):
        its base model holds ``layers`` and ``rotary_emb``.
    scheme : PositionalEncoding, Schedule or dict
        One encoding for every attention layer (with the model's own windows and chunks),
        a :class:`~posenc.torch.Schedule` of one
        :class:`~posenc.torch.Layer` per ``num_hidden_layers``, or a config dict read by
        :meth:`Schedule.from_hf <posenc.torch.Schedule.from_hf>`. A layer's outer
        :class:`~posenc.torch.SoftmaxFactor` sets its softmax scale (without one: the
        model's own, Gemma's ``query_pre_attn_scalar`` say); Llama 4's and Ministral 3's
        query temperature, which their attention applies itself, must be the model's own.
    path : {"auto", "rotary", "attention"}
        How the scheme goes in: ``"auto"`` (default) replaces the model's rotary where HF's
        attention can apply the scheme, else runs posenc's attention; ``"attention"``
        always runs posenc's attention (its kernels and backends, FlexAttention);
        ``"rotary"`` refuses a scheme HF's attention cannot apply.
    backend : {"auto", "sdpa", "flex"}
        posenc's attention backend, where the scheme runs in it.

    Returns
    -------
    transformers.PreTrainedModel
        The same model, changed in place. ``model.posenc_path`` is ``"rotary"`` (HF's
        attention with posenc's cos and sin) or ``"attention"`` (posenc's ``attend`` in
        every attention layer); the encodings are submodules of the base model
        (``posenc_encodings``), on its device and dtype: their parameters train, move and
        save with it. The model gets a config object of its own (transformers shares one
        between the models built from it), which says what the model runs: the
        ``rope_parameters`` HF builds the scheme from, or ``"rope_type": "posenc"`` where
        HF cannot (see :func:`~posenc.torch.hf.from_pretrained`).

    Raises
    ------
    ValueError
        For a scheme with the wrong number of layers, an encoding whose width or heads do
        not fit the model's attention, a model without ``rotary_emb`` or whose attention
        does not go through transformers' ``AttentionInterface``, a layer without
        attention given an encoding, a window wider than the keys transformers' cache
        keeps on a sliding layer, learned sinks or M-RoPE other than the model's own on
        posenc's attention; while running, a static cache and an attention implementation
        changed after ``use``.

    Examples
    --------
    >>> import torch, transformers
    >>> from posenc.hf import use
    >>> from posenc.torch import ALiBi
    >>> cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    >>> model = use(transformers.LlamaForCausalLM(cfg), ALiBi(4))
    >>> model.posenc_path, model(torch.tensor([[1, 2, 3]])).logits.shape
    ('attention', torch.Size([1, 3, 32]))
    """
    base = _base(model)
    if model.__dict__.get("posenc_path") or isinstance(
        base.rotary_emb, (rotary.Rotary, rotary.Unrotated)
    ):
        raise ValueError("posenc.hf.use was called on this model before: load it afresh")
    if path not in ("auto", "rotary", "attention"):
        raise ValueError(f"path must be 'auto', 'rotary' or 'attention', got {path!r}")
    config = base.config
    own = _own(config)
    schedule = _schedule(scheme, config, own)
    modules = _attention_modules(base, len(schedule))
    for i, (layer, module) in enumerate(zip(schedule, modules, strict=True)):
        if module is None and layer.encoding is not None:
            raise ValueError(f"layer {i} of {type(base).__name__} has no attention that goes "
                             "through transformers' AttentionInterface, but the scheme gives "
                             f"it {type(layer.encoding).__name__}")  # fmt: skip
        if layer.sinks and not isinstance(getattr(module, "sinks", None), nn.Parameter):
            raise ValueError(f"layer {i}: the scheme gives it learned sinks, which "
                             f"{type(module).__name__} does not have: posenc.hf.use does not "
                             "add parameters to a model's attention")  # fmt: skip
    model_type = getattr(config, "model_type", None)
    mine = [(*fit.positional(layer.encoding, own, i, model_type), layer.limits)
            for i, layer in enumerate(schedule)]  # fmt: skip
    theirs = None if own is None else [
        (*fit.positional(layer.encoding, own, i, model_type), layer.limits)
        for i, layer in enumerate(own)
    ]  # fmt: skip
    ropes = None if path == "attention" else fit.rotary_fit(mine, theirs, config, modules)
    own_kept = {r is None for r, _ in (ropes or {}).values()}  # the model's own M-RoPE
    kept = own_kept == {True}
    if own_kept == {True, False}:
        ropes = None  # the model's own M-RoPE beside another RoPE: not one rotary's work
    if ropes is not None and not kept:  # in the form the model's own rotary returns
        device = next(base.parameters()).device
        layouts = {t: rotary.layout_of(base.rotary_emb, own_rope, device, t)
                   for t, (_, own_rope) in ropes.items()}  # fmt: skip
        ropes = None if None in layouts.values() else {
            t: (r, layouts[t]) for t, (r, _) in ropes.items()}  # fmt: skip
    if ropes is None and path == "rotary":
        raise ValueError("path='rotary': HF's attention cannot apply this scheme (not RoPE in "
                         "the model's pairing and width, per layer type, with its windows, "
                         "chunks and softmax scale): use path='auto' or 'attention'")  # fmt: skip
    config = _own_config(model, base)  # from here on, this model's alone
    if kept:  # the model's own M-RoPE: its rotary stays, and so does its config
        return _keep(model, base, schedule, "rotary", mark_config=False)
    if ropes is not None:
        base.rotary_emb = rotary.Rotary(ropes, base.rotary_emb)
        return _keep(model, base, schedule, "rotary")
    if not model._can_set_attn_implementation():
        raise ValueError(f"{type(model).__name__}'s attention does not go through "
                         "transformers' AttentionInterface: posenc can only replace its "
                         "rotary_emb, and this scheme needs posenc's attention")  # fmt: skip
    cached = fit.cache_limits(config, len(schedule))
    layers = _layers(base)
    for i, ((enc, factor, _), layer, module) in enumerate(zip(mine, schedule, modules,
                                                              strict=True)):  # fmt: skip
        if module is None:
            continue
        fit.check_attention_layer(i, enc, layer, module, config, cached[i])
        enc = NoPE() if enc is None else enc
        module.__dict__["posenc_layer"] = hooks.Bound(
            enc, layer.window, layer.chunk, backend, factor, layers[i]
        )
    base.rotary_emb = rotary.Unrotated(_forms(base, config), config, base.rotary_emb)
    hooks.register()
    config._attn_implementation = hooks.NAME  # the text model's config only (not a vision tower's)
    return _keep(model, base, schedule, "attention")


def _base(model):
    """The module holding the decoder's layers (a ModuleList of ``num_hidden_layers``, as
    ``layers`` or Falcon's ``h``) and its ``rotary_emb``: the base model."""
    for base in (getattr(model, "base_model", model), *model.modules()):
        if hasattr(base, "rotary_emb") and hasattr(base, "config") and _layers(base) is not None:
            _refuse_other_rotaries(base)
            return base
    raise ValueError(f"{type(model).__name__} has no base model with decoder layers and one "
                     "rotary_emb (transformers 5's decoders): posenc cannot put a scheme into "
                     "it")  # fmt: skip


def _refuse_other_rotaries(base):
    """Refuse a base model whose layers may read a rotary embedding other than its
    ``rotary_emb`` (GraniteSWA's ``rotary_embs``, one per base, leaves ``rotary_emb``
    unused): posenc would replace one the layers never read, and theirs would stay."""
    for name, m in base.named_children():
        if m is base.rotary_emb or m is _layers(base) or name == "posenc_encodings":
            continue  # (posenc_encodings: a use before, refused by name next)
        if any("rotary" in type(x).__name__.lower() for x in m.modules()):
            raise ValueError(f"{type(base).__name__} holds {name} ({type(m).__name__}) "
                             "beside its rotary_emb, which its layers may read instead: "
                             "posenc replaces rotary_emb only, so it cannot put a scheme into "
                             "this model")  # fmt: skip


def _layers(base):
    depth = getattr(base.config, "num_hidden_layers", None)
    for child in base.children():
        if isinstance(child, nn.ModuleList) and len(child) == depth:
            return child
    return None


def _schedule(scheme, config, own):
    """The scheme as a Schedule of the model's depth: one encoding alone goes into every
    attention layer with the model's own windows and chunks (``own``)."""
    depth = getattr(config, "num_hidden_layers", None)
    if isinstance(scheme, dict):
        scheme = Schedule.from_hf(scheme)
    elif isinstance(scheme, PositionalEncoding):
        if "input" in scheme.places:
            raise ValueError(f"scheme {type(scheme).__name__} acts on the input embeddings: "
                             "posenc.hf.use puts schemes into attention")  # fmt: skip
        if own is None or len(own) != depth:
            scheme = Schedule.uniform(scheme, depth)
        else:
            scheme = Schedule([Layer(scheme, window=lay.window, chunk=lay.chunk)
                               if lay.attention else lay for lay in own])  # fmt: skip
    elif not isinstance(scheme, Schedule):
        raise ValueError("scheme must be a PositionalEncoding, a Schedule or a config dict, "
                         f"got {type(scheme).__name__}")  # fmt: skip
    if scheme.input is not None:
        raise ValueError(f"the schedule's input encoding {type(scheme.input).__name__} acts "
                         "on the embeddings: posenc.hf.use puts schemes into attention")  # fmt: skip
    if len(scheme) != depth:
        raise ValueError(f"the schedule has {len(scheme)} layers, the model "
                         f"num_hidden_layers={depth}")  # fmt: skip
    return scheme


def _attention_modules(base, depth):
    """HF's attention module of each layer (``None`` for a layer without attention): the
    first module of the layer whose forward calls transformers' attention interface."""
    found = []
    for layer in _layers(base):
        found.append(next((m for m in layer.modules() if _attends(type(m))), None))
    return found


@functools.cache
def _attends(cls):
    """Whether ``cls.forward`` calls transformers' attention interface."""
    fwd = getattr(cls, "forward", None)
    try:
        return fwd is not None and "attention_interface" in inspect.getsource(fwd)
    except (OSError, TypeError):
        return False


def _own(config):
    """The model's own schedule, or ``None`` where posenc does not build it."""
    try:
        return Schedule.from_hf(config)
    except ValueError:
        return None


def _forms(base, config):
    """The form of the model's rotary output, per layer type where it has one per type."""
    theirs, device = base.rotary_emb, next(base.parameters()).device
    types = sorted(set(getattr(config, "layer_types", None) or ())) if fit.per_type(config) else []
    forms = {t: rotary.probe_form(theirs, config, device, t) for t in types}
    return forms or {None: rotary.probe_form(theirs, config, device)}


def _own_config(model, base):
    """Give the model config objects of its own (transformers shares them between the models
    built from one, and ``use`` writes to the text model's): the model's config is copied
    whole (a composite one with its sub-configs), and every module of the model that held
    one of the old objects holds its copy."""
    top = model.config
    new_top = copy.deepcopy(top)
    pairs = {id(top): new_top}
    for key, value in vars(top).items():  # sub-configs: text_config, vision_config, ...
        if value is not None and hasattr(value, "to_dict") and hasattr(new_top, key):
            pairs[id(value)] = getattr(new_top, key)
    if id(base.config) not in pairs:  # a base model whose config its wrapper does not hold
        pairs[id(base.config)] = copy.deepcopy(base.config)
    for m in model.modules():
        held = m.__dict__.get("config")
        if held is not None and id(held) in pairs:
            m.config = pairs[id(held)]
    return base.config


def _keep(model, base, schedule, path, mark_config=True):
    """The scheme's encodings as submodules of the model (trained, moved, saved once), and
    the config saying what the model runs (:func:`posenc.torch.hf.export.mark`)."""
    weight = next(base.parameters(), None)
    base.posenc_encodings = nn.ModuleList(schedule.encodings)
    if weight is not None and weight.is_floating_point():  # the model's device and dtype
        base.posenc_encodings.to(device=weight.device, dtype=weight.dtype)
    model.posenc_path = path
    model.posenc_schedule = schedule
    if mark_config:
        mark(base.config, schedule, path)
    return model
