"""Step masks kept between calls, per encoding: the mask over ``range`` positions is built once.

Over positions given as ``range`` objects (``attend``'s default, a model called without a
cache) a step's float mask depends only on the encoding's tensors, the two ranges,
causality, the number of heads, the dtype and the device: one query decoded at a time over
the same keys, or a loop at one length, would rebuild the same tensor on every call. It is
kept here instead, weakly per encoding (it goes with the module), for the encodings that
declare their bias a function of their tensors and settings (``reuses_masks``: ALiBi, T5,
KERPLE, FIRE), under a key that changes whenever one of those does (a training step, a
load, ``.to()``, a swapped ``.data``, a flag set by hand). Small masks only; never one
that requires grad (it belongs to one call's graph), never while compiling, and never one
handed to a caller who could write into it.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict

import torch

__all__ = ["state", "key", "get", "put", "call_key", "recall", "remember"]

MAX_ELEMENTS = 1 << 20  # 4 MiB of float32: larger masks cost little next to their attention
MAX_ENTRIES = 8  # per encoding, the oldest evicted first
_MASKS = weakref.WeakKeyDictionary()  # encoding -> OrderedDict(key -> (mask, is_causal))
_LOCK = threading.Lock()


def state(encoding, scores=True):
    """The encoding's tensors and settings as a hashable token, or ``None`` where nothing
    computed from them may be kept (a bias whose tensors require grad here, ``torch.func``
    wrappers, inference tensors, a bias not declared ``reuses_masks``). ``scores=False``:
    the settings only (what the checks and the plan of an encoding without a bias read)."""
    if scores and not encoding.reuses_masks:
        return None  # its bias may depend on more than its tensors and settings
    if encoding._modules:  # FIRE's MLP, a wrapper's inner encoding: every module below it
        modules = tuple(encoding.modules())
        settings = tuple(m.__dict__.get("_settings_version", 0) for m in modules)
        settings += tuple(m.__dict__.get("_work") for m in modules)
        tensors = itertools.chain(encoding.parameters(), encoding.buffers()) if scores else ()
    else:  # a leaf module: its own dicts (parameters() walks the tree, several us a call)
        d = encoding.__dict__
        settings = (d.get("_settings_version", 0), d.get("_work"))
        tensors = itertools.chain(d["_parameters"].values(), d["_buffers"].values())
        tensors = tensors if scores else ()
    grad = torch.is_grad_enabled()
    kept = []
    for t in tensors:
        if t is None:  # a registered None (no bias, say)
            continue
        if t.requires_grad and grad:
            return None  # the bias would belong to this call's graph
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            return None
        try:
            version = t._version
        except RuntimeError:  # an inference tensor (torch.inference_mode) has no version
            return None
        kept.append((id(t), t.data_ptr(), version, t.device, t.dtype))
    return tuple(kept), settings


def key(encoding, q_positions, k_positions, causal, heads, dtype, device, limits):
    """The cache key of a step's mask, or ``None`` where it is not to be kept (tensor
    positions, whose values the host does not see; a large mask; tracing; ``torch.func``)."""
    if not (isinstance(q_positions, range) and isinstance(k_positions, range)):
        return None
    size = (heads or 1) * len(q_positions) * len(k_positions)
    if size > MAX_ELEMENTS or torch.compiler.is_compiling():
        return None  # a large mask goes to the thread's workspace instead
    token = state(encoding)
    if token is None:
        return None
    q, k = q_positions, k_positions
    span = (q.start, q.stop, q.step, k.start, k.stop, k.step)
    return (token, span, causal, heads, dtype, str(device), limits)


def get(encoding, k):
    """The kept ``(mask, is_causal)`` under key ``k``, or ``None``."""
    if k is None:
        return None
    with _LOCK:
        kept = _MASKS.get(encoding)
        return None if kept is None else kept.get(k)


def put(encoding, k, mask, is_causal):
    """Keep ``(mask, is_causal)`` under ``k`` (unless ``k`` is ``None`` or the mask is large
    or part of a graph)."""
    if k is None or (mask is not None and (mask.requires_grad or mask.numel() > MAX_ELEMENTS)):
        return
    with _LOCK:
        kept = _MASKS.setdefault(encoding, OrderedDict())
        kept[k] = (mask, is_causal)
        while len(kept) > MAX_ENTRIES:
            kept.popitem(last=False)


# Whole calls of ``attend`` with default positions: what the checks and the plan of a call
# decided depends only on the shapes, dtypes and device of q, k, v, the arguments, the grad
# mode and the encoding's state, so a repeated call (one query decoded at a time, a loop at
# one length) skips them and goes straight to the kernel with what the first call planned.
_CALLS = weakref.WeakKeyDictionary()  # encoding -> {call key -> what attend planned}


def call_key(encoding, q, k, v, causal, backend):
    """The key of one ``attend`` call with default positions, or ``None`` (not kept)."""
    token = state(encoding, "scores" in encoding.places)
    if token is None:  # (a bias whose tensors require grad, in grad mode: planned every call)
        return None
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, causal, backend,
            token)  # fmt: skip


def recall(encoding, k):
    """What ``attend`` planned for the call under key ``k``, or ``None``."""
    if k is None:
        return None
    calls = _CALLS.get(encoding)
    return None if calls is None else calls.get(k)


def remember(encoding, k, planned):
    """Keep ``planned`` under ``k`` (unless ``k`` is ``None``), the oldest evicted first."""
    if k is None:
        return
    with _LOCK:
        calls = _CALLS.setdefault(encoding, {})
        calls[k] = planned
        while len(calls) > MAX_ENTRIES:
            calls.pop(next(iter(calls)))
