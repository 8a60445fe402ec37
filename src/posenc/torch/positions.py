"""Positions as hooks receive them: an int64 tensor ``(batch|1, seq)`` or a ``range``.

A ``range`` stands for consecutive positions shared by the batch (the common case): table
encodings slice instead of gathering, and ``torch.compile`` sees the largest position
without reading a tensor. These helpers validate user input and convert between the two.
"""

from __future__ import annotations

import threading

import torch

from posenc.torch.position_values import check_values

__all__ = ["as_positions", "position_tensor", "position_at", "relative_positions"]


def as_positions(positions, batch: int, seq: int, *, device=None) -> torch.Tensor:
    """Validate positions and return them as an int64 tensor of shape (batch or 1, seq).

    ``None`` means ``0 .. seq - 1`` shared by the batch; a ``range`` of length ``seq``
    is shared by the batch too. A 1-D tensor of length ``seq`` is shared by the batch; a
    2-D tensor must be ``(batch, seq)`` or ``(1, seq)``.

    Parameters
    ----------
    positions : torch.Tensor, range or None
        Int positions, ``(seq,)`` or ``(batch, seq)``; values must be non-negative.
    batch : int
        Batch size of the tensor the positions belong to.
    seq : int
        Sequence length of that tensor.
    device : torch.device, optional
        Where to put the result.

    Returns
    -------
    torch.Tensor
        Int64, shape ``(batch, seq)`` or ``(1, seq)``.

    Raises
    ------
    ValueError
        If the shape does not match, the dtype is not an integer type, or a
        position is negative.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import as_positions
    >>> as_positions(None, 2, 3)
    tensor([[0, 1, 2]])
    >>> as_positions(range(5, 8), 2, 3)
    tensor([[5, 6, 7]])
    >>> as_positions(torch.tensor([[5, 6, 7], [0, 1, 2]]), 2, 3).shape
    torch.Size([2, 3])
    """
    return position_tensor(position_arg(positions, batch, seq), device)


def position_arg(positions, batch: int, seq: int, *, axes: int | None = 1):
    """Normalise user positions for the hooks: ``None`` -> ``range(seq)``, tensors validated.

    Returns a ``range`` (contiguous, shared by the batch) or an int64 ``(batch|1, seq)``
    tensor, or ``(batch|1, seq, n_axes)`` for coordinates on a grid (images, video: the
    encodings of ``posenc.torch.encodings.qk.rope_nd`` read them; the attention core passes them
    on). Values are checked non-negative by
    :func:`~posenc.torch.position_values.check_values` (in eager mode one read, remembered
    on the tensor; traced, inside an op).
    ``axes``: the coordinates per token the reader expects (an encoding's
    :attr:`~posenc.torch.PositionalEncoding.position_axes`); 1 rejects grid coordinates,
    ``None`` accepts any number.
    """
    if positions is None:
        return range(seq)
    if isinstance(positions, range):
        if positions.step != 1 or len(positions) != seq or positions.start < 0:
            raise ValueError(
                f"positions must be a range of {seq} consecutive non-negative ints, got {positions}"
            )
        return positions
    if not isinstance(positions, torch.Tensor):
        positions = torch.as_tensor(positions)
    dtype = positions.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError(f"positions must be an integer tensor, got dtype {dtype}")
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)  # (1, seq)
    grid = positions.dim() == 3 and (axes is None or axes > 1)
    if (
        not (positions.dim() == 2 or grid)
        or positions.shape[1] != seq
        or positions.shape[0] not in (1, batch)
        or (grid and positions.shape[2] != (axes or positions.shape[2]))
    ):
        also = "" if axes == 1 else f", or (batch, seq, n_axes={axes or 'n'}) coordinates"
        raise ValueError(
            f"positions must have shape (seq,) or (batch, seq) = ({batch}, {seq}){also}, "
            f"got {tuple(positions.shape)}"
        )
    return check_values("positions", positions.long())  # eager: one read, remembered


def position_tensor(positions, device=None) -> torch.Tensor:
    """The positions a hook received, as an int64 tensor ``(batch|1, seq)``.

    Hooks receive either a tensor or a ``range``; this is the one line an encoding needs
    when it does not care which.

    Parameters
    ----------
    positions : torch.Tensor or range
        As passed to a hook.
    device : torch.device, optional
        Where to put a tensor made from a ``range`` (a tensor is moved there too).

    Returns
    -------
    torch.Tensor
        Int64 ``(batch|1, seq)``.

    Examples
    --------
    >>> from posenc.torch import position_tensor
    >>> position_tensor(range(3, 6))
    tensor([[3, 4, 5]])
    """
    if isinstance(positions, range):
        return torch.arange(positions.start, positions.stop, device=device)[None]
    return positions if device is None else positions.to(device)


def position_at(positions, device=None):
    """``f(b, idx)``: the position of slot ``idx`` of row ``b``, usable inside a ``score_mod``.

    Parameters
    ----------
    positions : torch.Tensor or range
        As passed to a hook.
    device : torch.device, optional
        Where a ``range``'s start is put (default: torch's default device): it is a 0-d
        tensor, not a Python int, so a compiled kernel does not specialise on it and is
        reused as a KV cache grows. In eager mode it is a view into a table of ints built
        once per device, so no call copies anything to the device.

    Returns
    -------
    callable
        ``f(b, idx) -> int64 tensor``.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch.positions import position_at
    >>> position_at(range(5, 9), "cpu")(0, torch.tensor([0, 3]))
    tensor([5, 8])
    """
    if isinstance(positions, range):
        start = _int_on(positions.start, device)
        return lambda b, idx: idx + start
    if positions.shape[0] == 1:
        row = positions[0]
        return lambda b, idx: row[idx]
    return lambda b, idx: positions[b, idx]


_INTS = {}  # device -> int64 (n, 2), row i holding i: 0-d views 16-byte aligned
_INTS_LOCK = threading.Lock()
_INTS_MAX = 1 << 20  # 16 MiB per device at most; larger values are copied per call


def _int_on(value, device=None):
    """``value`` as a 0-d int64 tensor on ``device`` that costs no host-to-device copy: a
    view into a table built once per device (again when a larger value comes), or, while
    tracing or past the table's bound, a new tensor."""
    device = _concrete(torch.get_default_device() if device is None else device)
    if torch.compiler.is_compiling() or not 0 <= value < _INTS_MAX:
        return torch.tensor(value, device=device)
    ints = _INTS.get(device)
    if ints is None or value >= ints.shape[0]:
        with _INTS_LOCK:  # threads share the table: grow it once
            ints = _INTS.get(device)
            if ints is None or value >= ints.shape[0]:
                n = min(_INTS_MAX, max(4096, 1 << (2 * value + 1).bit_length()))
                with torch.inference_mode(False), torch.no_grad():  # usable when training
                    ints = torch.arange(n, device=device).repeat_interleave(2).view(n, 2)
                _INTS[device] = ints
    return ints[value, 0]  # a view: no copy, no kernel


def _concrete(device):
    """``device`` with its index (``cuda`` -> ``cuda:<current>``): a table kept for one
    device is never handed to another."""
    device = torch.device(device)
    if device.index is None and device.type not in ("cpu", "meta"):
        index = torch.get_device_module(device.type).current_device()
        device = torch.device(device.type, index)
    return device


def relative_positions(q_positions, k_positions, device=None) -> torch.Tensor:
    """``i - j`` for query positions ``i`` and key positions ``j``: int64 ``(b|1, seq_q, seq_k)``.

    Parameters
    ----------
    q_positions, k_positions : torch.Tensor or range
        As passed to a hook.
    device : torch.device, optional
        Where to build the result.

    Returns
    -------
    torch.Tensor
        Int64 ``(batch|1, seq_q, seq_k)``.
    """
    qp, kp = position_tensor(q_positions, device), position_tensor(k_positions, device)
    return qp[:, :, None] - kp[:, None, :]  # (b|1, sq, sk)


def check_fits(name: str, positions, x: torch.Tensor, *, axes: int = 1) -> None:
    """A hook's guard: ``positions`` (a ``range`` of step 1, ``(batch|1, seq)``, or with
    ``axes > 1`` also ``(batch|1, seq, axes)`` coordinates) fit ``x``
    ``(batch, heads, seq, head_dim)``. Shapes only: no value is read, so no device sync.
    """
    batch, seq = x.shape[0], x.shape[-2]
    if isinstance(positions, range):
        ok, got = len(positions) == seq and positions.step == 1, f"{positions}"
    elif not isinstance(positions, torch.Tensor):  # a list: the hooks take no other kind
        ok, got = False, type(positions).__name__
    else:
        shape = tuple(positions.shape)
        if axes > 1 and positions.dim() == 3 and shape[2] != axes:
            raise ValueError(f"{name} must have n_axes={axes} coordinates, got shape {shape}")
        grid = axes > 1 and positions.dim() == 3
        ok = (positions.dim() == 2 or grid) and shape[1] == seq and shape[0] in (1, batch)
        got = shape
    if not ok:
        also = "" if axes == 1 else f" or (batch|1, seq, n_axes={axes})"
        raise ValueError(
            f"{name} must be a range of {seq} or have shape (batch|1, seq){also} with batch "
            f"{batch} and seq {seq}, got {got}"
        )


def len_of(positions) -> int:
    """Number of positions in a ``range`` or a ``(b|1, seq)`` / ``(b|1, seq, n_axes)`` tensor."""
    return len(positions) if isinstance(positions, range) else positions.shape[1]
