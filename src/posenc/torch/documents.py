"""Packed documents: several documents in one row, positions restarting at each.

A packed batch row holds documents back to back; ``documents`` numbers them, int64
``(batch, seq)``, non-decreasing along each row. Positions restart at 0 where a
document starts, and attention never crosses from one document to another. Two other
spellings of the same packing are common and convert to and from ``documents``:

* ``cu_seqlens`` -- the cumulative lengths ``[0, n_1, n_1 + n_2, ...]`` of one flat
  sequence, as flash-attention's varlen functions take them;
* per-token position ids restarting at 0 -- as HF's ``DataCollatorWithFlattening`` makes
  them (a document starts wherever the position is 0).
"""

from __future__ import annotations

import torch

from posenc.torch.position_values import checked_positions, remember_bounds, traced

__all__ = [
    "check_documents",
    "positions_from_documents",
    "documents_from_positions",
    "documents_from_cu_seqlens",
    "cu_seqlens_from_documents",
]


def check_documents(documents, batch: int, seq: int) -> torch.Tensor:
    """Return ``documents`` if it is an integer ``(batch, seq)`` tensor, non-decreasing along
    each row; else ``ValueError`` naming what is wrong (the first decrease, by row and index)."""
    if not isinstance(documents, torch.Tensor) or documents.shape != (batch, seq):
        got = tuple(documents.shape) if isinstance(documents, torch.Tensor) else documents
        raise ValueError(f"documents must be an int64 tensor of shape ({batch}, {seq}), got {got}")
    if documents.dtype.is_floating_point or documents.dtype == torch.bool:
        raise ValueError(f"documents must hold integer ids, got dtype {documents.dtype}")
    if seq > 1 and traced(documents):  # compiled: the check is an op the ids depend on
        steps = checked_positions(documents.diff(dim=1), 0, 0, "document id steps", "",
                                  "; documents must not decrease along a row")  # fmt: skip
        first = documents[:, :1].long()  # (batch, 1)
        return torch.cat([first, first + steps.long().cumsum(1)], 1)  # (batch, seq)
    if seq > 1:
        down = documents[:, 1:] < documents[:, :-1]  # (batch, seq - 1)
        if bool(down.any()):
            row, i = (int(v) for v in down.nonzero()[0])
            raise ValueError(
                f"documents must not decrease along a row: row {row} goes from "
                f"{int(documents[row, i])} to {int(documents[row, i + 1])} at index {i + 1}"
            )
    return documents.long()


def _starts(documents) -> torch.Tensor:
    """Bool ``(batch, seq)``: True where a document starts (the first token of a row too)."""
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return starts


def positions_from_documents(documents) -> torch.Tensor:
    """Positions restarting at 0 at each document.

    Parameters
    ----------
    documents : torch.Tensor
        Int64 document ids ``(batch, seq)``, non-decreasing along each row.

    Returns
    -------
    torch.Tensor
        Int64 ``(batch, seq)``.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import positions_from_documents
    >>> positions_from_documents(torch.tensor([[0, 0, 0, 1, 1, 2]]))
    tensor([[0, 1, 2, 0, 1, 0]])
    """
    return positions_of(check_documents(documents, *documents.shape))


def positions_of(documents) -> torch.Tensor:
    """:func:`positions_from_documents` of ids :func:`check_documents` has already passed."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    start = torch.where(_starts(documents), index, torch.zeros_like(index))
    return index - start.cummax(dim=1).values  # (batch, seq)


def real_positions(real, documents=None) -> torch.Tensor:
    """Default positions of padded (and packed) rows: counted over the real tokens only.

    0 at each row's first real token (each document's, with ``documents``), one more at
    each real token after it, as if the padding were not there (HF's ``generate`` derives
    them so from its ``attention_mask``); a padding slot takes the position of the real
    token before it in its document (0 before any). Padding marked as a document of its
    own gives the same positions to the real tokens.

    ``real``: bool ``(batch, seq)``, ``False`` on padding; ``documents``: ids
    :func:`check_documents` has passed, or ``None``. Returns int64 ``(batch, seq)`` on
    ``real``'s device, in ``[0, seq - 1]``.
    """
    seen = real.long().cumsum(1)  # (batch, seq): real tokens up to each slot, itself included
    if documents is not None:  # ... of its own document: minus those before the document
        documents = documents.to(real.device)
        first = torch.arange(real.shape[1], device=real.device) - positions_of(documents)
        seen = seen - (seen - real.long()).gather(1, first.expand_as(seen))
    return (seen - 1).clamp(min=0)


def check_agree(positions, documents) -> torch.Tensor:
    """Refuse positions that do not restart at 0 where a document starts (after a row's
    first token, which may continue a document); return them as a tensor (a ``range``
    made one)."""
    if isinstance(positions, range):
        positions = torch.arange(positions.start, positions.stop, device=documents.device)[None]
    if positions.dim() == 3:  # grid coordinates (M-RoPE): a document starts at any point
        return positions
    starts = _starts(documents)
    starts[:, 0] = False
    if traced(positions):  # compiled: a checking op the returned positions depend on
        at = torch.where(starts, positions.expand_as(documents), 0)  # (batch, seq)
        name = "positions at a document start"  # "... must be < 1, got 3"
        return torch.where(starts, checked_positions(at, 0, 1, name, "", ""), positions)
    wrong = starts & (positions.expand_as(documents) != 0)
    if bool(wrong.any()):
        row, i = (int(v) for v in wrong.nonzero()[0])
        raise ValueError(
            f"positions must restart at 0 where a document starts: row {row}, index {i} "
            f"starts document {int(documents[row, i])} at position "
            f"{int(positions.expand_as(documents)[row, i])}"
        )
    return positions


def documents_from_positions(position_ids) -> torch.Tensor:
    """Document ids of per-token positions that restart at 0 (HF's flattening collator).

    Parameters
    ----------
    position_ids : torch.Tensor
        Integer ``(batch, seq)``; a document starts wherever the position is 0.

    Returns
    -------
    torch.Tensor
        Int64 ``(batch, seq)``, from 0 in each row.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import documents_from_positions
    >>> documents_from_positions(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    tensor([[0, 0, 0, 1, 1, 2]])
    """
    if position_ids.dim() != 2 or position_ids.dtype.is_floating_point:
        raise ValueError(f"position_ids must be an integer (batch, seq) tensor, got "
                         f"{position_ids.dtype} {tuple(position_ids.shape)}")  # fmt: skip
    return (position_ids == 0).long().cumsum(1) - (position_ids[:, :1] == 0).long()


def documents_from_cu_seqlens(cu_seqlens) -> torch.Tensor:
    """Document ids of one flat sequence, from the cumulative lengths of flash-attention.

    Parameters
    ----------
    cu_seqlens : torch.Tensor or sequence of int
        ``[0, n_1, n_1 + n_2, ...]``, non-decreasing.

    Returns
    -------
    torch.Tensor
        Int64 ``(1, total)``.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import documents_from_cu_seqlens
    >>> documents_from_cu_seqlens(torch.tensor([0, 3, 5, 6], dtype=torch.int32))
    tensor([[0, 0, 0, 1, 1, 2]])
    """
    cu = torch.as_tensor(cu_seqlens)
    if cu.dtype.is_floating_point or cu.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must hold integers, got dtype {cu.dtype}")
    if cu.dim() != 1 or len(cu) < 2 or int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must be non-decreasing lengths from 0, got {cu.tolist()}")
    lengths = (cu[1:] - cu[:-1]).long()
    ids = torch.arange(len(lengths), device=cu.device)
    return torch.repeat_interleave(ids, lengths)[None]


def cu_seqlens_from_documents(documents) -> torch.Tensor:
    """The cumulative lengths (flash-attention's varlen argument) of every row's documents.

    Rows are flattened in order: a document never spans two rows.

    Parameters
    ----------
    documents : torch.Tensor
        Int64 document ids ``(batch, seq)``, non-decreasing along each row.

    Returns
    -------
    torch.Tensor
        Int32 ``(n_documents + 1,)``, from 0 to ``batch * seq``.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import cu_seqlens_from_documents
    >>> cu_seqlens_from_documents(torch.tensor([[0, 0, 0, 1, 1, 2]]))
    tensor([0, 3, 5, 6], dtype=torch.int32)
    """
    documents = check_documents(documents, *documents.shape)
    starts = _starts(documents).flatten().nonzero().flatten()
    total = torch.tensor([documents.numel()], device=documents.device)
    return torch.cat([starts, total]).int()


def after_last_document(q_pos, documents, real=None):
    """Where decoding continues after a packed prefill: each row's last document with a real
    token (``real``: bool ``(batch, n)``, ``False`` on padding) and one past its largest
    real coordinate, each ``(batch, 1)``; the running maximum of the positions would count
    earlier documents, and a padding document continues nothing."""
    b, n = documents.shape
    if isinstance(q_pos, range):
        q_pos = torch.arange(q_pos.start, q_pos.stop, device=documents.device)[None]
    t = q_pos.to(documents.device).expand(b, *q_pos.shape[1:]).reshape(b, n, -1).amax(-1)
    real = torch.ones_like(documents, dtype=torch.bool) if real is None else real
    index = torch.arange(n, device=documents.device).expand(b, n)
    at = torch.where(real, index, torch.full_like(index, -1)).amax(1, keepdim=True)
    at = torch.where(real.any(1, keepdim=True), at, torch.full_like(at, n - 1))  # (b, 1)
    last = documents.gather(1, at)  # (batch, 1): the last real token's document
    mine = (documents == last) & real  # (batch, n)
    nxt = torch.where(mine, t, torch.full_like(t, -1)).amax(1, keepdim=True) + 1
    return nxt.clamp(min=0).long(), last


def default_positions(real, documents, n):
    """The positions of a step given none: :func:`real_positions` over ``real`` (bool
    ``(batch, n)``, or ``None``: every token real) restarting at each of ``documents`` (or
    ``None``), their bounds ``[0, n - 1]`` known to the host (nothing read back); ``None``
    where neither is given (the caller's own default)."""
    if real is not None:
        return remember_bounds(real_positions(real, documents), 0, n - 1)  # (batch, n)
    if documents is not None:
        return remember_bounds(positions_of(documents), 0, n - 1)  # (batch, n): 0 at starts
    return None
