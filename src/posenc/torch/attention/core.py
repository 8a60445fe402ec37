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

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from posenc.torch.attention import reuse
from posenc.torch.attention.flex import flex_plan
from posenc.torch.attention.mask import _mask, check_limits, refuse_bidirectional_window, release
from posenc.torch.attention.run import _kernels_for, _run, _sdpa  # noqa: F401 (tests read them)
from posenc.torch.attention.sinks import check_sinks
from posenc.torch.documents import check_agree, check_documents, default_positions
from posenc.torch.encodings.base import NoPE, PositionalEncoding
from posenc.torch.encodings.checks import check_encoding, check_float, check_heads
from posenc.torch.positions import position_arg

__all__ = ["attend", "plan", "Step"]

BACKENDS = ("auto", "sdpa", "flex")
FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_NOPE = NoPE()  # encoding=None: one stateless instance, not a module built per call


class Planned(NamedTuple):
    """What a call of ``attend`` with default positions planned, kept for the same call
    again (:mod:`.reuse`): its positions, mask and SDPA arguments."""

    q_pos: range
    k_pos: range
    mask: torch.Tensor | None
    is_causal: bool
    scale: float
    gqa: bool  # grouped-query attention: SDPA's enable_gqa
    wide: bool  # v narrower than the encoded q, k: padded (run._sdpa)
    plain: bool  # SDPA's defaults are the plan: no causal flag, no GQA, its own scale


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
    sinks=None,
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
    sinks : torch.Tensor, optional
        ``(heads,)`` a learned sink logit per query head (GPT-OSS): one more term
        ``exp(sinks[h])`` in every softmax denominator, a key with no value
        (``posenc.torch.attention.sinks``).

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
    known, snap, q_in, k_in = None, None, q, k  # default positions: a call planned before
    # goes straight to the kernel (keyed by the q and k given, not the encoded ones)
    if (q_positions is None and k_positions is None and padding_mask is None and window is None
            and chunk is None and documents is None and sinks is None
            and not torch.compiler.is_compiling()
            and isinstance(encoding, (PositionalEncoding, type(None)))):  # fmt: skip
        enc = _NOPE if encoding is None else encoding
        planned = reuse.last_call(enc, q, k, v, causal, backend)  # the same call again
        if planned is None:
            known = reuse.call_key(enc, q, k, v, causal, backend)
            snap = reuse.snapshot(enc) if known is not None else None  # before planning
            planned = reuse.recall(enc, known)
            if planned is not None:
                reuse.keep_last(enc, q, k, v, causal, backend, planned, snap)
        if planned is not None:
            q_pos, k_pos, mask, is_causal, scale, gqa, wide, plain = planned
            q, k = enc.encode_qk(q, k, q_pos, k_pos)
            if plain:  # SDPA's defaults are the plan: the fewest arguments to parse
                return F.scaled_dot_product_attention(q, k, v, mask)  # (b, heads, seq_q, v_dim)
            if wide:  # v padded to the encoded width
                return _sdpa(q, k, v, mask, is_causal, scale, gqa)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
            )  # (b, heads, seq_q, v_dim): a kept mask needs no kernel restriction
    enc = _NOPE if encoding is None else check_encoding(encoding, causal)
    check_backend(backend)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        shapes = ", ".join(str(tuple(t.shape)) for t in (q, k, v))
        raise ValueError(f"q, k, v must be 4-D, got {shapes}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t)
    b, h, sq, hd = q.shape
    check_heads(enc, h)
    sinks = None if sinks is None else check_sinks(sinks, h)
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
    scale = enc.softmax_scale(hd)
    try:
        out = _run(q, k, v, step, scale, sinks)
        if known is not None and _keepable(step, q_pos, k_pos):
            gqa, wide = q.shape[1] != k.shape[1], q.shape[-1] > v.shape[-1]
            # SDPA's own scale is 1 / sqrt(width) in double precision: the same number or not
            plain = not (step.is_causal or gqa or wide) and scale == 1.0 / math.sqrt(q.shape[-1])
            planned = Planned(q_pos, k_pos, step.mask, step.is_causal, scale, gqa, wide, plain)
            reuse.remember(enc, known, planned)
            reuse.keep_last(enc, q_in, k_in, v, causal, backend, planned, snap)
        return out
    finally:
        release(step)


def _keepable(step, q_pos, k_pos) -> bool:
    """Whether what a call planned may serve the next call of the same key: SDPA over range
    positions, with no mask or a keepable one (:func:`.reuse.keepable`), not a workspace."""
    if step.backend != "sdpa" or step.holds_workspace or step.context is not None:
        return False
    return isinstance(q_pos, range) and isinstance(k_pos, range) and reuse.keepable(step.mask)
