"""RoPE in torch: a functional ``apply_rope`` and the ``RotaryEmbedding`` encoding (queries/keys).

Angles are computed in float64 from integer positions and only then rounded: cos/sin
are float32 (float64 for float64 inputs), so bfloat16/float16 inputs never see angles
computed in low precision. Shape legend: ``x``, ``q``, ``k`` are
``(batch, heads, seq, head_dim)``; positions ``(seq,)`` or ``(batch, seq)``.
"""

from __future__ import annotations

import torch

import posenc
from posenc._checks import check_int
from posenc.rotary import PAIRINGS
from posenc.torch.base import PositionalEncoding, as_positions

__all__ = ["apply_rope", "RotaryEmbedding", "interleaved_to_half", "half_to_interleaved"]


def _cos_sin(positions, inv_freq, scale, dtype):
    """cos, sin of ``positions * inv_freq``: float64 angles, rounded to ``dtype``."""
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (b|1, seq, r // 2)
    return (scale * angles.cos()).to(dtype), (scale * angles.sin()).to(dtype)


def _rotate(x, cos, sin, pairing):
    """Rotate the first ``2 * cos.shape[-1]`` dims of ``x`` (..., seq, head_dim)."""
    half = cos.shape[-1]
    r = 2 * half
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xr = x[..., :r].to(work)
    if pairing == "half":
        a, b = xr[..., :half], xr[..., half:]  # (..., seq, r // 2) each
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
    ra, rb = a * cos - b * sin, b * cos + a * sin
    rotated = (
        torch.cat([ra, rb], -1) if pairing == "half" else torch.stack([ra, rb], -1).flatten(-2)
    )
    return (
        torch.cat([rotated.to(x.dtype), x[..., r:]], -1) if r < x.shape[-1] else rotated.to(x.dtype)
    )


def _check_pairing(pairing):
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    return pairing


def apply_rope(
    x, positions=None, *, base=10_000.0, pairing="half", scaling=None, rotary_dim=None, seq_len=None
):
    """Rotate ``x`` of shape ``(batch, heads, seq, head_dim)`` by position (RoPE).

    The torch twin of :func:`posenc.rope`, tested against it.

    Parameters
    ----------
    x : torch.Tensor
        Queries or keys, ``(batch, heads, seq, head_dim)``.
    positions : torch.Tensor, optional
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

    Returns
    -------
    torch.Tensor
        Same shape and dtype as ``x``.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import apply_rope
    >>> apply_rope(torch.tensor([[[[1.0, 0.0]]]]), torch.tensor([1]))
    tensor([[[[0.5403, 0.8415]]]])
    """
    if x.dim() != 4:
        raise ValueError(f"x must have shape (batch, heads, seq, head_dim), got {tuple(x.shape)}")
    _check_pairing(pairing)
    pos = as_positions(positions, x.shape[0], x.shape[2], device=x.device)  # (b|1, seq)
    if seq_len is None:
        seq_len = int(pos.max()) + 1 if pos.numel() else 0
    inv, scale = posenc.rope_frequencies(
        x.shape[-1], base=base, scaling=scaling, rotary_dim=rotary_dim, seq_len=seq_len
    )
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = _cos_sin(pos, torch.from_numpy(inv).to(x.device), scale, dtype)
    return _rotate(x, cos[:, None], sin[:, None], pairing)  # cos: (b|1, 1, seq, r // 2)


class RotaryEmbedding(PositionalEncoding):
    """RoPE as an encoding of the attention core: rotates queries and keys.

    cos/sin tables for positions ``0 .. max_len - 1`` are computed once (float64 angles,
    stored as float32 non-persistent buffers) and gathered by position at run time.
    Length-dependent scalings (``DynamicNTK``, ``LongRoPE``) are recomputed per call
    from the largest position instead.

    Parameters
    ----------
    head_dim : int
        Width of one head; even.
    base : float
        The RoPE base.
    pairing : {"half", "interleaved"}
        Which dims form a pair.
    scaling : posenc.scaling.Scaling, optional
        A scaling from :mod:`posenc.scaling`.
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` dims.
    max_len : int
        Table size; positions ``>= max_len`` raise :class:`ValueError`.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import RotaryEmbedding
    >>> rope = RotaryEmbedding(8, max_len=16)
    >>> q = k = torch.ones(1, 2, 3, 8)
    >>> qr, kr = rope.rope(q, k)
    >>> qr.shape, rope.places
    (torch.Size([1, 2, 3, 8]), ('qk',))
    """

    def __init__(
        self,
        head_dim,
        *,
        base=10_000.0,
        pairing="half",
        scaling=None,
        rotary_dim=None,
        max_len=4096,
    ):
        super().__init__()
        self.pairing = _check_pairing(pairing)
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        inv, self.scale = posenc.rope_frequencies(
            head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim
        )
        self.rotary_dim = 2 * inv.shape[0]
        self.dynamic = bool(getattr(scaling, "length_dependent", False))
        cos, sin = _cos_sin(
            torch.arange(self.max_len), torch.from_numpy(inv), self.scale, torch.float32
        )  # (max_len, rotary_dim // 2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, positions, dtype):  # positions: (b|1, seq)
        if self.dynamic:
            inv, scale = posenc.rope_frequencies(
                self.head_dim,
                base=self.base,
                scaling=self.scaling,
                rotary_dim=self.rotary_dim,
                seq_len=int(positions.max()) + 1,
            )
            return _cos_sin(positions, torch.from_numpy(inv).to(positions.device), scale, dtype)
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(
                f"positions must be < max_len={self.max_len}, got {int(positions.max())}"
            )
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)

    def encode_qk(self, q, k, q_positions, k_positions):
        """Rotate ``q`` and ``k`` (``(batch, heads, seq, head_dim)``) by their positions.

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq_q, head_dim)``.
        k : torch.Tensor
            Keys, ``(batch, heads, seq_k, head_dim)``.
        q_positions : torch.Tensor
            Int64 ``(batch|1, seq_q)``.
        k_positions : torch.Tensor
            Int64 ``(batch|1, seq_k)``.

        Returns
        -------
        q : torch.Tensor
            Rotated queries.
        k : torch.Tensor
            Rotated keys.
        """
        for name, t in (("q", q), ("k", k)):
            if t.dim() != 4 or t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} must have shape (batch, heads, seq, head_dim="
                    f"{self.head_dim}), got {tuple(t.shape)}"
                )
        if q.shape[:2] != k.shape[:2]:
            raise ValueError(
                f"q and k must share (batch, heads), got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        out = []
        for t, pos in ((q, q_positions), (k, k_positions)):
            cos, sin = self._tables(pos, work)  # (b|1, seq, r // 2)
            out.append(_rotate(t, cos[:, None], sin[:, None], self.pairing))
        return out[0], out[1]

    def rope(self, q, k, positions=None):
        """Rotate ``q`` and ``k`` that share positions (``(seq,)`` or ``(batch, seq)``).

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq, head_dim)``.
        k : torch.Tensor
            Keys, same shape as ``q``.
        positions : torch.Tensor, optional
            Default ``0 .. seq - 1``.

        Returns
        -------
        q : torch.Tensor
            Rotated queries.
        k : torch.Tensor
            Rotated keys.
        """
        if q.shape != k.shape:
            raise ValueError(
                f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        pos = as_positions(positions, q.shape[0], q.shape[2], device=q.device)
        return self.encode_qk(q, k, pos, pos)

    def extra_repr(self):
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"pairing={self.pairing!r}, max_len={self.max_len}"
        )


def _pairing_permutation(head_dim, rotary_dim):
    r = head_dim if rotary_dim is None else rotary_dim
    perm = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, head_dim)])
    return perm  # new dim i takes old dim perm[i]


def _permute_rows(weight, head_dim, perm):
    """Reorder the rows of every head of a ``(heads * head_dim, dim)`` weight by ``perm``."""
    if weight.shape[0] % head_dim:
        raise ValueError(
            f"weight rows must be a multiple of head_dim={head_dim}, got {weight.shape[0]}"
        )
    w = weight.reshape(-1, head_dim, *weight.shape[1:])  # (heads, head_dim, ...)
    return w[:, perm].reshape(weight.shape)


def interleaved_to_half(weight, *, head_dim, rotary_dim=None):
    """Reorder q/k projection rows so an interleaved-RoPE checkpoint runs with ``pairing="half"``.

    Parameters
    ----------
    weight : torch.Tensor
        A q or k projection weight, ``(heads * head_dim, dim)`` (``nn.Linear`` layout).
    head_dim : int
        Width of one head.
    rotary_dim : int, optional
        Rotated width (default ``head_dim``); the tail is left in place.

    Returns
    -------
    torch.Tensor
        The reordered weight. Scores ``q . k`` are unchanged, because q and k are
        permuted alike.
    """
    return _permute_rows(weight, head_dim, _pairing_permutation(head_dim, rotary_dim))


def half_to_interleaved(weight, *, head_dim, rotary_dim=None):
    """Inverse of :func:`interleaved_to_half`.

    Parameters
    ----------
    weight : torch.Tensor
        A q or k projection weight, ``(heads * head_dim, dim)``.
    head_dim : int
        Width of one head.
    rotary_dim : int, optional
        Rotated width (default ``head_dim``).

    Returns
    -------
    torch.Tensor
        The reordered weight.
    """
    perm = torch.argsort(_pairing_permutation(head_dim, rotary_dim))
    return _permute_rows(weight, head_dim, perm)
