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

from posenc.torch.positions import len_of

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
        Sliding window: key slot ``j`` is visible to query slot ``i`` only if
        ``i - window < j`` (Mistral's, Gemma's local layers).
    chunk : int, optional
        Chunked attention: only keys in the query's chunk of ``chunk`` slots are visible
        (Llama 4's local layers).

    Returns
    -------
    mask : torch.Tensor or None
        ``(b|1, h|1, seq_q, seq_k)``, or ``None`` when SDPA needs none.
    is_causal : bool
        Whether SDPA's own causal path applies (only when ``mask`` is ``None``).
    """
    limits = check_limits(window, chunk)
    return _mask(encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device,
                 limits=limits)  # fmt: skip


def _mask(encoding, q_positions, k_positions, causal, key_valid, heads, dtype, device, step=None,
          q_start=None, limits=(None, None), documents=None, order=None):  # fmt: skip
    """:func:`attention_mask`; with a ``step``, score biases may go into a per-thread
    workspace that the step holds until :func:`release` (nobody else writes it meanwhile).
    ``q_start`` (an int or a 0-d tensor): the key slot of the first query, when the keys
    are a whole static cache buffer rather than ending at the last query. ``limits``:
    ``(window, chunk)``, each ``None`` or a number of slots. ``documents``: ``(q_documents,
    k_documents)``, int64 ``(batch, seq_q)`` and ``(batch, seq_k)``, or ``None``. ``order``:
    the queries' and keys' global indices ``((seq_q,), (seq_k,))`` where they are not the
    slots ``0 ..`` (context parallelism), or ``None``."""
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
                       order)  # fmt: skip
    if allowed is None:
        return bias.to(dtype), False
    hidden = torch.zeros_like(allowed, dtype=dtype).masked_fill_(
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


def _allowed(seq_q, seq_k, causal, key_valid, device, q_start=None, limits=(None, None),
             documents=None, order=None):  # fmt: skip
    """Bool ``(b|1, 1, seq_q, seq_k)``: which key slot each query slot may see, or None (all)."""
    window, chunk = limits
    extra = key_valid is not None or documents is not None or order is not None
    if not causal and not extra and limits == (None, None):
        return None
    if order is not None:  # global indices: the sequence is split across ranks
        i, j = order[0].to(device)[:, None], order[1].to(device)[None]  # (sq, 1), (1, sk)
    else:
        first = seq_k - seq_q if q_start is None else q_start  # slot of the first query
        i = torch.arange(seq_q, device=device)[:, None] + first  # query slots (sq, 1)
        j = torch.arange(seq_k, device=device)[None]  # key slots (1, sk)
    allowed = (j <= i) if causal else torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if window is not None:
        allowed = allowed & (j > i - window)  # the last ``window`` slots up to the query
    if chunk is not None:
        allowed = allowed & (j // chunk == i // chunk)  # the query's own chunk
    allowed = allowed[None, None]  # (1, 1, sq, sk)
    if documents is not None:  # never across documents
        q_doc, k_doc = (d.to(device) for d in documents)  # (b, sq), (b, sk)
        allowed = allowed & (q_doc[:, None, :, None] == k_doc[:, None, None, :])  # (b,1,sq,sk)
    if key_valid is not None:
        allowed = (allowed & key_valid[:, None, None, :].to(device)) | (j == i)  # (b, 1, sq, sk)
    return allowed


def check_limits(window, chunk) -> tuple:
    """``(window, chunk)`` after checking each is ``None`` or an int >= 1."""
    for name, value in (("window", window), ("chunk", chunk)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):  # fmt: skip
            raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
    return window, chunk
