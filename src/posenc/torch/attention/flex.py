"""The FlexAttention backend: the encoding's ``score_mod`` and a causal/padding block mask."""

from __future__ import annotations

import copy
import threading

import torch

from posenc.torch.attention.mask import grid, real_index, within
from posenc.torch.positions import _concrete, _int_on, len_of, position_at

__all__ = ["flex_plan", "flex_attention_compiled"]


_FLEX = {}
_MASKS = {}  # (seq_q, seq_k, offset, device, ...): BlockMask, built once per shape
_MASKS_KEPT = 16
_MASKS_LOCK = threading.Lock()
_BLOCK = 128  # create_block_mask's default block size, both sides


def flex_attention_compiled(device_type="cpu"):
    """``flex_attention`` compiled once per process and device type (it materialises
    scores when eager)."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():  # already inside the user's torch.compile
        return flex_attention
    if device_type not in _FLEX:
        # Static shapes on every device. Symbolic ones fail in inductor's flex lowering: on
        # the CPU (torch 2.13), and on CUDA once automatic dynamic shapes generalise the
        # tensors one score_mod captures after another's (seen on an H200, torch 2.11: T5
        # after ALiBi). Decoding attends over the whole preallocated cache, so its shapes do
        # not change between steps; a new prefill length compiles once more.
        _FLEX[device_type] = torch.compile(flex_attention, dynamic=False)
    return _FLEX[device_type]


def _causal_block_mask(seq_q, seq_k, offset, device, limits=(None, None), starts=(0, 0)):
    """The causal ``BlockMask`` (queries at slots ``offset ..``; a sliding window or chunks
    too, over positions ``starts[0] ..`` and ``starts[1] ..`` of queries and keys), cached
    by shape: building one costs more than a small attention call (32 ms at 256 x 256 on a
    2-core CPU)."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = torch.device("cpu") if device is None else _concrete(device)
    starts = starts if limits != (None, None) else (0, 0)  # no limit: positions do not count
    key = (seq_q, seq_k, offset, str(device), limits, starts)
    mask = _MASKS.get(key)
    if mask is None:
        shift = torch.tensor(offset, device=device)
        q0, k0 = (torch.tensor(s, device=device) for s in starts)

        def causal(b, h, q_idx, kv_idx):
            ok = kv_idx <= q_idx + shift
            return ok if limits == (None, None) else ok & within(q_idx + q0, kv_idx + k0, limits)

        mask = _keep(key, create_block_mask(causal, None, None, seq_q, seq_k, device=device))
    return mask


def _keep(key, mask):
    """``mask``, kept in the bounded cache under ``key``."""
    with _MASKS_LOCK:  # threads share the cache: evict and insert as one step
        while len(_MASKS) >= _MASKS_KEPT:
            _MASKS.pop(next(iter(_MASKS)))  # the oldest
        _MASKS[key] = mask
    return mask


def _decode_block_mask(visible, batch, seq_q, seq_k, last, device):
    """A ``BlockMask`` for one block of queries whose ``mask_mod`` is ``visible``: the
    blocks of keys ``0 .. last`` (slots; ``None``: every key) all partial, so ``visible``
    decides each score in the kernel, and the tensors that say so built once per shape
    and device (``create_block_mask`` evaluates ``visible`` on every pair, on the host's
    clock: a cached step would wait for it each time)."""
    from torch.nn.attention.flex_attention import BlockMask

    device = torch.device("cpu") if device is None else _concrete(device)
    blocks = -(-seq_k // _BLOCK)
    seen = blocks if last is None else min(blocks, last // _BLOCK + 1)
    rows = 1 if batch is None else batch  # one row's blocks stand for every row
    key = ("decode", rows, seq_q, seq_k, seen, str(device))
    mask = _MASKS.get(key)
    if mask is None:
        with torch.inference_mode(False), torch.no_grad():  # kept: usable in any mode
            counts = torch.full((rows, 1, 1), seen, dtype=torch.int32, device=device)
            order = torch.arange(blocks, dtype=torch.int32, device=device)
            order = order.expand(rows, 1, 1, blocks).contiguous()
            mask = _keep(key, BlockMask.from_kv_blocks(
                counts, order, BLOCK_SIZE=_BLOCK, seq_lengths=(seq_q, seq_k)
            ))  # fmt: skip
    mask = copy.copy(mask)  # the same tensors, this step's mask_mod
    mask.mask_mod = visible
    return mask


def _limit_positions(q_positions, k_positions, offset, device, key_valid, documents):
    """``f(b, idx)`` for queries and keys: the positions a window and a chunk count
    (:func:`~posenc.torch.attention.mask.limit_positions`; grid coordinates: the slots,
    counted from each row's first real token and each document's first)."""
    if not (grid(q_positions) or grid(k_positions)):
        moved = (p if isinstance(p, range) else p.to(device) for p in (q_positions, k_positions))
        return tuple(position_at(p, device) for p in moved)
    counted = key_valid is not None or documents is not None
    if not counted or len_of(q_positions) > len_of(k_positions):
        return (lambda b, idx: idx + offset), (lambda b, idx: idx)
    r = real_index(key_valid, documents, device)  # (b, sk)
    return (lambda b, idx: r[b, idx + offset]), (lambda b, idx: r[b, idx])


def _mask_device(device, key_valid, q_start):
    """``device``, else that of the tensors the mask reads, else the CPU."""
    if device is not None:
        return torch.device(device)
    given = key_valid if key_valid is not None else q_start
    return given.device if isinstance(given, torch.Tensor) else torch.device("cpu")


def flex_plan(
    encoding, q_positions, k_positions, *, causal, key_valid=None, q_start=None, device=None,
    limits=(None, None), documents=None,
):  # fmt: skip
    """The encoding's ``score_mod`` and a causal/padding ``BlockMask`` for FlexAttention.

    Same semantics as :func:`attention_mask`: causal aligned to the end, padding keys
    hidden except a query's own slot. With a KV cache the keys are the whole preallocated
    buffer (static shapes: the compiled kernel is reused at every step), ``key_valid``
    hides the unfilled slots and ``q_start`` says which slot the first query is.

    Parameters
    ----------
    encoding : PositionalEncoding
        Supplies ``score_mod``.
    q_positions, k_positions : torch.Tensor or range
        Positions of queries and keys.
    causal : bool
        Causal attention.
    key_valid : torch.Tensor, optional
        Bool ``(batch, seq_k)``.
    q_start : int, optional
        Key slot of the first query; default ``seq_k - seq_q`` (the queries are the last).
    device : torch.device, optional
        Where the block mask lives; default: with ``key_valid`` or a tensor ``q_start``,
        their device, else the CPU (never torch's default or current device).
    limits : tuple
        ``(window, chunk)``: a sliding window and chunked attention (``None``: none),
        counted in positions as :func:`attention_mask` counts them.
    documents : tuple of torch.Tensor, optional
        ``(q_documents, k_documents)``, int64 ``(batch, seq_q)`` and ``(batch, seq_k)``: no
        query sees a key of another document (the block mask skips those blocks).

    Returns
    -------
    score_mod : callable or None
        From the encoding.
    block_mask : BlockMask or None
        ``None`` when every key is visible.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    seq_q, seq_k = len_of(q_positions), len_of(k_positions)
    score_mod = encoding.score_mod(q_positions, k_positions)
    if not causal and key_valid is None and limits == (None, None) and documents is None:
        return score_mod, None
    ranges = isinstance(q_positions, range) and isinstance(k_positions, range)
    plain = causal and key_valid is None and documents is None
    plain = plain and not isinstance(q_start, torch.Tensor)
    plain = plain and (ranges or limits == (None, None))  # limits count tensor positions
    if plain and not torch.compiler.is_compiling():  # depends on the shape alone: reuse it
        starts = (q_positions.start, k_positions.start) if ranges else (0, 0)
        return score_mod, _causal_block_mask(
            seq_q, seq_k, seq_k - seq_q if q_start is None else q_start, device, limits, starts
        )
    device = _mask_device(device, key_valid, q_start)
    offset = seq_k - seq_q if q_start is None else q_start
    last = None  # the last key slot a query may see, when the host knows it
    if not isinstance(offset, torch.Tensor):  # a tensor: no recompile when it changes
        last = offset + seq_q - 1 if causal else None
        offset = _int_on(offset, device)  # eager: a view, no copy to the device per call
    q_doc = k_doc = None  # bound either way: dynamo refuses a closure over an unset cell
    if documents is not None:
        q_doc, k_doc = (d.to(device) for d in documents)  # (b, sq), (b, sk)
    q_at, k_at = _limit_positions(q_positions, k_positions, offset, device, key_valid,
                                  documents)  # fmt: skip

    def visible(b, h, q_idx, kv_idx):
        slot = q_idx + offset
        ok = kv_idx <= slot if causal else kv_idx >= 0
        if limits != (None, None):  # counted in positions
            ok = ok & within(q_at(b, q_idx), k_at(b, kv_idx), limits)
        if documents is not None:
            ok = ok & (q_doc[b, q_idx] == k_doc[b, kv_idx])
        if key_valid is not None:
            ok = (ok & key_valid[b, kv_idx]) | (kv_idx == slot)
        return ok

    rows = [] if key_valid is None else [key_valid.shape[0]]
    if documents is not None:  # every row its own documents: a block mask per row
        rows += [documents[0].shape[0], documents[1].shape[0]]
    if limits != (None, None):  # every row its own positions too
        rows += [p.shape[0] for p in (q_positions, k_positions) if not isinstance(p, range)]
    batch = max(rows, default=None)
    cached_step = q_start is not None and seq_q <= _BLOCK  # a decode step over a cache
    if cached_step and not torch.compiler.is_compiling():  # its blocks: built once per shape
        return score_mod, _decode_block_mask(visible, batch, seq_q, seq_k, last, device)
    return score_mod, create_block_mask(visible, batch, None, seq_q, seq_k, device=device)
