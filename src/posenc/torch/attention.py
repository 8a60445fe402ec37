"""The functional attention core shared by every encoding: masks, backends and ``attend``.

Attention calls the query/key hook and the score hook of its
:class:`~posenc.torch.PositionalEncoding` and knows nothing else about position;
encodings that act on the input are applied by the model before the first block.
Two backends: ``"sdpa"`` (:func:`torch.nn.functional.scaled_dot_product_attention` with
one float mask) and ``"flex"`` (FlexAttention with the encoding's ``score_mod`` and a
block mask, compiled once); ``"auto"`` picks FlexAttention for score biases on CUDA.
Shape legend: ``q`` is ``(batch, heads, seq_q, head_dim)``; ``k, v`` are
``(batch, kv_heads, seq_k, head_dim)``, ``kv_heads`` dividing ``heads``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from posenc.torch._flex import flex_attention_compiled, flex_plan
from posenc.torch.base import NoPE, check_encoding, check_float, check_heads
from posenc.torch.cache import KVCache
from posenc.torch.positions import len_of, position_arg

__all__ = ["attend", "attention_mask"]

BACKENDS = ("auto", "sdpa", "flex")


def attention_mask(
    encoding, q_positions, k_positions, *, causal, key_valid=None, heads=None, dtype, device=None
):  # fmt: skip
    """The float mask SDPA adds to the scores: causal, padding and the encoding's bias.

    The queries are the *last* ``seq_q`` of the ``seq_k`` key slots (as when decoding with
    a KV cache), so the causal mask is aligned to the end; a padding query may see itself,
    so no row is empty. Built once per model step and shared by its layers.

    Parameters
    ----------
    encoding : PositionalEncoding
        Supplies ``score_bias``.
    q_positions : torch.Tensor or range
        ``(b|1, seq_q)`` positions of the queries.
    k_positions : torch.Tensor or range
        ``(b|1, seq_k)`` positions of the keys.
    causal : bool
        Key slot ``j`` is visible to query ``i`` only if ``j <= seq_k - seq_q + i``.
    key_valid : torch.Tensor, optional
        Bool ``(batch, seq_k)``, ``False`` for padding keys.
    heads : int, optional
        Number of query heads, to check the bias against.
    dtype : torch.dtype
        Dtype of the scores. The bias is computed in float32 (float64 for float64) and
        rounded once to ``dtype``; SDPA adds it to float32 accumulators.
    device : torch.device, optional
        Where the mask is built.

    Returns
    -------
    mask : torch.Tensor or None
        ``(b|1, h|1, seq_q, seq_k)``, or ``None`` when SDPA needs none.
    is_causal : bool
        Whether SDPA's own causal path applies (only when ``mask`` is ``None``).
    """
    return _mask(encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device)


def _mask(encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device, step=None,
          q_start=None):  # fmt: skip
    """:func:`attention_mask`; with a ``step``, score biases may go into a per-thread
    workspace that the step holds until :func:`release` (nobody else writes it meanwhile).
    ``q_start`` (an int or a 0-d tensor): the key slot of the first query, when the keys
    are a whole static cache buffer rather than ending at the last query."""
    seq_q, seq_k = len_of(q_positions), len_of(k_positions)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    out = None  # inference: a reused buffer saves the page faults of a fresh (b, h, sq, sk)
    reusable = step is not None and heads is not None and "scores" in encoding.places
    if reusable and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
        rows = 1 if isinstance(q_positions, range) else q_positions.shape[0]
        out = _workspace((rows, heads, seq_q, seq_k), dtype, device, step)
    if out is not None and _takes_out(type(encoding)):
        bias = encoding.score_bias(q_positions, k_positions, out=out)  # (b|1, h|1, sq, sk)
    else:  # encodings written without ``out=`` work too
        bias, out = encoding.score_bias(q_positions, k_positions), None
    if bias is not None and heads is not None and bias.shape[1] not in (1, heads):
        raise ValueError(
            f"{type(encoding).__name__}.score_bias gives {bias.shape[1]} heads, "
            f"attention has {heads}"
        )
    if bias is None and key_valid is None and q_start is None:
        if not causal or seq_q == 1:
            return None, False
        if seq_q == seq_k:
            return None, True  # SDPA's is_causal aligns to the start: right when sq == sk
    allowed = _allowed(seq_q, seq_k, causal, key_valid, device, q_start)  # (b|1, 1, sq, sk)
    if allowed is None:
        return bias.to(dtype), False
    hidden = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
        ~allowed, float("-inf")
    )  # 0 where visible, -inf where hidden (exact in any dtype): (b|1, 1, sq, sk), small
    if bias is None:
        return hidden, False
    if bias is out and bias.shape == torch.broadcast_shapes(bias.shape, hidden.shape):
        return bias.add_(hidden), False  # our buffer, already in dtype: in place, no faults
    return (bias.to(work) + hidden.to(work)).to(dtype), False


@functools.cache
def _takes_out(cls) -> bool:
    return "out" in inspect.signature(cls.score_bias).parameters


_LOCAL = threading.local()  # one workspace per thread


def _workspace(shape, dtype, device, step):
    """A buffer of ``shape`` kept between steps (per thread), or ``None`` if it is taken.

    ``step`` holds it until :func:`release`: another attention call in between (a forward
    hook, a second model, a re-entrant call) gets ``None`` and a fresh mask, so it cannot
    overwrite the mask the step's remaining layers read. It stays allocated (the size of
    the last score-bias mask) until the shape changes.
    """
    if getattr(_LOCAL, "holder", None) is not None:
        return None
    buf = getattr(_LOCAL, "mask", None)
    device = torch.device("cpu") if device is None else torch.device(device)
    if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
        _LOCAL.mask = buf = torch.empty(shape, dtype=dtype, device=device)
    _LOCAL.holder = step
    step.holds_workspace = True
    return buf


def release(step) -> None:
    """The step is over: the workspace it held (if any) may be reused."""
    if step is not None and step.holds_workspace and getattr(_LOCAL, "holder", None) is step:
        _LOCAL.holder = None
        step.holds_workspace = False


def _allowed(seq_q, seq_k, causal, key_valid, device, q_start=None):
    """Bool ``(b|1, 1, seq_q, seq_k)``: which key slot each query slot may see, or None (all)."""
    if not causal and key_valid is None:
        return None
    first = seq_k - seq_q if q_start is None else q_start  # slot of the first query
    i = torch.arange(seq_q, device=device)[:, None] + first  # query slots (sq, 1)
    j = torch.arange(seq_k, device=device)[None]  # key slots (1, sk)
    allowed = (j <= i) if causal else torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    allowed = allowed[None, None]  # (1, 1, sq, sk)
    if key_valid is not None:
        allowed = (allowed & key_valid[:, None, None, :].to(device)) | (j == i)  # (b, 1, sq, sk)
    return allowed


def _run(q, k, v, step, scale):
    """Attention of encoded ``q, k`` over values ``v`` with a planned mask, either backend."""
    gqa = q.shape[1] != k.shape[1]
    if step.backend == "sdpa":
        width = v.shape[-1]
        if q.shape[-1] > width:  # the fused kernels need one head width: zero-pad v, 2-5x faster
            v = F.pad(v, (0, q.shape[-1] - width))  # (b, kv_heads, seq_k, qk_dim)
        with _kernels_for(step.mask):
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=step.mask, is_causal=step.is_causal, scale=scale,
                enable_gqa=gqa,
            )  # (b, heads, seq_q, qk_dim|v_dim)  # fmt: skip
        return out[..., :width]  # (b, heads, seq_q, v_dim)
    needs_grad = q.requires_grad or k.requires_grad or v.requires_grad
    if q.device.type == "cpu" and needs_grad:
        if torch.is_grad_enabled():
            raise ValueError(
                "backend='flex' has no backward on the CPU (torch 2.13): use backend='sdpa' "
                "to train, or run under torch.no_grad()"
            )
        q, k, v = q.detach(), k.detach(), v.detach()  # no graph anyway; flex refuses them
    flex = flex_attention_compiled(q.device.type)
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        q, k, v = q.float(), k.float(), v.float()  # the CPU kernel is ~1.5x faster in float32
    kw = {"score_mod": step.score_mod, "block_mask": step.block_mask, "scale": scale,
          "enable_gqa": gqa}  # fmt: skip
    if torch.compiler.is_compiling():  # inside the user's torch.compile: part of its graph
        return flex(q, k, v, **kw).to(dtype)  # (b, heads, seq_q, v_dim)
    # Each new shape or score_mod compiles once; past dynamo's default limit of 8 it would
    # fall back to the eager kernel (slow, materialised scores), so allow more, here only.
    with torch._dynamo.config.patch(recompile_limit=64):
        out = flex(q, k, v, **kw)  # (b, heads, seq_q, v_dim)
    return out.to(dtype)


def _kernels_for(mask):
    """SDPA's math kernel for a learned bias under ``torch.func`` (``grad``, ``vjp``...): the
    CPU flash kernel has no gradient for ``attn_mask`` and the transforms hide from it that
    the mask needs one. Otherwise no restriction."""
    if mask is None or torch.compiler.is_compiling():
        return contextlib.nullcontext()
    if torch._C._functorch.is_functorch_wrapped_tensor(mask) and mask.device.type == "cpu":
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


@dataclass
class Step:
    """What every attention layer of one model step shares (built once by :func:`plan`)."""

    q_positions: object  # range or (b|1, n) tensor
    k_positions: object  # range or (b|1, n_keys) tensor
    cache: KVCache | None
    start: int  # first cache slot of this step
    backend: str = "sdpa"
    mask: torch.Tensor | None = None  # sdpa
    is_causal: bool = False  # sdpa
    score_mod: object = None  # flex
    block_mask: object = None  # flex
    full_kv: bool = False  # flex with a cache: attend over the whole cache buffer
    holds_workspace: bool = False  # its mask is the per-thread workspace (until release)


def check_backend(backend):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def resolve_backend(backend, encoding, device) -> str:
    """``"auto"``: FlexAttention for score biases on CUDA (the bias computed in the kernel,
    no ``(batch, heads, seq, seq)`` mask), else SDPA (its fused kernels when there is no
    bias; on the CPU the dense mask is faster than compiled FlexAttention and trains)."""
    if backend != "auto":
        return backend
    on_cuda = device is not None and torch.device(device).type == "cuda"
    return "flex" if on_cuda and "scores" in encoding.places else "sdpa"


def check_padding_mask(padding_mask, batch, seq):
    if padding_mask.shape != (batch, seq) or padding_mask.dtype != torch.bool:
        raise ValueError(
            f"padding_mask must be a bool tensor of shape ({batch}, {seq}), "
            f"got {padding_mask.dtype} {tuple(padding_mask.shape)}"
        )
    return padding_mask


def plan(encoding, q_positions, k_positions, *, causal, key_valid, heads, backend, dtype, device,
         cache=None, start=0, full_kv=False) -> Step:  # fmt: skip
    """The mask (or score_mod and block mask) of one step, built once for all its layers."""
    backend = resolve_backend(backend, encoding, device)
    step = Step(q_positions, k_positions, cache, start, backend, full_kv=full_kv)
    if backend == "sdpa":
        try:
            step.mask, step.is_causal = _mask(
                encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device,
                step, q_start=start if full_kv else None,
            )  # fmt: skip
        except Exception:
            release(step)
            raise
    else:
        step.score_mod, step.block_mask = flex_plan(
            encoding, q_positions, k_positions, causal=causal, key_valid=key_valid,
            q_start=start if full_kv else None, device=device,
        )  # fmt: skip
    return step


def plan_step(encoding, batch, n, positions, padding_mask, cache, **kw) -> Step:
    """Positions and cache slots of ``n`` new tokens, then :func:`plan` (for modules)."""
    if padding_mask is not None:
        check_padding_mask(padding_mask, batch, n)
    full_kv = False
    axes = encoding.position_axes
    if cache is None:
        q_pos = k_pos = position_arg(positions, batch, n, axes=axes)
        start, key_valid = 0, padding_mask
    else:
        if positions is not None:
            positions = position_arg(positions, batch, n, axes=axes)
        start, q_pos, k_pos, key_valid = cache._begin(positions, padding_mask, batch, n)
        if getattr(cache, "static", False):  # keys: the whole buffer, unfilled slots hidden
            full_kv = True
            if key_valid is None and not kw["causal"]:  # causal masking alone does not do
                key_valid = cache.valid & (cache.slots < start + n)  # (batch, max_len)
        elif resolve_backend(kw["backend"], encoding, kw["device"]) == "flex":
            # static shapes: every slot, unfilled ones hidden
            full_kv, k_pos, key_valid = True, cache.positions, cache.valid
    return plan(encoding, q_pos, k_pos, key_valid=key_valid, cache=cache, start=start,
                full_kv=full_kv, **kw)  # fmt: skip


def attend(
    q,
    k,
    v,
    encoding=None,
    *,
    q_positions=None,
    k_positions=None,
    causal=True,
    padding_mask=None,
    backend="auto",
):
    """Attention with a positional encoding: the functional core of :class:`MultiHeadAttention`.

    Applies the encoding's query/key hook, then attention with its score bias, the causal
    mask (aligned to the end when ``seq_q < seq_k``) and the padding mask, with the
    encoding's softmax scale.

    Parameters
    ----------
    q : torch.Tensor
        Queries ``(batch, heads, seq_q, head_dim)``.
    k : torch.Tensor
        Keys ``(batch, kv_heads, seq_k, head_dim)``; ``kv_heads`` divides ``heads``.
    v : torch.Tensor
        Values ``(batch, kv_heads, seq_k, v_dim)``.
    encoding : PositionalEncoding, optional
        Default :class:`~posenc.torch.NoPE`.
    q_positions : torch.Tensor or range, optional
        Default: the last ``seq_q`` key positions.
    k_positions : torch.Tensor or range, optional
        ``(seq_k,)`` or ``(batch, seq_k)``; default ``0 .. seq_k - 1``.
    causal : bool
        Causal attention.
    padding_mask : torch.Tensor, optional
        Bool ``(batch, seq_k)``, ``True`` for real keys.
    backend : {"auto", "sdpa", "flex"}
        ``"sdpa"``: one float mask; ``"flex"``: FlexAttention with the encoding's
        ``score_mod`` (compiled on first use; inference only on the CPU); ``"auto"``
        (default): ``"flex"`` for score biases on CUDA, else ``"sdpa"``.

    Returns
    -------
    torch.Tensor
        ``(batch, heads, seq_q, v_dim)``.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import RotaryEmbedding, attend
    >>> q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    >>> attend(q, k, v, RotaryEmbedding(8, max_len=16)).shape
    torch.Size([1, 4, 6, 8])
    """
    enc = NoPE() if encoding is None else check_encoding(encoding, causal)
    check_backend(backend)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        shapes = ", ".join(str(tuple(t.shape)) for t in (q, k, v))
        raise ValueError(f"q, k, v must be 4-D, got {shapes}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t)
    b, h, sq, hd = q.shape
    check_heads(enc, h)
    sk = k.shape[2]
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or h % k.shape[1]:
        raise ValueError(
            "k and v must be (batch, kv_heads, seq_k, ·) with kv_heads dividing heads, got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if causal and sq > sk:
        raise ValueError(f"causal attention needs seq_q <= seq_k, got {sq} and {sk}")
    k_pos = position_arg(k_positions, b, sk, axes=enc.position_axes)
    if q_positions is None and sq > sk:
        raise ValueError(
            f"q_positions must be given when there are more queries ({sq}) than keys ({sk})"
        )
    if q_positions is None:
        q_pos = range(sk - sq, sk) if isinstance(k_pos, range) else k_pos[:, sk - sq :]
    else:
        q_pos = position_arg(q_positions, b, sq, axes=enc.position_axes)
    valid = None if padding_mask is None else check_padding_mask(padding_mask, b, sk)
    q, k = enc.encode_qk(q, k, q_pos, k_pos)
    step = plan(
        enc, q_pos, k_pos, causal=causal, key_valid=valid, heads=h, backend=backend,
        dtype=q.dtype, device=q.device,
    )  # fmt: skip
    try:
        return _run(q, k, v, step, enc.softmax_scale(hd))
    finally:
        release(step)
