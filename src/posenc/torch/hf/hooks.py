"""What :func:`posenc.hf.use` puts into a transformers model: rotary modules and an attention.

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
_LOCAL = threading.local()  # the document ids of the last packed position_ids seen


class Rotary(nn.Module):
    """posenc's RoPE as HF's ``(cos, sin)``: ``(batch|1, seq, head_dim)`` each, in the model's
    pairing (``"half"``: the two halves repeat, HF's ``rotate_half``; ``"interleaved"``:
    each value twice in a row).

    Parameters
    ----------
    ropes : dict
        ``{layer_type: RotaryEmbedding}`` (``None``: the model's one rotary for every layer).
    """

    def __init__(self, ropes):
        super().__init__()
        self.by_type = dict(ropes)
        self.encodings = nn.ModuleList(dict.fromkeys(self.by_type.values()))

    def forward(self, x, position_ids, layer_type=None):
        rope = self.by_type[layer_type if layer_type in self.by_type else None]
        cs = rope.table(position_ids, x.dtype, device=x.device)  # (b|1, seq, r // 2, 2)
        cos, sin = cs.unbind(-1)  # (b|1, seq, r // 2) each
        if rope.pairing == "half":
            cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # (b|1, seq, r)
        else:
            cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        return cos.to(x.dtype), sin.to(x.dtype)


class Unrotated(nn.Module):
    """HF's rotation made the identity: ``cos = 1, sin = 0`` (or a complex 1) of the width
    and form the model's own rotary returned for one probe position."""

    def __init__(self, form):
        super().__init__()
        self.form = form  # ("cos_sin", width) or ("complex", width)

    def forward(self, x, position_ids, layer_type=None):
        kind, width = self.form
        if position_ids is None:
            raise ValueError("position_ids is None: the model passed its rotary no positions")
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
    q_pos, k_pos, docs = _positions(kwargs.get("position_ids"), sq, sk, pad)
    enc = bound.with_scale(scaling, query.shape[-1])
    out = attend(
        query, key, value, enc, q_positions=q_pos, k_positions=k_pos, padding_mask=pad,
        window=bound.window, chunk=bound.chunk, documents=docs, backend=bound.backend,
    )  # (b, heads, seq_q, v_dim)  # fmt: skip
    return out.transpose(1, 2), None  # (b, seq_q, heads, v_dim)


def _positions(position_ids, sq, sk, pad):
    """Query and key positions and packed documents of one call: HF's ``position_ids`` for
    the queries; the keys are the last ``sk`` positions up to the last query (a dynamic
    cache ends with this step's keys), padding at position 0 (masked)."""
    if position_ids is None:
        return None, None, None
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be (batch, seq), got {tuple(position_ids.shape)}: "
                         "multi-axis positions (M-RoPE) go through the model's own rotary")  # fmt: skip
    if sq == sk:
        docs = _packed(position_ids) if pad is None else None
        return position_ids, position_ids, docs
    back = torch.arange(sk - 1, -1, -1, device=position_ids.device)  # (sk,)
    k_pos = (position_ids[:, -1:] - back).clamp_min(0)  # (b|1, sk)
    return position_ids, k_pos, None


def _packed(position_ids):
    """Document ids where ``position_ids`` restart at 0 inside a row (HF's flattening
    collator), else ``None``; read once per tensor (every layer gets the same one)."""
    last = getattr(_LOCAL, "last", None)
    if last is not None and last[0] is position_ids:
        return last[1]
    docs = None
    if position_ids.shape[-1] > 1 and bool((position_ids[:, 1:] == 0).any()):
        docs = documents_from_positions(position_ids)  # (b, seq)
    _LOCAL.last = (position_ids, docs)
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
