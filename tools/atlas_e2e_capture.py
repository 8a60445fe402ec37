"""The capture of the atlas's end-to-end check: what HF's attention received and returned.

Inside one forward of HF's model, :func:`capture` records, per attention layer, the calls of
the modeling module's ``apply_rotary*`` functions (inputs and outputs) and of its
``eager_attention_forward`` (q, k, v and the attention output); :func:`pre_position` turns
them into the q and k before any position was applied. :func:`float64_everywhere` keeps
HF's float32 casts (``Tensor.float``, ``softmax(dtype=torch.float32)``) in float64, and
:func:`float_is_float64` its ``dtype=torch.float`` as well (tools/atlas_use.py, the tests
of ``posenc.hf.use``).
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from atlas_e2e_config import S


@contextlib.contextmanager
def float64_everywhere():
    """HF's ``.float()`` and ``softmax(dtype=torch.float32)`` keep float64 tensors float64."""
    F = torch.nn.functional
    to_float, softmax = torch.Tensor.float, F.softmax

    def keep(self, *a, **kw):
        return self if self.dtype == torch.float64 else to_float(self, *a, **kw)

    def soft(x, *a, dtype=None, **kw):
        return softmax(x, *a, dtype=None if x.dtype == torch.float64 else dtype, **kw)

    torch.Tensor.float, F.softmax = keep, soft
    try:
        yield
    finally:
        torch.Tensor.float, F.softmax = to_float, softmax


@contextlib.contextmanager
def float_is_float64():
    """``torch.float`` read as float64 while HF builds and runs the model: its rotary classes
    compute their inverse frequencies as ``arange(..., dtype=torch.float)`` and cast them
    ``.to(dtype=torch.float)`` per call, which would hide float64's agreement behind ~1e-7
    (posenc names its dtypes, ``torch.float32``, and never reads ``torch.float``)."""
    keep = torch.float
    torch.float = torch.float64
    try:
        yield
    finally:
        torch.float = keep


def _heads_first(t):
    """(b, s, h, d) -> (b, h, s, d); heads (<= 2) never equal the sequence length S."""
    return t.transpose(1, 2) if t.dim() == 4 and t.shape[1] == S and t.shape[2] != S else t


@contextlib.contextmanager
def capture(module, model):
    """Record each eager attention call with the apply calls of its layer before it."""
    calls, pending, q_out = [], [], {}
    saved = dict(vars(module))

    def wrap_apply(fn):
        def apply(*args, **kw):
            out = fn(*args, **kw)
            tensors = [a for a in args if torch.is_tensor(a)]
            pending.append((tensors, out))
            return out

        return apply

    def eager(mod, q, k, v, *args, **kw):
        out = saved["eager_attention_forward"](mod, q, k, v, *args, **kw)
        calls.append({"module": mod, "q": q, "k": k, "v": v, "out": out[0],
                      "applies": list(pending), "q_proj": q_out.get(id(mod))})  # fmt: skip
        pending.clear()
        return out

    def keep_q(key):
        def hook(m, i, o):
            q_out[key] = o

        return hook

    hooks = []
    for mod in model.modules():
        proj = getattr(mod, "q_proj", None)
        if isinstance(proj, torch.nn.Module) and hasattr(mod, "layer_idx"):
            hooks.append(proj.register_forward_hook(keep_q(id(mod))))
    for name, fn in saved.items():
        if name.startswith("apply_rotary") and inspect.isfunction(fn) and "vision" not in name:
            setattr(module, name, wrap_apply(fn))
    if "eager_attention_forward" in saved:
        module.eager_attention_forward = eager
    try:
        yield calls
    finally:
        for name in saved:
            if name.startswith("apply_rotary") or name == "eager_attention_forward":
                setattr(module, name, saved[name])
        for h in hooks:
            h.remove()


def _place(full, rotated_out, rotated_in):
    """``full`` (b, h, s, D) with the channels where ``rotated_out`` (b, h|1, s, r) sits
    replaced by ``rotated_in``, and the per-token factor the module put on them divided out.
    ``None`` if ``rotated_out`` is not found in ``full``."""
    r, D = rotated_out.shape[-1], full.shape[-1]
    if rotated_out.shape[:-1] != full.shape[:-1] and rotated_out.shape[1] != 1 or r > D:
        return None  # another tensor's rotation (an indexer's)
    for lo in dict.fromkeys((0, D - r)):
        region = full[..., lo : lo + r]
        out = rotated_out.expand_as(region)
        den = (out * out).sum((1, 3), keepdim=True)  # 0 on a token embedded as zeros (padding)
        dot = (region * out).sum((1, 3), keepdim=True)
        f = torch.where(den > 0, dot / den.clamp_min(1e-300), 1.0)  # (b, 1, s, 1)
        if torch.allclose(region, f * out, rtol=1e-9, atol=1e-12 * float(out.abs().max())):
            pre = full / f
            pre[..., lo : lo + r] = rotated_in.expand_as(region)
            return pre, lo, f
    return None


def pre_position(call):
    """The pre-position q and k of one captured layer, or a string saying why not."""
    q, k = call["q"], call["k"]
    applies = call["applies"]
    if not applies:
        mod = call["module"]
        if getattr(mod, "attn_temperature_tuning", False) and not getattr(mod, "use_rope", 1):
            return _heads_first(call["q_proj"].view(*q.shape[:1], S, q.shape[1], -1)), k
        return q, k
    found = []  # (q in, k in, q out, k out) of each two-tensor call, or of a one-tensor pair
    for tensors, out in applies:
        if not torch.is_tensor(out) and len(out) == 2 and len(tensors) >= 2:
            found.append((*tensors[:2], *out))
    singles = [(tensors[0], out) for tensors, out in applies if torch.is_tensor(out)]
    if len(singles) == 2:  # one tensor per call (Gemma 3n): the queries', then the keys'
        found.append((singles[0][0], singles[1][0], singles[0][1], singles[1][1]))
    if not found:
        return f"{len(applies)} apply calls in one layer, none on q and k"
    for qi, ki, qo, ko in reversed(found):  # DeepSeek-V3.2's indexer rotates its own q, k first
        qi, ki, qo, ko = (_heads_first(t) for t in (qi, ki, qo, ko))
        placed_q, placed_k = _place(q, qo, qi), _place(k, ko, ki)
        if placed_q is not None and placed_k is not None:
            return placed_q[0], placed_k[0]
            return "the rotated q or k is changed before the attention (not by a factor)"
