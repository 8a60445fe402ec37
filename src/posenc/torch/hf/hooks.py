"""What :func:`posenc.hf.use <posenc.torch.hf.use>` puts into a transformers model: rotary modules and an attention.

* :class:`Rotary` replaces a model's ``rotary_emb``: posenc's RoPE handed to HF's own
  attention as HF's ``(cos, sin)``, per layer type where the model has several;
* :class:`Unrotated` replaces it where posenc encodes inside attention: HF's rotation made
  the identity, in the form the model's apply function takes;
* :func:`attention` is registered with transformers' ``AttentionInterface`` as ``"posenc"``:
  it receives HF's q, k, v and ``position_ids`` and calls :func:`posenc.torch.attend` with
  the layer's encoding, window and chunk; :func:`padding_only` is its mask function (the
  keys' padding, or ``None``): posenc builds the causal, window, chunk and document masks.

Shape legend: q ``(batch, heads, seq_q, head_dim)``, k and v ``(batch, kv_heads, seq_k, ·)``,
``position_ids`` ``(batch|1, seq_q)``.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import torch
from torch import nn

from posenc.torch.attention.core import attend
from posenc.torch.documents import documents_from_positions
from posenc.torch.encodings.wrappers import SoftmaxFactor

__all__ = ["NAME", "Bound", "Rotary", "Unrotated", "attention", "padding_only", "register"]

NAME = "posenc"  # the name of the attention function and its mask in transformers' registries
_LOCAL = threading.local()  # this thread's last position_ids, and their packed documents


class Rotary(nn.Module):
    """posenc's RoPE in the form the model's own rotary returns (``layout``, found by
    :func:`layout_of`): ``"cat"`` ``(cos, sin)`` of ``[c, c]`` (HF's ``rotate_half``; GLM and
    DeepSeek interleave in their apply function), ``"interleave"`` of ``c`` repeated in
    place, ``"half"`` of ``c`` alone (GPT-OSS), ``"complex"`` ``c + i s`` (Llama 4); each
    ``(batch|1, seq, ·)``.

    Parameters
    ----------
    ropes : dict
        ``{layer_type: (RotaryEmbedding, layout)}`` (``None``: one for every layer).
    """

    def __init__(self, ropes):
        super().__init__()
        self.by_type = dict(ropes)
        self.encodings = nn.ModuleList(dict.fromkeys(r for r, _ in self.by_type.values()))

    def forward(self, x, position_ids, layer_type=None):
        rope, layout = self.by_type[layer_type if layer_type in self.by_type else None]
        return form(rope.table(position_ids, x.dtype, device=x.device), layout, x.dtype)


def form(cs, layout, dtype):
    """``[cos, sin]`` rows ``(b|1, seq, r // 2, 2)`` in a model's rotary ``layout``."""
    cos, sin = cs.unbind(-1)  # (b|1, seq, r // 2) each
    if layout == "complex":
        return torch.complex(cos, sin)  # (b|1, seq, r // 2)
    if layout == "cat":
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # (b|1, seq, r)
    elif layout == "interleave":
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)  # (b|1, seq, r)
    return cos.to(dtype), sin.to(dtype)


def layout_of(rotary, rope, device, layer_type=None):
    """The layout in which ``rotary`` (a model's own) returns what ``rope`` computes, at
    positions 0..15; ``None`` where none matches (posenc then encodes in attention)."""
    x = torch.zeros(1, 1, 1, device=device)
    pos = torch.arange(16, device=device)[None]  # (1, 16)
    with torch.no_grad():
        theirs = rotary(x, pos) if layer_type is None else rotary(x, pos, layer_type)
        cs = rope.table(pos, torch.float32, device=device)
        for layout in ("cat", "interleave", "half", "complex"):
            mine = form(cs, layout, torch.float32)
            if _close(theirs, mine):
                return layout
    return None


def _close(a, b):
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool(torch.allclose(a.to(b.dtype), b, atol=1e-5))
    return len(a) == len(b) and all(_close(u, v) for u, v in zip(a, b, strict=True))


def permutes(module):
    """Whether a rotary apply function of ``module``'s modeling file changes q at the identity
    rotation (cos 1, sin 0): DeepSeek's ``apply_rotary_pos_emb_interleave`` reorders the
    channels, so an encoding of q and k in posenc's attention would see them reordered."""
    import inspect
    import sys

    mod = sys.modules.get(type(module).__module__)
    q = torch.arange(8.0).reshape(1, 1, 1, 8)
    for name, fn in vars(mod or object).items():
        if not (name.startswith(("apply_rotary", "_apply_rotary")) and inspect.isfunction(fn)):
            continue
        try:
            out = fn(q, q.clone(), torch.ones(1, 1, 8), torch.zeros(1, 1, 8))
        except Exception:
            continue  # another signature: not one this probe can call
        got = out[0] if isinstance(out, tuple) else out
        if isinstance(got, torch.Tensor) and got.shape == q.shape and not torch.equal(got, q):
            return name
    return None


class Unrotated(nn.Module):
    """HF's rotation made the identity: ``cos = 1, sin = 0`` (or a complex 1) of the width
    and form the model's own rotary returned for one probe position, per layer type."""

    def __init__(self, forms):
        super().__init__()
        self.forms = dict(forms)  # {layer_type or None: ("cos_sin" | "complex", width)}

    def forward(self, x, position_ids, layer_type=None):
        kind, width = self.forms[layer_type if layer_type in self.forms else None]
        if position_ids is None:
            raise ValueError("position_ids is None: the model passed its rotary no positions")
        _LOCAL.positions = position_ids  # for attention that is not passed them (Llama 4)
        shape = (*position_ids.shape[-2:], width) if position_ids.dim() > 1 else (
            1, position_ids.shape[-1], width)  # fmt: skip
        if kind == "complex":
            one = torch.ones((), dtype=torch.complex128 if x.dtype == torch.float64
                             else torch.complex64, device=x.device)  # fmt: skip
            return one.expand(shape)
        return x.new_ones(()).expand(shape), x.new_zeros(()).expand(shape)


def probe_form(rotary, config, device, layer_type=None):
    """The form of what a model's rotary returns, from one call at position 0."""
    x = torch.zeros(1, 1, 1, device=device)
    pos = torch.zeros(1, 1, dtype=torch.long, device=device)
    args = (x, pos) if layer_type is None else (x, pos, layer_type)
    with torch.no_grad():
        out = rotary(*args)
    if isinstance(out, torch.Tensor) and out.is_complex():
        return ("complex", out.shape[-1])
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return ("cos_sin", out[0].shape[-1])
    raise ValueError(
        f"{type(rotary).__name__} returns {type(out).__name__}, not (cos, sin) or complex "
        "rotations: posenc cannot make its rotation the identity"
    )


@dataclass(eq=False)
class Bound:
    """One attention layer's posenc settings, kept on HF's attention module (a plain object,
    not a submodule: the encodings are registered once, on the model)."""

    encoding: object
    window: int | None
    chunk: int | None
    backend: str
    scaled: dict = field(default_factory=dict)  # (scaling, width) -> encoding with that scale

    def with_scale(self, scaling, width):
        """The encoding with HF's softmax scale: a :class:`SoftmaxFactor` of ``scaling *
        sqrt(width)`` where that is not 1 (built once per scale and width)."""
        key = (scaling, width)
        if key not in self.scaled:
            factor = 1.0 if scaling is None else float(scaling) * math.sqrt(width)
            near = abs(factor - 1.0) <= 1e-12
            self.scaled[key] = self.encoding if near else SoftmaxFactor(self.encoding, factor=factor)
        return self.scaled[key]


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface, as posenc's :func:`~posenc.torch.attend`.

    Returns
    -------
    tuple
        The output ``(batch, seq_q, heads, v_dim)`` and ``None`` (no weights).
    """
    bound = module.__dict__.get("posenc_layer")
    if bound is None:
        raise ValueError(f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) "
                         "has no posenc layer: call posenc.hf.use(model, scheme) first")  # fmt: skip
    if dropout and module.training:
        raise ValueError(f"attention dropout {dropout} is not offered by posenc's attention: "
                         "set the config's attention_dropout to 0")  # fmt: skip
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"{type(module).__name__} passes {name}={kwargs[name]!r}, which "
                             "posenc's attention does not apply")  # fmt: skip
    sq, sk = query.shape[2], key.shape[2]
    pad = attention_mask
    if pad is not None and (pad.dim() != 2 or pad.shape != (query.shape[0], sk)):
        raise ValueError(
            f"the keys' padding mask must be (batch, seq_k) = ({query.shape[0]}, {sk}), got "
            f"{tuple(pad.shape)}: posenc runs with transformers' dynamic caches only"
        )
    pos = kwargs.get("position_ids")
    if pos is None:  # the positions this forward gave the model's rotary (one per forward)
        pos = getattr(_LOCAL, "positions", None)
        pos = pos if pos is not None and pos.shape[-1] == sq else None
    q_pos, k_pos, docs = _positions(pos, sq, sk, pad)
    enc = bound.with_scale(scaling, query.shape[-1])
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True))  # encoders: False
    out = attend(
        query, key, value, enc, q_positions=q_pos, k_positions=k_pos, causal=bool(causal),
        padding_mask=pad, window=bound.window, chunk=bound.chunk, documents=docs,
        backend=bound.backend,
    )  # (b, heads, seq_q, v_dim)  # fmt: skip
    return out.transpose(1, 2), None  # (b, seq_q, heads, v_dim)


def _positions(position_ids, sq, sk, pad):
    """Query and key positions and packed documents of one call: HF's ``position_ids`` for
    the queries; the keys are the last ``sk`` positions up to the last query (a dynamic
    cache ends with this step's keys), padding at position 0 (masked). Where every row's
    positions are one run ``p, p + 1, ...`` and no key is padding, they are ranges (read
    once per forward): posenc's attention then needs no check or gather of them."""
    if position_ids is None:
        return None, None, None
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be (batch, seq), got {tuple(position_ids.shape)}: "
                         "multi-axis positions (M-RoPE) go through the model's own rotary")  # fmt: skip
    run = _run(position_ids) if pad is None else None
    if run is not None and run.stop >= sk:
        return run, range(run.stop - sk, run.stop), None
    if sq == sk:
        docs = _packed(position_ids) if pad is None else None
        return position_ids, position_ids, docs
    back = torch.arange(sk - 1, -1, -1, device=position_ids.device)  # (sk,)
    k_pos = (position_ids[:, -1:] - back).clamp_min(0)  # (b|1, sk)
    return position_ids, k_pos, None


def _run(position_ids):
    """``range(p, p + seq)`` where every row of ``position_ids`` is that run, else ``None``:
    one host read per tensor (every layer of a forward gets the same one); never while
    compiling (the positions stay tensors there)."""
    last = getattr(_LOCAL, "run", None)
    if last is not None and last[0] is position_ids and last[2] == position_ids._version:
        return last[1]  # the same tensor, not written to since
    found = None
    if not torch.compiler.is_compiling():
        start = position_ids[:, :1]  # (b|1, 1)
        steps = torch.arange(position_ids.shape[-1], device=position_ids.device)
        same = (position_ids == start[:1] + steps).all()  # every row the first row's run
        same, first = torch.stack([same.long(), start[0, 0].long()]).tolist()
        found = range(first, first + position_ids.shape[-1]) if same else None
    _LOCAL.run = (position_ids, found, position_ids._version)
    return found


def _packed(position_ids):
    """Document ids where ``position_ids`` restart at 0 inside a row (HF's flattening
    collator), else ``None``; read once per tensor (every layer gets the same one)."""
    last = getattr(_LOCAL, "last", None)
    if last is not None and last[0] is position_ids and last[2] == position_ids._version:
        return last[1]
    docs = None
    if position_ids.shape[-1] > 1 and bool((position_ids[:, 1:] == 0).any()):
        docs = documents_from_positions(position_ids)  # (b, seq)
    _LOCAL.last = (position_ids, docs, position_ids._version)
    return docs


def padding_only(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                 mask_function=None, attention_mask=None, **kwargs):  # fmt: skip
    """transformers' mask interface for ``"posenc"``: the keys' padding ``(batch, kv_length)``
    (bool, ``True`` for real keys), or ``None`` where every key is real."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:].bool()  # (b, kv_length)
    return None if mask.shape[1] == kv_length and bool(mask.all()) else mask


def register():
    """Register :func:`attention` and :func:`padding_only` with transformers as ``"posenc"``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, padding_only)
