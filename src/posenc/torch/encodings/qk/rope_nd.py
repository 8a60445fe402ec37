"""RoPE over grids in torch: axial RoPE and M-RoPE, acting on the queries and keys.

Positions reach the hooks as ``(batch|1, seq, n_axes)`` integer coordinates (``(row,
column)``, M-RoPE's ``(time, height, width)``) or, for text, as 1-D positions read as the
point ``(p, ..., p)``. :class:`~posenc.torch.KVCache`'s default positions continue after each
row's largest coordinate (Qwen2-VL's rule for text after an image). The rotation is RoPE's
kernel (``rotate_qk``) fed with a gathered ``[cos, sin]`` table: pair ``j`` reads the row
of its own axis' coordinate. Tables are derived state, as for RoPE.
"""

from __future__ import annotations

import torch

import posenc
from posenc._checks import check_dim, check_int
from posenc.hf import axial_from_hf, mrope_from_hf
from posenc.hf.whole import check_one_rope
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.encodings.checks import check_hook, check_pairing
from posenc.torch.kernels import cos_sin, rotate_qk
from posenc.torch.position_values import check_values
from posenc.torch.positions import position_arg

__all__ = ["AxialRotaryEmbedding", "MRoPE"]


def check_axes(positions, n_axes):
    """Raise ``ValueError`` unless grid coordinates have ``n_axes`` components."""
    if not isinstance(positions, range) and positions.dim() == 3 and positions.shape[2] != n_axes:
        shape = tuple(positions.shape)
        raise ValueError(f"positions must have n_axes={n_axes} coordinates, got shape {shape}")


class _GridRotary(PositionalEncoding):
    """RoPE whose pair ``j`` turns with coordinate ``axis[j]`` at rate ``inv_freq[j]``."""

    _DERIVED = ("cos_sin", "axis")

    def _setup(self, head_dim, inv, axis, n_axes, pairing, max_len):
        self.head_dim = check_dim("head_dim", head_dim)
        self.pairing = check_pairing(pairing)
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.n_axes = self.position_axes = n_axes
        self._inv, self._axis = inv, axis  # NumPy: float64 rates, int64 axes, (rotary_dim // 2,)
        self._register_derived()

    def _derived_tensors(self):
        return {
            "cos_sin": self._cos_sin_now("cpu", torch.float32),  # (max_len, r // 2, 2)
            "axis": torch.from_numpy(self._axis),  # (r // 2,)
        }

    def _cos_sin_now(self, device, dtype):
        pos = torch.arange(self.max_len, device=device)
        return cos_sin(pos, torch.from_numpy(self._inv).to(device), 1.0, dtype)

    def table(self, positions, dtype=torch.float32):
        """``[cos, sin]`` of every pair at ``positions``: ``(b|1, seq, rotary_dim // 2, 2)``.

        Parameters
        ----------
        positions : torch.Tensor or range
            Int64 ``(b|1, seq, n_axes)`` coordinates, or 1-D positions (``(b|1, seq)`` or a
            ``range``) meaning ``(p, ..., p)``.
        dtype : torch.dtype
            Dtype of the tensors to rotate; the table is float64 for float64, else float32.

        Returns
        -------
        torch.Tensor
            ``cs[..., j, :] = [cos, sin](p[axis[j]] * inv_freq[j])``.
        """
        check_axes(positions, self.n_axes)
        return self._lookup(check_values("positions", positions, self.max_len), dtype)

    def _lookup(self, positions, dtype, device=None):
        """:meth:`table` for positions already checked (the hook checks them once)."""
        if device is not None:  # a hook's input: tables still on meta after a load are built
            self._materialize(device)
        table = self.cos_sin  # (max_len, r // 2, 2)
        if dtype == torch.float64:  # float64 angles, kept float64
            table = self._cos_sin_now(table.device, torch.float64)
        if isinstance(positions, range):  # text, contiguous: a slice
            return table[positions.start : positions.stop][None]  # (1, seq, r // 2, 2)
        positions = positions.to(table.device)
        if positions.dim() == 2:  # text: every axis at p
            return table[positions]  # (b|1, seq, r // 2, 2)
        pair = torch.arange(table.shape[1], device=table.device)  # (r // 2,)
        return table[positions[..., self.axis], pair]  # (b|1, seq, r // 2, 2)

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        """Rotate ``q`` and ``k`` by their coordinates (``k`` may have fewer heads).

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq_q, head_dim)``.
        k : torch.Tensor
            Keys, ``(batch, kv_heads, seq_k, head_dim)``.
        q_positions : torch.Tensor or range
            ``(batch|1, seq_q, n_axes)`` coordinates, or 1-D positions.
        k_positions : torch.Tensor or range
            ``(batch|1, seq_k, n_axes)`` coordinates, or 1-D positions.
        inplace : bool
            Write the rotation into ``q`` and ``k`` (plain eager inference only).

        Returns
        -------
        q : torch.Tensor
            Rotated queries.
        k : torch.Tensor
            Rotated keys.
        """
        q_positions, k_positions = check_hook(
            q, k, q_positions, k_positions, head_dim=self.head_dim, axes=self.n_axes,
            stop=self.max_len,
        )  # fmt: skip
        cs_q = self._lookup(q_positions, q.dtype, q.device)  # (b|1, seq_q, r // 2, 2)
        same = q_positions is k_positions and q.dtype == k.dtype
        cs_k = cs_q if same else self._lookup(k_positions, k.dtype, k.device)  # (b|1, sk, ·)
        # one launch for q and k where the kernel allows it (as RoPE and xPos)
        return rotate_qk(q, k, cs_q[:, None], cs_k[:, None], self.pairing, inplace=inplace)

    def forward(self, q, k, positions=None):
        """Rotate ``q`` and ``k`` that share positions; returns the rotated pair.

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq, head_dim)``.
        k : torch.Tensor
            Keys, ``(batch, kv_heads, seq, head_dim)``.
        positions : torch.Tensor or range, optional
            ``(batch|1, seq, n_axes)`` coordinates, or 1-D positions ``(seq,)`` /
            ``(batch, seq)``; default ``0 .. seq - 1`` on every axis.

        Returns
        -------
        q : torch.Tensor
            Rotated queries, new tensor.
        k : torch.Tensor
            Rotated keys, new tensor.
        """
        if q.dim() != 4 or k.dim() != 4 or q.shape[2] != k.shape[2]:
            raise ValueError(
                f"q and k must be 4-D with the same seq, got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        pos = position_arg(positions, q.shape[0], q.shape[2], axes=self.position_axes)
        return self.encode_qk(q, k, pos, pos)


class AxialRotaryEmbedding(_GridRotary):
    """Axial RoPE: ``n_axes`` blocks of rotary pairs, each a full RoPE of one coordinate.

    The torch twin of :func:`posenc.rope_nd` with :func:`posenc.axial_frequencies`
    (``freqs_for="lang"``: integer coordinates). With ``pairing="interleaved"`` the layout
    is rotary-embedding-torch's ``get_axial_freqs`` (EVA-02): dims ``0 .. head_dim / n_axes``
    turn with the first coordinate, the next block with the second, and so on.

    Parameters
    ----------
    head_dim : int
        Width of one head; a multiple of ``2 * n_axes``.
    n_axes : int
        Coordinates per token (2: ``(row, column)``).
    base : float
        The RoPE base of every axis.
    pairing : {"half", "interleaved"}
        Which dims form a pair.
    max_len : int
        Table size: every coordinate must be ``< max_len``.

    Examples
    --------
    >>> import torch, posenc
    >>> from posenc.torch import AxialRotaryEmbedding
    >>> rope2d = AxialRotaryEmbedding(8, max_len=16)
    >>> pos = torch.from_numpy(posenc.grid_positions(3, 4))[None]  # (1, 12, 2): (row, column)
    >>> q, k = torch.ones(1, 4, 12, 8), torch.ones(1, 2, 12, 8)
    >>> [t.shape for t in rope2d(q, k, pos)]
    [torch.Size([1, 4, 12, 8]), torch.Size([1, 2, 12, 8])]
    """

    def __init__(self, head_dim, *, n_axes=2, base=10_000.0, pairing="half", max_len=1024):
        super().__init__()
        inv, axis = posenc.axial_frequencies(head_dim, n_axes, base=base)  # validates
        self.base = float(base)
        self._setup(head_dim, inv, axis, int(n_axes), pairing, max_len)

    @classmethod
    def from_hf(cls, config, **overrides):
        """Build the 2-D RoPE of a vision encoder's config (``rope_type: "axial"``).

        Parameters
        ----------
        config : dict or object
            A vision config, read by :func:`posenc.hf.axial_from_hf`.
        **overrides
            Keyword arguments replacing what the config gives (e.g. ``max_len``).

        Returns
        -------
        AxialRotaryEmbedding
            Coordinates ``(row, column)`` of each patch.
        """
        return cls(**(axial_from_hf(config) | overrides))

    def extra_repr(self):
        return (
            f"head_dim={self.head_dim}, n_axes={self.n_axes}, base={self.base}, "
            f"pairing={self.pairing!r}, max_len={self.max_len}"
        )


class MRoPE(_GridRotary):
    """Multimodal RoPE (Qwen2-VL): one RoPE spectrum, its pairs split by ``sections``.

    The torch twin of :func:`posenc.rope_nd` with :func:`posenc.mrope_frequencies`.
    Coordinates are ``(time, height, width)`` (:func:`posenc.mrope_positions` builds them
    for a text + image + video sequence); text tokens may be given 1-D positions ``p``,
    which mean ``(p, p, p)`` and give exactly :class:`~posenc.torch.RotaryEmbedding`.

    Parameters
    ----------
    head_dim : int
        Width of one head.
    sections : sequence of int
        Pairs per axis (Qwen2-VL's ``mrope_section``, e.g. ``(16, 24, 24)``); they sum to
        ``rotary_dim // 2``.
    base : float
        The RoPE base (Qwen2-VL: 1e6).
    interleaved : bool
        Qwen3-VL's interleaved sections instead of consecutive blocks.
    pairing : {"half", "interleaved"}
        Which dims form a pair (Qwen: ``"half"``, GLM-4V: ``"interleaved"``).
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` dims, at the rates of a ``rotary_dim``-wide
        RoPE (Qwen3.5: a quarter of the head); default the whole head.
    max_len : int
        Table size: every coordinate must be ``< max_len``.

    Examples
    --------
    >>> import torch, posenc
    >>> from posenc.torch import MRoPE
    >>> mrope = MRoPE(16, sections=(2, 3, 3), max_len=64)
    >>> pos = torch.from_numpy(posenc.mrope_positions([2, (1, 2, 2), 1]))[None]  # (1, 7, 3)
    >>> q = k = torch.ones(1, 1, 7, 16)
    >>> mrope(q, k, pos)[0].shape
    torch.Size([1, 1, 7, 16])
    """

    def __init__(self, head_dim, *, sections, base=10_000.0, interleaved=False, pairing="half",
                 rotary_dim=None, max_len=4096):  # fmt: skip
        super().__init__()
        head_dim = check_dim("head_dim", head_dim)
        rotary = head_dim if rotary_dim is None else check_dim("rotary_dim", rotary_dim)
        if rotary > head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
        # validates sections (summing to rotary // 2) and base
        inv, axis = posenc.mrope_frequencies(rotary, sections, base=base, interleaved=interleaved)
        self.sections, self.base = tuple(int(s) for s in sections), float(base)
        self.interleaved, self.rotary_dim = bool(interleaved), rotary
        self._setup(head_dim, inv, axis, len(self.sections), pairing, max_len)

    @classmethod
    def from_hf(cls, config, *, layer_type=None, **overrides):
        """Build M-RoPE as a model's rotary class lays it out (:func:`posenc.hf.mrope_from_hf`).

        A config whose layers need more than this one M-RoPE (sets that differ by layer type,
        attention layers without RoPE) is refused: :meth:`Schedule.from_hf
        <posenc.torch.Schedule.from_hf>` builds every layer's.

        Parameters
        ----------
        config : dict or object
            A parsed ``config.json`` (its ``text_config`` if it has one) or a
            ``transformers`` config object.
        layer_type : str, optional
            The layer type to build, where the rope parameters are given per layer type.
        **overrides
            Keyword arguments replacing what the config gives.

        Examples
        --------
        >>> from posenc.torch import MRoPE
        >>> cfg = {"hidden_size": 1536, "num_attention_heads": 12, "rope_theta": 1e6,
        ...        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
        >>> MRoPE.from_hf(cfg)
        MRoPE(head_dim=128, rotary_dim=128, sections=(16, 24, 24), base=1000000.0, interleaved=False, pairing='half', max_len=4096)
        """  # noqa: E501
        check_one_rope(config, layer_type=layer_type, mrope=True)
        return cls(**(mrope_from_hf(config, layer_type=layer_type) | overrides))

    def extra_repr(self):
        keys = ("head_dim", "rotary_dim", "sections", "base", "interleaved", "pairing", "max_len")
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in keys)
