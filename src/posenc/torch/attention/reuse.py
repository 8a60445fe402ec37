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

__all__ = ["key", "get", "put"]

MAX_ELEMENTS = 1 << 20  # 4 MiB of float32: larger masks cost little next to their attention
MAX_ENTRIES = 8  # per encoding, the oldest evicted first
_MASKS = weakref.WeakKeyDictionary()  # encoding -> OrderedDict(key -> (mask, is_causal))
_LOCK = threading.Lock()
_PLAIN = (bool, int, float, str)  # settings kept in the key (ALiBi's ``symmetric``, ...)


def key(encoding, q_positions, k_positions, causal, heads, dtype, device, limits):
    """The cache key of a step's mask, or ``None`` where it is not to be kept (tensor
    positions, whose values the host does not see; a large mask; tracing; ``torch.func``)."""
    if not encoding.reuses_masks:
        return None  # its bias may depend on more than its tensors and settings
    if not (isinstance(q_positions, range) and isinstance(k_positions, range)):
        return None
    size = (heads or 1) * len(q_positions) * len(k_positions)
    if size > MAX_ELEMENTS or torch.compiler.is_compiling():
        return None  # a large mask goes to the thread's workspace instead
    if encoding._modules:  # FIRE's MLP: every tensor below it too
        tensors = itertools.chain(encoding.parameters(), encoding.buffers())
    else:  # a leaf module: its own dicts (parameters() walks the tree, several us a call)
        tensors = itertools.chain(encoding._parameters.values(), encoding._buffers.values())
    state = []
    for t in tensors:
        if t is None:  # a registered None (no bias, say)
            continue
        if t.requires_grad and torch.is_grad_enabled():
            return None  # the bias would belong to this call's graph
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            return None
        try:
            version = t._version
        except RuntimeError:  # an inference tensor (torch.inference_mode) has no version
            return None
        state.append((id(t), t.data_ptr(), version, t.device, t.dtype))
    settings = tuple((n, v) for n, v in vars(encoding).items() if type(v) in _PLAIN)
    q, k = q_positions, k_positions
    span = (q.start, q.stop, q.step, k.start, k.stop, k.step)
    return (tuple(state), settings, span, causal, heads, dtype, str(device), limits)


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
