"""``use``: a posenc position scheme put into a loaded transformers model, in place.

Two ways in, chosen per model (:func:`use` says which in ``model.posenc_path``):

* ``"rotary"``: the scheme is RoPE that HF's own attention can apply -- each layer type's
  layers share one :class:`~posenc.torch.RotaryEmbedding` in the model's pairing and rotary
  width, with the model's own windows, chunks and wrappers -- so the model's ``rotary_emb``
  is replaced (:class:`~posenc.torch.hf.hooks.Rotary`) and HF's attention, masks and caches run
  as before;
* ``"attention"``: anything else (score biases, xPos, PoPE, NoPE layers, another window)
  runs in posenc's :func:`~posenc.torch.attend`, registered with transformers'
  ``AttentionInterface`` as ``"posenc"``; HF's rotation becomes the identity.
"""

from __future__ import annotations

import functools
import inspect

from torch import nn

from posenc.torch.hf import hooks
from posenc.torch.hf.export import mark, peel
from posenc.torch.encodings.base import NoPE, PositionalEncoding
from posenc.torch.encodings.qk.rope import RotaryEmbedding
from posenc.torch.encodings.qk.temperature import QueryTemperature
from posenc.torch.encodings.wrappers import ChannelSlice, SoftmaxFactor
from posenc.torch.model.schedule import Schedule

__all__ = ["use"]

# model types whose attention module multiplies the queries by a temperature itself
# (Llama4TextAttention on its NoPE layers; Ministral 3's and Mistral 4's llama_4_scaling_beta)
OWN_TEMPERATURE = frozenset(("llama4", "llama4_text", "ministral3", "mistral4"))


def use(model, scheme, *, path="auto", backend="auto"):
    """Put a posenc position scheme into a transformers model, in place.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A decoder (``LlamaForCausalLM``, ``Gemma3ForCausalLM``, their base models, ...):
        its base model holds ``layers`` and ``rotary_emb``.
    scheme : PositionalEncoding, Schedule or dict
        One encoding for every layer, a :class:`~posenc.torch.Schedule` of one
        :class:`~posenc.torch.Layer` per ``num_hidden_layers``, or a config dict read by
        :meth:`Schedule.from_hf <posenc.torch.Schedule.from_hf>`. A layer's
        :class:`~posenc.torch.SoftmaxFactor` (or Llama 4's query temperature) equal to what
        the model's attention applies itself is taken as the model's, applied once.
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
        The same model, changed in place. ``model.posenc_path`` is ``"rotary"`` (HF's attention with posenc's
        cos and sin) or ``"attention"`` (posenc's ``attend`` in every attention layer); the
        encodings are submodules (``model.posenc_encodings``): their parameters train and
        move with the model.

    Raises
    ------
    ValueError
        For a scheme with the wrong number of layers, an encoding whose width or heads do
        not fit the model's attention, a model without ``rotary_emb`` or whose attention
        does not go through transformers' ``AttentionInterface``, a layer without
        attention given an encoding.

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
    if isinstance(base.rotary_emb, (hooks.Rotary, hooks.Unrotated)):
        raise ValueError("posenc.hf.use was called on this model before: load it afresh")
    config = base.config
    schedule = _schedule(scheme, config)
    modules = _attention_modules(base, len(schedule))
    own = _own(config)
    for i, (layer, module) in enumerate(zip(schedule, modules, strict=True)):
        if module is None and layer.encoding is not None:
            raise ValueError(f"layer {i} of {type(base).__name__} has no attention that goes "
                             "through transformers' AttentionInterface, but the scheme gives "
                             f"it {type(layer.encoding).__name__}")  # fmt: skip
    model_type = getattr(config, "model_type", None)
    mine = [(_positional(layer.encoding, own, i, model_type), layer.limits)
            for i, layer in enumerate(schedule)]  # fmt: skip
    theirs = None if own is None else [
        (_positional(layer.encoding, own, i, model_type), layer.limits)
        for i, layer in enumerate(own)
    ]  # fmt: skip
    if path not in ("auto", "rotary", "attention"):
        raise ValueError(f"path must be 'auto', 'rotary' or 'attention', got {path!r}")
    ropes = None if path == "attention" else _rotary_fit(mine, theirs, config, modules)
    if ropes is not None:  # in the form the model's own rotary returns, else not this way
        device = next(base.parameters()).device
        layouts = {t: hooks.layout_of(base.rotary_emb, own_rope, device, t)
                   for t, (_, own_rope) in ropes.items()}  # fmt: skip
        ropes = None if None in layouts.values() else {
            t: (r, layouts[t]) for t, (r, _) in ropes.items()}  # fmt: skip
    if ropes is None and path == "rotary":
        raise ValueError("path='rotary': HF's attention cannot apply this scheme (not RoPE in "
                         "the model's pairing and width, per layer type, with its windows and "
                         "chunks): use path='auto' or 'attention'")  # fmt: skip
    if ropes is not None:
        base.rotary_emb = hooks.Rotary(ropes)
        _keep(model, base, schedule, "rotary")
        return model
    if not model._can_set_attn_implementation():
        raise ValueError(f"{type(model).__name__}'s attention does not go through "
                         "transformers' AttentionInterface: posenc can only replace its "
                         "rotary_emb, and this scheme needs posenc's attention")  # fmt: skip
    for i, ((enc, _), layer, module) in enumerate(zip(mine, schedule, modules, strict=True)):
        if module is None:
            continue
        if enc is not None and enc.position_axes != 1:
            raise ValueError(f"layer {i}: {type(enc).__name__} reads {enc.position_axes} "
                             "position axes (M-RoPE), which transformers passes to the "
                             "model's rotary only: posenc puts it in only as the model's "
                             "own M-RoPE, unchanged")  # fmt: skip
        _check_fit(enc, module, i, config)
        sinks = [n for n, _ in module.named_parameters(recurse=False) if "sink" in n]
        if sinks:
            raise ValueError(f"layer {i}: {type(module).__name__} has learned attention sinks "
                             f"({sinks[0]}), which posenc's attention does not apply: this "
                             "model takes RoPE only, through its own attention")  # fmt: skip
        if enc is not None and "qk" in enc.places and (name := hooks.permutes(module)):
            raise ValueError(f"layer {i}: {type(module).__name__}'s {name} reorders the "
                             "channels of q and k before attention, so posenc cannot encode "
                             f"them there: {type(enc).__name__} on this model goes in only "
                             "as RoPE in the model's own layout")  # fmt: skip
        enc = NoPE() if enc is None else enc
        module.__dict__["posenc_layer"] = hooks.Bound(enc, layer.window, layer.chunk, backend)
    form = _forms(base, config)
    base.rotary_emb = hooks.Unrotated(form)
    hooks.register()
    model.set_attn_implementation(hooks.NAME)
    _keep(model, base, schedule, "attention")
    return model


def _base(model):
    """The module holding the decoder's layers (a ModuleList of ``num_hidden_layers``, as
    ``layers`` or Falcon's ``h``) and its ``rotary_emb``: the base model."""
    for base in (getattr(model, "base_model", model), *model.modules()):
        if hasattr(base, "rotary_emb") and hasattr(base, "config") and _layers(base) is not None:
            return base
    raise ValueError(f"{type(model).__name__} has no base model with decoder layers and one "
                     "rotary_emb (transformers 5's decoders): posenc cannot put a scheme into "
                     "it")  # fmt: skip


def _layers(base):
    depth = getattr(base.config, "num_hidden_layers", None)
    for child in base.children():
        if isinstance(child, nn.ModuleList) and len(child) == depth:
            return child
    return None


def _schedule(scheme, config):
    depth = getattr(config, "num_hidden_layers", None)
    if isinstance(scheme, dict):
        scheme = Schedule.from_hf(scheme)
    elif isinstance(scheme, PositionalEncoding):
        if "input" in scheme.places:
            raise ValueError(f"scheme {type(scheme).__name__} acts on the input embeddings: "
                             "posenc.hf.use puts schemes into attention")  # fmt: skip
        scheme = Schedule.uniform(scheme, depth)
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


def _rotary_fit(mine, own, config, modules):
    """``{layer_type: (RotaryEmbedding, the model's own)}`` where HF's attention can apply the
    scheme, else None.

    ``mine`` and ``own`` are the scheme's and the model's layers, each ``(encoding, limits)``
    with what the model's attention applies itself removed (:func:`_positional`)."""
    if own is None:
        return None
    types = list(getattr(config, "layer_types", None) or [None] * len(mine))
    ropes = {}
    for i, ((enc, limits), (theirs, own_limits)) in enumerate(zip(mine, own, strict=True)):
        if modules[i] is None:
            continue
        if limits != own_limits or (enc is None) != (theirs is None):
            return None
        if enc is None:
            continue
        (wrap, rope), (own_wrap, own_rope) = peel(enc), peel(theirs)
        if type(rope) is not RotaryEmbedding or type(own_rope) is not RotaryEmbedding:
            return None
        if wrap != own_wrap or (rope.head_dim, rope.rotary_dim, rope.pairing) != (
            own_rope.head_dim, own_rope.rotary_dim, own_rope.pairing
        ):  # fmt: skip
            return None
        key = types[i] if _per_type(config) else None
        if ropes.setdefault(key, (rope, own_rope))[0] is not rope:
            return None  # layers of one type with different RoPEs: HF has one per type
    return ropes or None


def _per_type(config):
    params = getattr(config, "rope_parameters", None)
    types = set(getattr(config, "layer_types", None) or ())
    return isinstance(params, dict) and bool(types) and types <= set(params)


def _positional(enc, own, i, model_type):
    """The layer's encoding without what HF's attention applies itself: an outer
    :class:`SoftmaxFactor` equal to the model's own (HF's ``scaling``), Llama 4's query
    temperature; ``None`` for no position."""
    if enc is None or type(enc) is NoPE:
        return None
    theirs = own[i].encoding if own is not None and own[i].attention else None
    if isinstance(enc, SoftmaxFactor) and isinstance(theirs, SoftmaxFactor) and (
        abs(enc.factor - theirs.factor) <= 1e-12 * theirs.factor
    ):  # fmt: skip
        enc, theirs = enc.inner, theirs.inner
    if model_type in OWN_TEMPERATURE:
        own_t = theirs if isinstance(theirs, QueryTemperature) else None
        mine_t = enc if isinstance(enc, QueryTemperature) else None
        if own_t is not None and (mine_t is None or peel(mine_t)[0][0] != peel(own_t)[0][0]):
            raise ValueError(f"layer {i}: {model_type}'s attention multiplies the queries by "
                             "its own temperature, which posenc cannot remove; give the "
                             "layer that QueryTemperature (Schedule.from_hf's)")  # fmt: skip
        if mine_t is not None and own_t is not None:
            enc = enc.inner
    return None if type(enc) is NoPE else enc


def _check_fit(enc, module, i, config):
    if enc is None:
        return
    width = getattr(module, "head_dim", None)
    need = enc.inner if isinstance(enc, ChannelSlice) else enc
    got = getattr(need, "head_dim", None)
    if not isinstance(enc, ChannelSlice) and None not in (got, width) and got != width:
        raise ValueError(f"layer {i}: {type(need).__name__} has head_dim={got}, the "
                         f"model's attention heads are {width} wide")  # fmt: skip
    heads = getattr(need, "heads", None)
    have = getattr(config, "num_attention_heads", None)
    if heads is not None and have is not None and heads != have:
        raise ValueError(f"layer {i}: {type(need).__name__} has heads={heads}, the model "
                         f"num_attention_heads={have}")  # fmt: skip


def _forms(base, config):
    """The form of the model's rotary output, per layer type where it has one per type."""
    rotary = base.rotary_emb
    device = next(base.parameters()).device
    types = sorted(set(getattr(config, "layer_types", None) or ())) if _per_type(config) else []
    forms = {t: hooks.probe_form(rotary, config, device, t) for t in types}
    return forms or {None: hooks.probe_form(rotary, config, device)}


def _keep(model, base, schedule, path):
    """The scheme's encodings as submodules of the model (trained, moved, saved once), and
    the config saying what the model runs (:func:`posenc.torch.hf.export.mark`)."""
    weight = next(base.parameters(), None)
    base.posenc_encodings = nn.ModuleList(schedule.encodings)
    if weight is not None and weight.is_floating_point():  # the model's device and dtype
        base.posenc_encodings.to(device=weight.device, dtype=weight.dtype)
    model.posenc_path = path
    model.posenc_schedule = schedule
    mark(base.config, schedule, path)
    return model

