"""Step masks kept between calls, per encoding: the mask over ``range`` positions is built once.

Over positions given as ``range`` objects (``attend``'s default, a model called without a
cache) a step's float mask depends only on the encoding's tensors, the two ranges,
causality, the number of heads, the dtype and the device: one query decoded at a time over
the same keys, or a loop at one length, would rebuild the same tensor on every call. It is
kept here instead, weakly per encoding (it goes with the module), for the encodings that
declare their bias a function of their tables and settings (``reuses_masks``) and have no
parameters (ALiBi: a learned bias's weights can be written through ``.data``, which no
version counter shows), under a key that changes whenever a table or a setting does (a
load, ``.to()``, a write in place, a swapped table, any attribute set, inference mode).
Small masks only; never one that requires grad (it belongs to one call's graph), never a
fake or ``torch.func`` tensor, never while compiling, and never one handed to a caller
who could write into it. Whole ``attend`` calls with default positions are kept the same
way (:func:`call_key`), the mask with what the checks and the plan decided.
"""

from __future__ import annotations

import threading
import weakref

import torch

__all__ = ["state", "key", "get", "put", "call_key", "recall", "remember", "last_call",
           "snapshot", "keep_last"]  # fmt: skip

MAX_ELEMENTS = 1 << 20  # 4 MiB of float32: larger masks cost little next to their attention
MAX_ENTRIES = 8  # per encoding, the oldest evicted first
_MASKS = weakref.WeakKeyDictionary()  # encoding -> {key -> (mask, is_causal)}, oldest first
_LOCK = threading.Lock()


def state(encoding, scores=True):
    """The encoding's tensors and settings as a hashable token, or ``None`` where nothing
    computed from them may be kept: a bias not declared ``reuses_masks``, or one with
    parameters (learned: a write through ``.data``, as old-style initialisation and EMA
    copies do, changes no version counter), a table that requires grad in grad mode,
    ``torch.func`` wrappers, inference tensors.
    ``scores=False``: the settings only (what the checks and the plan of an encoding
    without a bias read). The settings are counted by ``PositionalEncoding.__setattr__``,
    per module of the tree (a wrapper's inner encoding too) with the module's identity."""
    if scores and not encoding.reuses_masks:
        return None  # its bias may depend on more than its tensors and settings
    d = encoding.__dict__
    if d["_modules"]:  # FIRE's MLP, a wrapper's inner encoding: every module below it
        modules = tuple(encoding.modules())
        settings = tuple(
            (id(m), m.__dict__.get("_settings_version", 0), m.__dict__.get("_work"))
            for m in modules
        )
        if scores and any(m.__dict__["_parameters"] for m in modules):
            return None
        tensors = encoding.buffers() if scores else ()
    else:  # a leaf module: its own dicts (buffers() walks the tree, several us a call)
        settings = (d.get("_settings_version", 0), d.get("_work"))
        if scores and d["_parameters"]:
            return None
        tensors = d["_buffers"].values() if scores else ()
    versions = _versions(tensors, torch.is_grad_enabled())
    if versions is None:
        return None
    kept = tuple((id(t), address, version, t.device, t.dtype)
                 for t, address, version in versions if t is not None)  # fmt: skip
    return kept, settings, torch.is_inference_mode_enabled()


def _versions(tensors, grad):
    """``[(table, address, version), ...]`` of derived tables (ALiBi's slopes: replaced,
    moved or written in place; ``(None, 0, 0)`` for a registered None), or ``None`` where
    none may be keyed: a table that requires grad while ``grad`` (the bias would belong to
    the call's graph), a ``torch.func``-wrapped one, an inference tensor (no version)."""
    out = []
    for t in tensors:
        if t is None:
            out.append((None, 0, 0))
            continue
        if (t.requires_grad and grad) or torch._C._functorch.is_functorch_wrapped_tensor(t):
            return None
        try:
            out.append((t, t.data_ptr(), t._version))
        except RuntimeError:  # an inference tensor (torch.inference_mode) has no version
            return None
    return out


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
    if k is not None and keepable(mask):
        _store(_MASKS, encoding, k, (mask, is_causal))


def _store(store, encoding, k, value):
    """``store[encoding][k] = value``, at most ``MAX_ENTRIES`` per encoding, oldest out first."""
    with _LOCK:  # threads share the store: evict and insert as one step
        kept = store.setdefault(encoding, {})
        kept[k] = value
        while len(kept) > MAX_ENTRIES:
            kept.pop(next(iter(kept)))


# Whole calls of ``attend`` with default positions: what the checks and the plan of a call
# decided depends only on the shapes, dtypes and device of q, k, v, the arguments, inference
# mode and the encoding's state, so a repeated call (one query decoded at a time, a loop at
# one length) skips them and goes straight to the kernel with what the first call planned.
_CALLS = weakref.WeakKeyDictionary()  # encoding -> {call key -> what attend planned}


def keepable(mask) -> bool:
    """May ``mask`` serve later calls: none, or a small plain tensor in no graph (not fake,
    not ``torch.func``-wrapped; one built in inference mode serves only inference mode, as
    :func:`state` keys it)."""
    return mask is None or (
        type(mask) is torch.Tensor
        and not mask.requires_grad
        and mask.numel() <= MAX_ELEMENTS
        and not torch._C._functorch.is_functorch_wrapped_tensor(mask)
    )


def _faking() -> bool:
    """Inside a ``FakeTensorMode`` (shape propagation, memory estimates): a real mask kept
    before would meet fake tensors, and a fake one must not be kept."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def call_key(encoding, q, k, v, causal, backend):
    """The key of one ``attend`` call with default positions, or ``None`` (not kept, and
    nothing kept served: inside a fake mode)."""
    if _faking() or type(causal) is not bool or type(backend) is not str:
        return None  # a causal flag that is a tensor or an array: planned (and checked) anew
    token = state(encoding, "scores" in encoding.places)
    if token is None:  # planned on every call (see state)
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
    if k is not None:
        _store(_CALLS, encoding, k, planned)


# The last call of each leaf encoding, in its own ``__dict__`` (``"_last_call"``, dropped when
# it is pickled or copied): a loop that repeats one call (a benchmark, a fixed-length decode
# over a static cache's keys) is answered from it with a handful of identity and integer
# comparisons, before the key of :func:`call_key` is built and hashed. It holds the tables
# themselves (compared by identity: a tensor freed and another allocated at its address is
# told apart) with their addresses and version counters, the settings count and what the
# call planned; whatever does not compare equal goes the way of :func:`call_key`.


def _tables(encoding):
    """``((table, address, version), ...)`` of a leaf encoding whose mask may be kept, or
    ``None``: the same refusals as :func:`state` (a bias not declared ``reuses_masks``,
    parameters, a table that requires grad or is ``torch.func``-wrapped or an inference
    tensor). Encodings without a bias: ``()`` (their plan reads no tensor)."""
    d = encoding.__dict__
    if d["_modules"]:
        return None  # a tree: the settings of every module count (state walks it)
    if "scores" not in encoding.places:
        return ()
    if not encoding.reuses_masks or d["_parameters"]:
        return None
    versions = _versions(d["_buffers"].values(), grad=True)  # kept for grad mode too
    return None if versions is None else tuple(versions)


def snapshot(encoding):
    """The state a call is planned from, taken *before* it is planned (a write while it runs,
    from another thread, then shows as a change): ``(tables, settings count, work dtype,
    inference mode)``, or ``None`` where the call may not be kept (see :func:`_tables`)."""
    tables = _tables(encoding)
    if tables is None:
        return None
    d = encoding.__dict__
    return tables, d.get("_settings_version", 0), d.get("_work"), torch.is_inference_mode_enabled()


def keep_last(encoding, q, k, v, causal, backend, planned, snap):
    """Keep ``planned``, planned from the state ``snap`` (:func:`snapshot`), as the last call
    of ``encoding``."""
    if snap is not None:
        encoding.__dict__["_last_call"] = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                                           q.device, causal, backend, *snap, planned)  # fmt: skip


_Tensor, _inference = torch.Tensor, torch.is_inference_mode_enabled  # looked up once, not per call


def last_call(encoding, q, k, v, causal, backend):
    """What ``attend`` planned for the last call of ``encoding`` if this one is the same call
    (plain tensors of the same shapes, dtypes and device, the same arguments, inference
    mode and tables and settings unchanged), else ``None``."""
    d = encoding.__dict__
    slot = d.get("_last_call")
    if slot is None:
        return None
    qs, ks, vs, qt, kt, vt, dev, causal_, backend_, tables, settings, work, infer, planned = slot
    if not (  # a fake or other subclass q (k, v: SDPA refuses to mix them with a plain q)
        type(q) is _Tensor
        and q.shape == qs and k.shape == ks and v.shape == vs
        and q.dtype is qt and k.dtype is kt and v.dtype is vt
        and causal is causal_ and backend == backend_ and q.device == dev
        and d.get("_settings_version", 0) == settings and d.get("_work") is work
        and _inference() is infer
    ):  # fmt: skip
        return None
    if tables:
        buffers = d["_buffers"]
        if len(buffers) != len(tables):
            return None
        for t, (kept, address, version) in zip(buffers.values(), tables):  # noqa: B905 (len)
            if t is not kept or (t is not None and (t.requires_grad or t._version != version
                                                    or t.data_ptr() != address)):  # fmt: skip
                return None
    return planned
