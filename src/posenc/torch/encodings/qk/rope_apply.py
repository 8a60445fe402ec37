"""RoPE as a function: ``apply_rope`` rotates one tensor by its positions, no module state.

The torch twin of :func:`posenc.rope`: angles are float64 products of integer positions and
rates, the rotation is computed in float32 (float64 for float64) and rounded once to the
input's dtype. Shape legend: ``x`` is ``(batch, heads, seq, head_dim)``; positions
``(seq,)`` or ``(batch, seq)``.
"""

from __future__ import annotations

from dataclasses import is_dataclass

import torch

import posenc
from posenc._checks import check_int
from posenc.torch.encodings.checks import check_float, check_pairing
from posenc.torch.encodings.qk.rope_dynamic import _table_now, settings_key
from posenc.torch.encodings.qk.rope_tables import _table_dtype
from posenc.torch.kernels import cos_sin, rotate
from posenc.torch.positions import position_arg, position_tensor

__all__ = ["apply_rope"]


def apply_rope(
    x,
    positions=None,
    *,
    base=10_000.0,
    pairing="half",
    scaling=None,
    rotary_dim=None,
    seq_len=None,
    out=None,
):
    """Rotate ``x`` of shape ``(batch, heads, seq, head_dim)`` by position (RoPE).

    The torch twin of :func:`posenc.rope`, tested against it.

    Parameters
    ----------
    x : torch.Tensor
        Queries or keys, ``(batch, heads, seq, head_dim)``.
    positions : torch.Tensor or range, optional
        Int positions ``(seq,)`` or ``(batch, seq)`` (per row, e.g. left padding or a KV
        cache offset); default ``0 .. seq - 1``.
    base : float
        The RoPE base.
    pairing : {"half", "interleaved"}
        Which dims form a pair.
    scaling : posenc.scaling.Scaling, optional
        A scaling from :mod:`posenc.scaling`.
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` dims.
    seq_len : int, optional
        Length fed to length-dependent scalings; default ``max(positions) + 1``.
    out : torch.Tensor, optional
        Preallocated result (same shape and dtype as ``x``, not overlapping it). Reusing
        one buffer avoids allocating (and page-faulting) a fresh output every call. Plain
        eager inference only (``ValueError`` under autograd, ``torch.compile`` or ``torch.func``).

    Returns
    -------
    torch.Tensor
        Same shape and dtype as ``x`` (``out`` if given).

    Notes
    -----
    Differentiable, and composable with ``torch.compile``, ``torch.func.vmap``, ``grad``
    and ``jacfwd``: those use a plain tensor expression, while eager inference uses
    allocation-free kernels. bfloat16/float16 inputs are rotated in float32 and rounded once.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import apply_rope
    >>> apply_rope(torch.tensor([[[[1.0, 0.0]]]]), torch.tensor([1]))
    tensor([[[[0.5403, 0.8415]]]])
    """
    if x.dim() != 4:
        raise ValueError(f"x must have shape (batch, heads, seq, head_dim), got {tuple(x.shape)}")
    check_pairing(pairing)
    check_float("x", x)
    inv, scale = posenc.rope_frequencies(
        x.shape[-1], base=base, scaling=scaling, rotary_dim=rotary_dim
    )  # validates
    pos = position_arg(positions, x.shape[0], x.shape[2])  # range or (b|1, seq)
    if scaling is None or getattr(scaling, "length_dependent", False) or is_dataclass(scaling):
        key = settings_key(x.shape[-1], base, scaling, rotary_dim)  # through one op: traceable
        length_from = pos
        if seq_len is not None:  # a length given: the table reads max + 1 = seq_len
            seq_len = check_int("seq_len", seq_len, minimum=1)
            length_from = range(seq_len - 1, seq_len)
        cs = _table_now(pos, length_from, x.device, key, _table_dtype(x.dtype))  # (b|1, s, ·)
    else:  # a fixed scaling of the user's own: its rates, now
        inv = torch.from_numpy(inv).to(x.device)
        cs = cos_sin(position_tensor(pos, x.device), inv, scale, _table_dtype(x.dtype))
    return rotate(x, cs[:, None], pairing, out=out)  # cs broadcast over heads
