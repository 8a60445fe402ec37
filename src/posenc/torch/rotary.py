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
from posenc.torch._rope_kernels import (
    _check_out,
    _complex_mul,
    _complex_view_ok,
    _cos_sin,
    _rotate,
)
from posenc.torch.base import PositionalEncoding, as_positions

__all__ = ["apply_rope", "RotaryEmbedding"]


def _check_pairing(pairing):
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    return pairing


def _tables_for(positions, head_dim, base, scaling, rotary_dim, seq_len, dtype):
    """cos, sin ``(b|1, seq, r // 2)`` computed now; ``seq_len`` defaults to max position + 1."""
    if seq_len is None:
        seq_len = int(positions.max()) + 1 if positions.numel() else 0
    inv, scale = posenc.rope_frequencies(
        head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim, seq_len=seq_len
    )
    return _cos_sin(positions, torch.from_numpy(inv).to(positions.device), scale, dtype)


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
    out : torch.Tensor, optional
        Preallocated result (same shape and dtype as ``x``, not overlapping it). Reusing
        one buffer avoids allocating (and page-faulting) a fresh output every call.

    Returns
    -------
    torch.Tensor
        Same shape and dtype as ``x`` (``out`` if given).

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
    cos, sin = _tables_for(pos, x.shape[-1], base, scaling, rotary_dim, seq_len, x.dtype)
    return _rotate(x, cos[:, None], sin[:, None], pairing, out)  # cos: (b|1, 1, seq, r // 2)


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
        if self.pairing == "interleaved":  # the complex form used by the fast kernels
            self.register_buffer("cis", torch.complex(cos, sin), persistent=False)

    def _tables(self, positions, seq, dtype):
        """cos, sin ``(b|1, seq, r // 2)`` for int positions ``(b|1, seq)`` (None: 0 .. seq-1)."""
        if self.dynamic:
            pos = (
                torch.arange(seq, device=self.cos.device)[None] if positions is None else positions
            )
            return _tables_for(
                pos, self.head_dim, self.base, self.scaling, self.rotary_dim, None, dtype
            )
        last = seq - 1 if positions is None else (int(positions.max()) if positions.numel() else 0)
        if last >= self.max_len:
            raise ValueError(f"positions must be < max_len={self.max_len}, got {last}")
        if positions is None:  # the common case: a slice, no gather
            return self.cos[None, :seq].to(dtype), self.sin[None, :seq].to(dtype)
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)

    def _check(self, q, k):
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
        self._check(q, k)
        cos, sin = self._tables(q_positions, q.shape[2], q.dtype)  # (b|1, seq_q, r // 2)
        q = _rotate(q, cos[:, None], sin[:, None], self.pairing)
        if k_positions is not q_positions:
            cos, sin = self._tables(k_positions, k.shape[2], k.dtype)  # (b|1, seq_k, r // 2)
        return q, _rotate(k, cos[:, None], sin[:, None], self.pairing)

    def rope(self, q, k, positions=None, *, out=None):
        """Rotate ``q`` and ``k`` that share positions (``(seq,)`` or ``(batch, seq)``).

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq, head_dim)``.
        k : torch.Tensor
            Keys, same shape as ``q``.
        positions : torch.Tensor, optional
            Default ``0 .. seq - 1`` (read from the cache without a gather).
        out : tuple of torch.Tensor, optional
            Preallocated ``(q_out, k_out)``, each shaped like ``q`` and not overlapping the
            inputs: the allocation-free path for inference loops.

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
        self._check(q, k)
        if positions is not None:
            positions = as_positions(positions, q.shape[0], q.shape[2], device=q.device)
        q_out, k_out = (None, None) if out is None else out
        if out is not None and {q_out.data_ptr(), k_out.data_ptr()} & {q.data_ptr(), k.data_ptr()}:
            raise ValueError("out must not share memory with the input")
        training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
        if positions is None and self.pairing == "interleaved" and not (self.dynamic or training):
            fast = self._rope_complex(q, k, q_out, k_out)
            if fast is not None:
                return fast
        cos, sin = self._tables(positions, q.shape[2], q.dtype)  # (b|1, seq, r // 2)
        cos, sin = cos[:, None], sin[:, None]  # (b|1, 1, seq, r // 2)
        cis = None
        if positions is None and not self.dynamic and self.pairing == "interleaved":
            cis = self.cis[None, None, : q.shape[2]]  # (1, 1, seq, r // 2), cached
        return (
            _rotate(q, cos, sin, self.pairing, q_out, cis),
            _rotate(k, cos, sin, self.pairing, k_out, cis),
        )

    def _rope_complex(self, q, k, q_out, k_out):
        """Shortcut of ``_rotate`` for default positions, interleaved float32/64, full width:
        the cached complex table and nothing else (saves the per-call table slicing)."""
        seq, h = q.shape[2], self.rotary_dim // 2
        if self.rotary_dim != self.head_dim or seq > self.max_len:
            return None
        q_out = torch.empty_like(q) if q_out is None else _check_out(q, q_out)
        k_out = torch.empty_like(k) if k_out is None else _check_out(k, k_out)
        if not all(map(_complex_view_ok, (q, k, q_out, k_out))):
            return None
        cis = self.cis[:seq]  # (seq, r // 2)
        _complex_mul(q, q_out, cis, h)
        _complex_mul(k, k_out, cis, h)
        return q_out, k_out

    def extra_repr(self):
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"pairing={self.pairing!r}, max_len={self.max_len}"
        )
