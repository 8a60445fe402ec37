"""The float mask SDPA adds to the scores: causal, padding and the encoding's score bias.

Built once per model step and shared by its layers. Inference reuses one per-thread buffer
for score biases (a fresh ``(batch, heads, seq_q, seq_k)`` costs more in page faults than in
arithmetic); a step holds it until :func:`release`.
"""

from __future__ import annotations

import functools
import inspect
import threading

import torch

from posenc.torch.attention import reuse
from posenc.torch.documents import positions_of, real_positions
from posenc.torch.positions import len_of, position_tensor

__all__ = ["attention_mask", "check_limits", "release"]


def attention_mask(
    encoding, q_positions, k_positions, *, causal, key_valid=None, heads=None, dtype, device=None,
    window=None, chunk=None,
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
    window : int, optional
        Sliding window, counted in positions: the key at position ``k`` is visible to the
        query at position ``q`` only if ``q - k < window`` (Mistral's, Gemma's local layers).
        Grid coordinates ``(b, seq, n_axes)`` count the slots instead, from each row's first
        real token (``key_valid``). Refused with ``causal=False`` (a bidirectional window
        is not built).
    chunk : int, optional
        Chunked attention, counted in positions: only keys with ``k // chunk == q //
        chunk`` are visible (Llama 4's local layers; grid coordinates: slots).

    Returns
    -------
    mask : torch.Tensor or None
        ``(b|1, h|1, seq_q, seq_k)``, or ``None`` when SDPA needs none.
    is_causal : bool
        Whether SDPA's own causal path applies (only when ``mask`` is ``None``).
    """
    limits = check_limits(window, chunk, causal)
    return _mask(encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device,
                 limits=limits)  # fmt: skip


def _mask(encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device, step=None,
          q_start=None, limits=(None, None), documents=None, order=None):  # fmt: skip
    """:func:`attention_mask`; with a ``step``, score biases may go into a per-thread
    workspace that the step holds until :func:`release` (nobody else writes it meanwhile).
    ``q_start`` (an int or a 0-d tensor): the key slot of the first query, when the keys
    are a whole static cache buffer rather than ending at the last query. ``limits``:
    ``(window, chunk)``, each ``None`` or a number of positions. ``documents``: ``(q_documents,
    k_documents)``, int64 ``(batch, seq_q)`` and ``(batch, seq_k)``, or ``None``. ``order``:
    the queries' and keys' global indices ``((seq_q,), (seq_k,))`` where they are not the
    slots ``0 ..`` (context parallelism), or ``None``."""
    plain = key_valid is None and q_start is None and documents is None and order is None
    kept = None  # a step's mask over range positions, kept per encoding (.reuse)
    if step is not None and plain and "scores" in encoding.places:
        kept = reuse.key(encoding, q_positions, k_positions, causal, heads, dtype, device, limits)
        found = reuse.get(encoding, kept)
        if found is not None:
            return found
    mask, is_causal = _fresh(encoding, q_positions, k_positions, causal, key_valid, heads, dtype,
                             device, None if kept is not None else step, q_start, limits,
                             documents, order)  # fmt: skip
    reuse.put(encoding, kept, mask, is_causal)
    return mask, is_causal


def _fresh(encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device, step,
           q_start, limits, documents, order):  # fmt: skip
    """:func:`_mask` built anew (into the thread's workspace if ``step`` is given)."""
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
    plain = key_valid is None and q_start is None and documents is None and order is None
    if bias is None and plain and limits == (None, None):
        if not causal or seq_q == 1:
            return None, False
        if seq_q == seq_k:
            return None, True  # SDPA's is_causal aligns to the start: right when sq == sk
    allowed = _allowed(seq_q, seq_k, causal, key_valid, device, q_start, limits, documents,
                       order, (q_positions, k_positions))  # fmt: skip
    if allowed is None:
        return bias.to(dtype), False
    hidden = torch.zeros_like(allowed, dtype=dtype).masked_fill_(
        ~allowed, float("-inf")
    )  # 0 where visible, -inf where hidden (exact in any dtype): (b|1, 1, sq, sk), small
    if bias is None:
        return hidden, False
    if bias is out and all(h in (1, b) for b, h in zip(bias.shape, hidden.shape, strict=True)):
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


def _allowed(seq_q, seq_k, causal, key_valid, device, q_start=None, limits=(None, None),
             documents=None, order=None, positions=None):  # fmt: skip
    """Bool ``(b|1, 1, seq_q, seq_k)``: which key slot each query slot may see, or None (all).

    Causality and padding count slots; a window and a chunk count ``positions``
    (``(q_positions, k_positions)``, see :func:`limit_positions`)."""
    extra = key_valid is not None or documents is not None or order is not None
    last = seq_q == 1 and q_start is None  # one query at the last slot: it sees every key
    if (not causal or last) and not extra and limits == (None, None):
        return None
    if order is not None:  # global indices: the sequence is split across ranks
        i, j = order[0].to(device)[:, None], order[1].to(device)[None]  # (sq, 1), (1, sk)
    else:
        first = seq_k - seq_q if q_start is None else q_start  # slot of the first query
        i = torch.arange(seq_q, device=device)[:, None] + first  # query slots (sq, 1)
        j = torch.arange(seq_k, device=device)[None]  # key slots (1, sk)
    allowed = (j <= i) if causal else torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    allowed = allowed[None, None]  # (1, 1, sq, sk)
    if limits != (None, None):
        rows = (key_valid, documents) if order is None else (None, None)  # global: no row order
        p, r = limit_positions(positions, i, j, device, *rows)  # (b|1, sq, 1), (b|1, 1, sk)
        allowed = allowed & within(p, r, limits)[:, None]  # (b|1, 1, sq, sk)
    if documents is not None:  # never across documents
        q_doc, k_doc = (d.to(device) for d in documents)  # (b, sq), (b, sk)
        allowed = allowed & (q_doc[:, None, :, None] == k_doc[:, None, None, :])  # (b,1,sq,sk)
    if key_valid is not None:
        allowed = (allowed & key_valid[:, None, None, :].to(device)) | (j == i)  # (b, 1, sq, sk)
    return allowed


def limit_positions(positions, i, j, device, key_valid=None, documents=None):
    """What a window and a chunk count: the query and key positions, int64 ``(b|1, sq, 1)``
    and ``(b|1, 1, sk)`` (after left padding they start at the first real token, in a packed
    row at each document; after a packed prefill they continue the last document), as HF's
    ``masking_utils`` count them. Grid coordinates (M-RoPE's ``(b, seq, n_axes)``) name no
    one position (an image token's axes differ): they count the slots ``i`` ``(sq, 1)`` and
    ``j`` ``(1, sk)`` instead, from each row's first real token and each document's first
    (:func:`real_index`) where a padding mask or documents are given (not with more queries
    than keys, which are no slots of theirs)."""
    if positions is not None and not any(grid(p) for p in positions):
        q, k = positions
        return position_tensor(q, device)[:, :, None], position_tensor(k, device)[:, None, :]
    if (key_valid is None and documents is None) or i.shape[0] > j.shape[1]:
        return i[None], j[None]
    r = real_index(key_valid, documents, device)  # (b, sk)
    return r[:, i[:, 0]][:, :, None], r[:, None, :]


def real_index(key_valid, documents, device) -> torch.Tensor:
    """Int64 ``(b, sk)``: each key slot's index among the real slots of its document (padding
    skipped, 0 at each row's first real token and each document's first: the default
    positions of ``posenc.torch.documents.real_positions``); ``key_valid`` bool
    ``(b, sk)`` or ``None``, ``documents`` ``(q_documents, k_documents)`` or ``None``."""
    k_doc = None if documents is None else documents[1].to(device)  # (b, sk)
    if key_valid is None:  # every slot real: each document's own count
        return positions_of(k_doc)
    return real_positions(key_valid.to(device), k_doc)


def grid(positions) -> bool:
    """Whether ``positions`` are grid coordinates ``(b|1, seq, n_axes)``."""
    return not isinstance(positions, range) and positions.dim() == 3


def within(p, r, limits):
    """Bool: key position ``r`` is inside the window and the chunk of query position ``p``
    (``limits``: ``(window, chunk)``, each ``None`` or an int); broadcasts (tensors, or the
    index tensors of a FlexAttention ``mask_mod``)."""
    window, chunk = limits
    ok = None
    if window is not None:
        ok = p - r < window  # the last ``window`` positions up to the query's (earlier ones out)
    if chunk is not None:
        same = p // chunk == r // chunk  # the query's own chunk of positions
        ok = same if ok is None else ok & same
    return ok


def check_limits(window, chunk, causal=True) -> tuple:
    """``(window, chunk)`` after checking each is ``None`` or an int >= 1, and that a window
    comes with causal attention (:func:`refuse_bidirectional_window`)."""
    for name, value in (("window", window), ("chunk", chunk)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):  # fmt: skip
            raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
    if window is not None and not causal:
        refuse_bidirectional_window(window)
    return window, chunk


def refuse_bidirectional_window(window, where=""):
    """``ValueError``: a sliding window without causality is not built. Its conventions
    (HF's ``|i - j| <= w`` of ModernBERT's and Gemma's encoders) are not the look-back
    window ``0 <= i - j < w``, and posenc builds neither in its place."""
    raise ValueError(
        f"window needs causal=True{where}, got window={window!r} with causal=False: a "
        "bidirectional sliding window (HF's |i - j| <= w) is not built, and a look-back "
        "window is no such window"
    )
