"""Kernels of the rotation family, and the one place that picks one per call.

The bottom layer of :mod:`posenc.torch`: imports torch (and triton, when chosen), nothing
of posenc above it.

Encodings (RoPE, YaRN's scale, xPos) call :func:`rotate` or :func:`rotate_qk`; which
implementation runs is read from :data:`TABLE` by device, mode and dtype, every call
(modules move between devices):

* ``"expr"`` -- plain tensor expressions (:func:`~.rope_eager.rotate_expr`): differentiable
  and traceable; the only choice under ``torch.func`` transforms (vmap, grad, jacfwd);
* ``"eager"`` -- the CPU kernels of :mod:`.rope_eager`, writing into ``out`` or in place;
  plain inference only;
* ``"triton"`` -- one fused Triton kernel for q and k (:mod:`.rope_triton`), float32 and
  16-bit only, under autograd through :mod:`.rope_triton_ops`; on CUDA in eager code. Under
  ``torch.compile`` the CUDA row takes ``"expr"``, which inductor fuses into the
  projections around it (a custom op is opaque to it: a compiled RoPE model measured 2.0x
  one without positions on an H200).

Modes: ``"plain"`` (not recorded, not traced), ``"autograd"`` (``x`` or its table requires
grad while grad is enabled), ``"compile"`` (``torch.compile`` tracing), ``"functorch"``
(``torch.func`` or forward-mode AD). Devices other than CUDA take the CPU row. :func:`use`
forces an implementation (tests, benchmarks); ``ValueError`` where it does not fit the call.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading

import torch
import torch.autograd.forward_ad as _forward_ad

from posenc.torch.kernels.rope_eager import (
    check_out,
    cos_sin,
    rotate_eager,
    rotate_expr,
    rotate_pair,
)
from posenc.torch.kernels.rows import TableRows

__all__ = ["TABLE", "TableRows", "choose", "lookup", "cos_sin", "needs_expr", "rotate", "rotate_qk"]
__all__ += ["use"]

IMPLS = ("expr", "eager", "triton")

#: (device, mode) -> implementation for (float64, float32, float16 and bfloat16)
TABLE = {
    ("cpu", "plain"): ("eager", "eager", "eager"),
    ("cpu", "autograd"): ("expr", "expr", "expr"),
    ("cpu", "compile"): ("expr", "expr", "expr"),
    ("cuda", "plain"): ("eager", "triton", "triton"),
    ("cuda", "autograd"): ("expr", "triton", "triton"),
    ("cuda", "compile"): ("expr", "expr", "expr"),  # inductor fuses it; a custom op is opaque
}
_FALLBACK = {"plain": "eager", "autograd": "expr", "compile": "expr"}  # triton missing
_FORCED = threading.local()  # use()'s choice, per thread: another thread's block is not ours
_HAS_TRITON = importlib.util.find_spec("triton") is not None  # looked up, not imported
_transforms_active = torch._C._are_functorch_transforms_active


def _triton_ok() -> bool:
    return _HAS_TRITON


def _triton_fits(x) -> bool:
    """CUDA, or CPU tensors under the Triton interpreter (``TRITON_INTERPRET=1``)."""
    interpreted = x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return (x.device.type == "cuda" or interpreted) and _triton_ok()


def _table_of(cs):
    return cs.table if isinstance(cs, TableRows) else cs


def _per_head(cs) -> bool:
    """Do the rows of ``cs`` differ between heads (the Triton kernel shares them)?"""
    return not isinstance(cs, TableRows) and cs.dim() >= 4 and cs.shape[-4] != 1


def _for(cs, x, impl, m):
    """``cs`` as implementation ``impl`` takes it: the Triton kernel in plain inference
    indexes a table by tensor positions itself; every other path gets the rows gathered."""
    if not isinstance(cs, TableRows):
        return cs
    tensor_positions = not isinstance(cs.positions, range)
    if impl == "triton" and m == "plain" and tensor_positions and cs.table.device == x.device:
        return cs.table, cs.positions.to(x.device)
    return cs.gather(x.device)[:, None]  # (b|1, 1, seq, r // 2, 2): shared by the heads


def mode(x, cs=None) -> str:
    """``"functorch"``, ``"compile"``, ``"autograd"`` or ``"plain"`` for a call on ``x``
    (rotated by the table ``cs``: a table batched by ``vmap`` over positions counts too)."""
    cs = _table_of(cs)
    if torch.compiler.is_compiling():  # first: dynamo cannot trace the functorch query
        return "compile"
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    if wrapped(x) or (cs is not None and wrapped(cs)) or _forward_ad._current_level >= 0:
        return "functorch"  # or forward-mode AD: dual tensors need plain expressions
    if torch.is_grad_enabled() and (x.requires_grad or (cs is not None and cs.requires_grad)):
        return "autograd"
    return "plain"


def needs_expr(x) -> bool:
    """Is the call on ``x`` recorded or traced (not plain eager inference)?"""
    return mode(x) != "plain"


def lookup(device_type, mode, dtype) -> str:
    """:data:`TABLE`'s entry: what runs on ``device_type`` in ``mode`` for ``dtype``."""
    if mode == "functorch":
        return "expr"  # the custom ops have no batching rules
    row = TABLE[("cuda" if device_type == "cuda" else "cpu", mode)]
    return row[0 if dtype == torch.float64 else 1 if dtype == torch.float32 else 2]


def choose(x, impl=None) -> str:
    """The implementation for a rotation of ``x`` now: ``impl`` if it fits, else the table's.

    Raises ``ValueError`` naming ``impl`` when a requested implementation cannot serve the
    call (``"eager"`` outside plain inference, ``"triton"`` off CUDA, for float64, under
    ``torch.func``, or without triton).
    """
    return _choose(x, impl, mode(x))


def _choose(x, impl, m, cs=None):
    forced = getattr(_FORCED, "impl", None) if impl is None else impl
    chosen = _choose_impl(x, forced, m)
    if chosen == "triton" and cs is not None:
        why = ("needs [cos, sin] rows shared by the heads" if _per_head(cs) else
               "gives a [cos, sin] table that requires grad no gradient"
               if m != "plain" and _table_of(cs).requires_grad else None)  # fmt: skip
        if why and forced is not None:
            raise ValueError(f"impl='triton' {why}")
        chosen = _FALLBACK[m] if why else chosen
    return chosen


def _plain_autograd() -> bool:  # else the custom ops, which transforms and make_fx record
    return not _transforms_active() and not torch._C._len_torch_dispatch_stack()


def _choose_impl(x, impl, m):
    """The implementation for mode ``m``: ``impl`` if it fits (else ``ValueError``), or the
    table's."""
    if impl is not None:
        why = None
        if impl not in IMPLS:
            why = f"must be one of {IMPLS}"
        elif impl == "eager" and m != "plain":
            why = f"needs plain eager inference, this call is {m!r}"
        elif impl == "triton" and not _triton_fits(x):
            why = f"needs triton and a CUDA tensor, got {x.device.type}"
        elif impl == "triton" and (x.dtype == torch.float64 or m == "functorch" or x.dim() > 4):
            why = f"takes float32/16-bit, <= 4-D, no torch.func, got {x.dtype}, {x.dim()}-D, {m}"
        if why:
            raise ValueError(f"impl={impl!r} {why}")
        return impl
    impl = lookup(x.device.type, m, x.dtype)
    if impl == "triton" and (x.dim() > 4 or not _triton_ok()):
        impl = _FALLBACK[m]
    return impl


@contextlib.contextmanager
def use(impl):
    """Force ``impl`` (``"expr"``, ``"eager"``, ``"triton"`` or None) inside the block, in this
    thread (other threads keep their own choice).

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import kernels
    >>> x = torch.ones(1, 1, 2, 4)  # (batch, heads, seq, head_dim) on the CPU
    >>> with kernels.use("expr"):
    ...     kernels.choose(x)
    'expr'
    >>> kernels.choose(x)
    'eager'
    """
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, got {impl!r}")
    before = getattr(_FORCED, "impl", None)
    _FORCED.impl = impl
    try:
        yield
    finally:
        _FORCED.impl = before


def _triton():
    from posenc.torch.kernels import rope_triton  # imports triton: only when chosen

    return rope_triton


def _triton_ops():
    from posenc.torch.kernels import rope_triton_ops  # the custom ops: autograd, compile

    return rope_triton_ops


def _dst(x, out, inplace):
    return x if inplace else torch.empty_like(x) if out is None else check_out(x, out)


def rotate(x, cs, pairing, *, out=None, inplace=False, impl=None):
    """Rotate the first ``r = 2 * cs.shape[-2]`` dims of ``x`` (..., seq, head_dim) by ``cs``.

    ``cs``: the gathered ``[cos, sin]`` table ``(..., seq, r // 2, 2)``, broadcastable to
    ``x``. Returns a new tensor, or ``out`` (same shape and dtype as ``x``, not overlapping
    it), or ``x`` itself when ``inplace`` (plain eager inference only; otherwise a new
    tensor). ``impl`` forces an implementation (see :func:`choose`).
    """
    m = mode(x, cs)
    return _rotate(x, cs, pairing, out, inplace, _choose(x, impl, m, cs), m)


def _rotate(x, cs, pairing, out, inplace, impl, m):
    """:func:`rotate` with the implementation ``impl`` chosen for mode ``m``."""
    if m != "plain":
        if out is not None:
            raise ValueError(
                "out= needs plain eager inference: x requires grad or is being traced "
                "(use torch.no_grad() and no transform, or drop out=)"
            )
        inplace = False
    cs = _for(cs, x, impl, m)
    if impl == "eager":
        return rotate_eager(x, cs, pairing, _dst(x, out, inplace))
    if impl == "triton":
        if m == "autograd" and _plain_autograd():  # a plain Function: a custom op costs more
            return _triton_ops().rotate((x,), (cs,), pairing == "interleaved")[0]
        if m != "plain":
            return _triton_ops().rope(x, cs, pairing == "interleaved", False)
        dst = _dst(x, out, inplace)
        return _triton().launch([(x, cs, dst)], pairing == "interleaved")[0]
    res = rotate_expr(x, cs, pairing)
    return res if out is None and not inplace else _dst(x, out, inplace).copy_(res)


def rotate_qk(q, k, cs_q, cs_k, pairing, *, out=None, inplace=False, impl=None):
    """:func:`rotate` for queries and keys: one kernel launch for both where possible.

    ``out``: ``(q_out, k_out)`` or None. Returns the rotated ``(q, k)``.
    """
    q_out, k_out = (None, None) if out is None else out
    mq, mk = mode(q, cs_q), mode(k, cs_k)
    impl_q = _choose(q, impl, mq, cs_q)
    alike = (
        cs_q is cs_k
        and mq == mk
        and q.dtype == k.dtype
        and q.device == k.device
        and q.dim() == k.dim()
    )  # what _choose reads: one choice serves both
    impl_k = impl_q if alike else _choose(k, impl, mk, cs_k)
    fused = (
        impl_q == impl_k == "triton"
        and mq == mk
        and q.dtype == k.dtype
        and q.device == k.device
        and q.shape[0] == k.shape[0]
        and q.shape[-1] == k.shape[-1]
        and _table_of(cs_q).shape[-2] == _table_of(cs_k).shape[-2]
    )
    if not fused:
        if cs_q is cs_k and impl_q == impl_k != "triton" and q.device == k.device:
            cs_q = cs_k = _for(cs_q, q, impl_q, mq)  # one table for both: gathered once
            if impl_q == "eager":  # plain inference (eager serves no other mode)
                dq, dk = _dst(q, q_out, inplace), _dst(k, k_out, inplace)
                return rotate_pair(q, k, cs_q, pairing, dq, dk)
        return (
            _rotate(q, cs_q, pairing, q_out, inplace, impl_q, mq),
            _rotate(k, cs_k, pairing, k_out, inplace, impl_k, mk),
        )
    interleaved = pairing == "interleaved"
    same = cs_k is cs_q  # one table for both (fused: same device and mode): gathered once
    cs_q = _for(cs_q, q, impl_q, mq)
    cs_k = cs_q if same else _for(cs_k, k, impl_k, mk)
    if mq != "plain":
        if out is not None:
            _rotate(q, cs_q, pairing, q_out, inplace, impl_q, mq)  # raises the out= error
        if mq == "autograd" and _plain_autograd():
            return _triton_ops().rotate((q, k), (cs_q, cs_k), interleaved)
        return _triton_ops().rope_qk(q, k, cs_q, cs_k, interleaved, False)
    pairs = [(q, cs_q, _dst(q, q_out, inplace)), (k, cs_k, _dst(k, k_out, inplace))]
    return _triton().launch(pairs, interleaved)
