"""The functional attention core shared by every encoding: ``attend``, the step plan, the backends.

Attention calls the query/key hook and the score hook of its
:class:`~posenc.torch.PositionalEncoding` and knows nothing else about position;
encodings that act on the input are applied by the model before the first block.
Two backends: ``"sdpa"`` (:func:`torch.nn.functional.scaled_dot_product_attention` with
one float mask, :mod:`.mask`) and ``"flex"`` (FlexAttention with the encoding's
``score_mod`` and a block mask, compiled once, :mod:`.flex`); ``"auto"`` picks
FlexAttention for score biases on CUDA. Shape legend: ``q`` is
``(batch, heads, seq_q, head_dim)``; ``k, v`` are ``(batch, kv_heads, seq_k, head_dim)``,
``kv_heads`` dividing ``heads``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from posenc.torch.attention.flex import flex_attention_compiled, flex_plan
from posenc.torch.attention.mask import _mask, check_limits, refuse_bidirectional_window, release
from posenc.torch.documents import check_agree, check_documents, default_positions
from posenc.torch.encodings.base import NoPE
from posenc.torch.encodings.checks import check_encoding, check_float, check_heads
from posenc.torch.positions import position_arg

__all__ = ["attend", "plan", "Step"]

BACKENDS = ("auto", "sdpa", "flex")
FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
    cache: object  # KVCache or None
    start: int  # first cache slot of this step
    backend: str = "sdpa"
    mask: torch.Tensor | None = None  # sdpa
    is_causal: bool = False  # sdpa
    score_mod: object = None  # flex
    block_mask: object = None  # flex
    full_kv: bool = False  # flex with a cache: attend over the whole cache buffer
    holds_workspace: bool = False  # its mask is the per-thread workspace (until release)
    context: object = None  # context parallelism: the keys of every rank (model/parallel.py)


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
         cache=None, start=0, full_kv=False, limits=(None, None),
         documents=None, order=None, context=None) -> Step:  # fmt: skip
    """The mask (or score_mod and block mask) of one step, built once for all its layers of
    one kind (``limits``: their sliding window and chunk)."""
    if limits[0] is not None and not causal:
        refuse_bidirectional_window(limits[0])
    if order is not None and backend == "auto":
        backend = "sdpa"  # context parallelism runs on SDPA
    backend = resolve_backend(backend, encoding, device)
    if backend == "flex" and order is not None:
        raise ValueError("backend 'flex' does not run context-parallel steps: use 'sdpa'")
    if backend == "flex" and dtype not in FLEX_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in FLEX_DTYPES)
        raise ValueError(f"backend='flex' takes {names} (FlexAttention's kernels), got {dtype}")
    step = Step(q_positions, k_positions, cache, start, backend, full_kv=full_kv, context=context)
    if backend == "sdpa":
        try:
            step.mask, step.is_causal = _mask(
                encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device,
                step, q_start=start if full_kv else None, limits=limits, documents=documents,
                order=order,
            )  # fmt: skip
        except Exception:
            release(step)
            raise
    else:
        step.score_mod, step.block_mask = flex_plan(
            encoding, q_positions, k_positions, causal=causal, key_valid=key_valid,
            q_start=start if full_kv else None, device=device, limits=limits,
            documents=documents,
        )  # fmt: skip
    return step


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
    window=None,
    chunk=None,
    documents=None,
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
        ``(seq_k,)`` or ``(batch, seq_k)``; default ``0 .. seq_k - 1``, or counted over the
        real keys where a ``padding_mask`` is given: 0 at each row's first real token (and
        each document's), the padding skipped, as HF's ``generate`` and its chunked masks
        count them (``posenc.torch.documents.real_positions``). Give positions to
        count otherwise.
    causal : bool
        Causal attention; ``False`` refuses a ``window`` (a bidirectional sliding window
        such as HF's ``|i - j| <= w`` is not built).
    padding_mask : torch.Tensor, optional
        Bool ``(batch, seq_k)``, ``True`` for real keys.
    backend : {"auto", "sdpa", "flex"}
        ``"sdpa"``: one float mask; ``"flex"``: FlexAttention with the encoding's
        ``score_mod`` (compiled on first use; inference only on the CPU); ``"auto"``
        (default): ``"flex"`` for score biases on CUDA, else ``"sdpa"``.
    window : int, optional
        Sliding window, counted in positions: the query at position ``q`` sees only keys at
        positions ``k > q - window`` (positions, not slots: left-padded rows whose positions
        start at their first real token, and each packed document, start it anew).
    chunk : int, optional
        Chunked attention, counted in positions: only keys with ``k // chunk == q //
        chunk``. Grid coordinates ``(batch, seq, n_axes)`` name no one position: both count
        slots instead, from each row's first real token and each document's first.
    documents : torch.Tensor, optional
        Int64 ``(batch, seq)`` document ids of packed rows (self-attention, ``seq_q ==
        seq_k``), non-decreasing along a row: no query sees a key of another document, and
        positions not given restart at 0 at each document (at its first real token).

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
    limits = check_limits(window, chunk, causal)
    valid = None if padding_mask is None else check_padding_mask(padding_mask, b, sk)
    docs, given = None, k_positions is not None
    if documents is not None:
        if sq != sk:
            raise ValueError(f"documents needs self-attention (seq_q == seq_k), got {sq} and {sk}")
        docs = check_documents(documents, b, sk)
    if k_positions is None:  # counted over the real keys, restarting at each document
        k_positions = default_positions(valid, docs, sk)
    k_pos = position_arg(k_positions, b, sk, axes=enc.position_axes)
    if docs is not None and given:  # derived ones restart at each document: no read
        k_pos = check_agree(k_pos, docs)
    if q_positions is None and sq > sk:
        raise ValueError(
            f"q_positions must be given when there are more queries ({sq}) than keys ({sk})"
        )
    if q_positions is None:
        q_pos = range(sk - sq, sk) if isinstance(k_pos, range) else k_pos[:, sk - sq :]
    else:
        q_pos = position_arg(q_positions, b, sq, axes=enc.position_axes)
    q, k = enc.encode_qk(q, k, q_pos, k_pos)
    step = plan(
        enc, q_pos, k_pos, causal=causal, key_valid=valid, heads=h, backend=backend,
        dtype=q.dtype, device=q.device, limits=limits,
        documents=None if docs is None else (docs, docs),
    )  # fmt: skip
    try:
        return _run(q, k, v, step, enc.softmax_scale(hd))
    finally:
        release(step)
