"""The modules :func:`posenc.hf.use` puts in place of a transformers model's ``rotary_emb``.

* :class:`Rotary`: posenc's RoPE handed to HF's own attention, in the form the model's own
  rotary returns (:func:`layout_of`), per layer type where the model has several;
* :class:`Unrotated`: HF's rotation made the identity, where posenc encodes inside its
  attention (:mod:`.hooks`); it also keeps each forward's positions for attention that is
  not passed them.
"""

from __future__ import annotations

import inspect
import sys

import torch
from torch import nn

from posenc.torch.encodings.wrappers import delegate_attribute
from posenc.torch.hf.hooks import LOCAL, NAME

__all__ = ["Rotary", "Unrotated", "form", "layout_of", "probe_form", "permutes", "call"]


class _Standin(nn.Module):
    """A stand-in for a model's ``rotary_emb``: attributes it does not have come from the
    model's own (``original``), which some models read while running (LFM3's
    ``layer_types``)."""

    def __getattr__(self, name):
        return delegate_attribute(self, name, "original")


class Rotary(_Standin):
    """posenc's RoPE in the form the model's own rotary returns (``layout``, found by
    :func:`layout_of`): ``"cat"`` ``(cos, sin)`` of ``[c, c]`` (HF's ``rotate_half``; GLM and
    DeepSeek interleave in their apply function), ``"interleave"`` of ``c`` repeated in
    place, ``"half"`` of ``c`` alone (GPT-OSS), ``"complex"`` ``c + i s`` (Llama 4); each
    ``(batch|1, seq, ·)``.

    Parameters
    ----------
    ropes : dict
        ``{layer_type: (RotaryEmbedding, layout)}`` (``None``: one for every layer).
    original : torch.nn.Module
        The model's own rotary, called for a layer type ``ropes`` does not hold.
    """

    def __init__(self, ropes, original):
        super().__init__()
        self.by_type = dict(ropes)
        self.encodings = nn.ModuleList(dict.fromkeys(r for r, _ in self.by_type.values()))
        self.original = original  # the model's own, for a layer type the scheme leaves alone

    def forward(self, x, position_ids, layer_type=None):
        key = layer_type if layer_type in self.by_type else None
        if key not in self.by_type:  # a layer type without RoPE in the scheme: the model's
            return self.original(x, position_ids, layer_type)
        rope, layout = self.by_type[key]
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
    # rates kept in half precision (a model cast to bf16) move the angles by up to ~0.06 here;
    # the layouts differ by far more (cos 15 against cos 1.5 for the two fastest pairs)
    low = any(b.is_floating_point() and b.dtype not in (torch.float32, torch.float64)
              for b in rotary.buffers())  # fmt: skip
    with torch.no_grad():
        theirs = call(rotary, x, pos, layer_type)
        cs = rope.table(pos, torch.float32, device=device)
        for layout in ("cat", "interleave", "half", "complex"):
            mine = form(cs, layout, torch.float32)
            if _close(theirs, mine, 0.1 if low else 1e-5):
                return layout
    return None


def call(rotary, x, position_ids, layer_type=None):
    """A model's rotary at ``position_ids``: with the layer type where it takes one (a rotary
    that needs one though its parameters are not per type, LFM3's, gets the first of the
    config's layer types it knows)."""
    if layer_type is not None:
        return rotary(x, position_ids, layer_type)
    need = inspect.signature(rotary.forward).parameters.get("layer_type")
    if need is None or need.default is not inspect.Parameter.empty:
        return rotary(x, position_ids)
    types = getattr(getattr(rotary, "config", None), "layer_types", None) or []
    for kind in dict.fromkeys(types):
        try:
            return rotary(x, position_ids, kind)
        except KeyError:  # a layer type without RoPE (a convolution, say)
            continue
    raise ValueError(f"{type(rotary).__name__} takes a layer_type, and none of the config's "
                     f"layer types {sorted(set(types))} has a RoPE")  # fmt: skip


def _close(a, b, atol):
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool(torch.allclose(a.to(b.dtype), b, atol=atol))
    return len(a) == len(b) and all(_close(u, v, atol) for u, v in zip(a, b, strict=True))


def permutes(module):
    """Whether a rotary apply function of ``module``'s modeling file changes q at the identity
    rotation (cos 1, sin 0): DeepSeek's ``apply_rotary_pos_emb_interleave`` reorders the
    channels, so an encoding of q and k in posenc's attention would see them reordered."""
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


class Unrotated(_Standin):
    """HF's rotation made the identity: ``cos = 1, sin = 0`` (or a complex 1) of the width
    and form the model's own rotary returned for one probe position, per layer type."""

    def __init__(self, forms, config, original):
        super().__init__()
        self.original = original  # the model's own: its attributes, and nothing else
        self.forms = dict(forms)  # {layer_type or None: ("cos_sin" | "complex", width)}
        self.__dict__["config"] = config  # a plain reference: which attention runs

    def forward(self, x, position_ids, layer_type=None):
        if self.config._attn_implementation != NAME:
            raise ValueError(
                f"the model's attention is now {self.config._attn_implementation!r}, but "
                "posenc.hf.use made its rotation the identity for posenc's attention: the "
                "model would run without positions; keep attn_implementation 'posenc'"
            )
        kind, width = self.forms[layer_type if layer_type in self.forms else None]
        if position_ids is None:
            raise ValueError("position_ids is None: the model passed its rotary no positions")
        LOCAL.positions = position_ids  # for attention that is not passed them (Llama 4)
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
    with torch.no_grad():
        out = call(rotary, x, pos, layer_type)
    if isinstance(out, torch.Tensor) and out.is_complex():
        return ("complex", out.shape[-1])
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return ("cos_sin", out[0].shape[-1])
    raise ValueError(
        f"{type(rotary).__name__} returns {type(out).__name__}, not (cos, sin) or complex "
        "rotations: posenc cannot make its rotation the identity"
    )
