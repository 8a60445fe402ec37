"""The attention posenc.hf.use registers with transformers, and its mask function.

(The modules it puts in place of a model's ``rotary_emb`` are in :mod:`.rotary`.)

* :func:`attention` is registered with transformers' ``AttentionInterface`` as ``"posenc"``:
  it receives HF's q, k, v and ``position_ids`` and calls :func:`posenc.torch.attend` with
  the layer's encoding, window and chunk (a :class:`Bound` kept on HF's attention module);
* :func:`padding_only` is its mask function (the keys' padding, or ``None``): posenc
  builds the causal, window, chunk and document masks.

Shape legend: q ``(batch, heads, seq_q, head_dim)``, k and v ``(batch, kv_heads, seq_k, ·)``,
``position_ids`` ``(batch|1, seq_q)``.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import torch

from posenc.torch.attention.core import attend
from posenc.torch.documents import documents_from_positions
from posenc.torch.encodings.wrappers import SoftmaxFactor

__all__ = ["NAME", "Bound", "attention", "padding_only", "register", "LOCAL"]

NAME = "posenc"  # the name of the attention function and its mask in transformers' registries
LOCAL = threading.local()  # this thread's last position_ids, and their packed documents


@dataclass(eq=False)
class Bound:
    """One attention layer's posenc settings, kept on HF's attention module (a plain object,
    not a submodule: the encodings are registered once, on the model)."""

    encoding: object
    window: int | None
    chunk: int | None
    backend: str
    factor: float | None = None  # the scheme's softmax factor; None: the model's own scale
    layer: object = None  # HF's decoder layer (is it checkpointed?), a plain reference
    scaled: dict = field(default_factory=dict)  # (scaling, width) -> encoding with that scale

    def with_scale(self, scaling, width):
        """The encoding with the layer's softmax scale: the scheme's factor where it gives
        one, else HF's ``scaling`` as a factor ``scaling * sqrt(width)`` on ``1 /
        sqrt(width)`` (a :class:`SoftmaxFactor` built once per scale and width)."""
        key = (scaling, width)
        if key not in self.scaled:
            factor = self.factor
            if factor is None:
                factor = 1.0 if scaling is None else float(scaling) * math.sqrt(width)
            near = abs(factor - 1.0) <= 1e-12
            self.scaled[key] = (
                self.encoding if near else SoftmaxFactor(self.encoding, factor=factor)
            )
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
    if kwargs.get("softcap") is not None:
        raise ValueError(f"{type(module).__name__} passes softcap={kwargs['softcap']!r}, which "
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
        if torch.is_grad_enabled() and getattr(bound.layer, "gradient_checkpointing", False):
            raise ValueError(
                f"{type(module).__name__} is not passed position_ids, and gradient "
                "checkpointing would recompute it with another forward's: turn gradient "
                "checkpointing off for posenc's attention in this model"
            )
        pos = getattr(LOCAL, "positions", None)
        pos = pos if pos is not None and pos.shape[-1] == sq else None
    q_pos, k_pos, docs = _positions(pos, sq, sk, pad, query.shape[0])
    enc = bound.with_scale(scaling, query.shape[-1])
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True))  # encoders: False
    out = attend(
        query, key, value, enc, q_positions=q_pos, k_positions=k_pos, causal=bool(causal),
        padding_mask=pad, window=bound.window, chunk=bound.chunk, documents=docs,
        backend=bound.backend, sinks=kwargs.get("s_aux"),  # GPT-OSS's learned logit per head
    )  # (b, heads, seq_q, v_dim)  # fmt: skip
    return out.transpose(1, 2), None  # (b, seq_q, heads, v_dim)


def _positions(position_ids, sq, sk, pad, batch):
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
    if run is not None and run.stop < sk:
        raise ValueError(
            f"{sk} keys for positions up to {run.stop - 1}: more keys than positions, as a "
            "static cache's empty slots (cache_implementation='static'), or positions that "
            "do not start at 0; posenc's attention runs with transformers' dynamic caches"
        )
    if run is not None:
        return run, range(run.stop - sk, run.stop), None
    if sq == sk:  # packed rows keep their documents apart, padded or not
        return position_ids, position_ids, _packed(position_ids, batch)
    back = torch.arange(sk - 1, -1, -1, device=position_ids.device)  # (sk,)
    k_pos = (position_ids[:, -1:] - back).clamp_min(0)  # (b|1, sk)
    return position_ids, k_pos, None


def _run(position_ids):
    """``range(p, p + seq)`` where every row of ``position_ids`` is that run, else ``None``:
    one host read per tensor (every layer of a forward gets the same one); never while
    compiling (the positions stay tensors there)."""
    last = getattr(LOCAL, "run", None)
    if last is not None and last[0] is position_ids and last[2] == position_ids._version:
        return last[1]  # the same tensor, not written to since
    found = None
    if not torch.compiler.is_compiling():
        start = position_ids[:, :1]  # (b|1, 1)
        steps = torch.arange(position_ids.shape[-1], device=position_ids.device)
        same = (position_ids == start[:1] + steps).all()  # every row the first row's run
        same, first = torch.stack([same.long(), start[0, 0].long()]).tolist()
        found = range(first, first + position_ids.shape[-1]) if same else None
    LOCAL.run = (position_ids, found, position_ids._version)
    return found


def _packed(position_ids, batch):
    """Document ids ``(batch, seq)`` where ``position_ids`` restart at 0 inside a row (HF's
    flattening collator), else ``None``; read once per tensor (every layer gets the same
    one). While compiling nothing is read: the ids are always given (a document mask)."""
    rows = position_ids.expand(batch, -1)  # (b, seq): HF passes (1, seq) for every row
    if torch.compiler.is_compiling():
        return documents_from_positions(rows)
    last = getattr(LOCAL, "last", None)
    if last is not None and last[0] is position_ids and last[2] == position_ids._version:
        return last[1]
    docs = None
    if rows.shape[-1] > 1 and bool((rows[:, 1:] == 0).any()):
        docs = documents_from_positions(rows)  # (b, seq)
    LOCAL.last = (position_ids, docs, position_ids._version)
    return docs


def padding_only(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                 mask_function=None, attention_mask=None, **kwargs):  # fmt: skip
    """transformers' mask interface for ``"posenc"``: the keys' padding ``(batch, kv_length)``
    (bool, ``True`` for real keys), or ``None`` where every key is real."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:].bool()  # (b, kv_length)
    if torch.compiler.is_compiling() or mask.shape[1] != kv_length:
        return mask  # nothing read back while compiling; a short mask is refused at use
    return None if bool(mask.all()) else mask


def register():
    """Register :func:`attention` and :func:`padding_only` with transformers as ``"posenc"``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, padding_only)
