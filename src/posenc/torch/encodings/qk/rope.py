"""RoPE in torch: the ``RotaryEmbedding`` encoding of the queries and keys.

Angles are computed in float64 from integer positions and only then rounded: the cos/sin
tables are float32 (float64 for float64 inputs) whatever the module's or the input's dtype,
the rotation is computed in that precision and the result rounded once to the input's
dtype. Shape legend: ``q`` is ``(batch, heads, seq, head_dim)``, ``k`` is
``(batch, kv_heads, seq, head_dim)``; positions ``(seq,)`` or ``(batch, seq)``.
"""

from __future__ import annotations

import torch

import posenc
from posenc._checks import check_int
from posenc.hf import from_hf
from posenc.hf.whole import check_one_rope
from posenc.torch.encodings.checks import check_hook, check_pairing, check_qk
from posenc.torch.encodings.qk.rope_dynamic import settings_key
from posenc.torch.encodings.qk.rope_tables import RopeTables
from posenc.torch.kernels import rotate_qk
from posenc.torch.position_values import check_values, joined, known_bounds, remember_bounds
from posenc.torch.positions import (
    position_arg,
    position_tensor,
)

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(RopeTables):
    """RoPE as an encoding of the attention core: rotates queries and keys.

    The ``[cos, sin]`` table (float64 angles, stored float32) is derived state: a
    non-persistent buffer, never in ``state_dict``, kept exact through ``.to()``,
    ``.half()``, device moves, ``to_empty()`` and meta-device loading. It starts with the
    first 4096 positions and grows (doubling, up to ``max_len``) to the largest position
    used, so a million-position model costs what it uses; it is sliced (default
    positions) or gathered (explicit ones) at run time. float64 inputs, and compiled or
    vmapped calls, get cos/sin computed for their positions. The settings are plain
    values, so a pickled or saved module works in any process. Length-dependent scalings
    (``DynamicNTK``, ``LongRoPE``) are recomputed per call from the largest position, for
    queries and keys alike, and so a KV cache keeps raw keys for them
    (:attr:`caches_encoded_keys`).

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
    >>> q, k = torch.ones(1, 4, 3, 8), torch.ones(1, 2, 3, 8)  # 4 query heads, 2 key heads
    >>> qr, kr = rope(q, k)
    >>> qr.shape, kr.shape, rope.places
    (torch.Size([1, 4, 3, 8]), torch.Size([1, 2, 3, 8]), ('qk',))
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
        self.pairing = check_pairing(pairing)
        self.max_len = check_int("max_len", max_len, minimum=1)
        inv, self.scale = posenc.rope_frequencies(
            head_dim, base=base, scaling=scaling, rotary_dim=rotary_dim
        )  # validates head_dim, base, scaling, rotary_dim
        self.head_dim, self.base, self.scaling = int(head_dim), float(base), scaling
        self.rotary_dim = 2 * inv.shape[0]
        self.dynamic = bool(getattr(scaling, "length_dependent", False))
        # a length-dependent scaling's settings as a value (pickles, the same in any process)
        self._key = (
            settings_key(self.head_dim, self.base, scaling, self.rotary_dim)
            if self.dynamic
            else None
        )
        self._register_derived()

    @classmethod
    def from_hf(cls, config, *, layer_type=None, **overrides):
        """Build RoPE from a Hugging Face ``config.json`` (a dict) or config object.

        Parameters
        ----------
        config : dict or object
            A parsed ``config.json`` or a ``transformers`` config object, read by
            :func:`posenc.hf.from_hf` with HF's rules and defaults.
        layer_type : str, optional
            The layer type whose rope parameters to read, where they are nested per layer
            type (Gemma 3); :meth:`Schedule.from_hf <posenc.torch.Schedule.from_hf>` builds
            every layer's.
        **overrides
            Keyword arguments replacing what the config gives (e.g. ``pairing``,
            ``max_len``).

        Returns
        -------
        RotaryEmbedding
            With the model's pairing: ``"interleaved"`` where its code rotates adjacent
            pairs (GLM-4, Cohere, DeepSeek-V3), else ``"half"`` (HF's ``rotate_half``).

        Raises
        ------
        ValueError
            Where the layers (of ``layer_type``) need more than this one RoPE, which it
            would drop silently: a query temperature (Llama 4, Ministral 3), the trailing
            channels of a ``[nope | rope]`` head (DeepSeek, Mistral 4), attention layers
            without RoPE, sets that differ by layer, M-RoPE (``MRoPE.from_hf``). The
            message names :meth:`Schedule.from_hf <posenc.torch.Schedule.from_hf>`.

        Examples
        --------
        >>> from posenc.torch import RotaryEmbedding
        >>> cfg = {"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
        ...        "max_position_embeddings": 8192}
        >>> RotaryEmbedding.from_hf(cfg)
        RotaryEmbedding(head_dim=128, rotary_dim=128, base=500000.0, pairing='half', max_len=8192)
        """
        kwargs = from_hf(config, layer_type=layer_type, pairing=overrides.get("pairing"))
        mine = {k: v for k, v in kwargs.items() if k not in overrides}  # the config's own
        check_one_rope(config, layer_type=layer_type, built=mine, pairing=overrides.get("pairing"))
        return cls(**(kwargs | overrides))

    @property
    def caches_encoded_keys(self) -> bool:
        """False for length-dependent scalings: keys are re-rotated with each step's table."""
        return not self.dynamic

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        """Rotate ``q`` and ``k`` by their positions (``k`` may have fewer heads).

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq_q, head_dim)``.
        k : torch.Tensor
            Keys, ``(batch, kv_heads, seq_k, head_dim)``.
        q_positions : torch.Tensor or range
            Int64 ``(batch|1, seq_q)`` or a ``range``.
        k_positions : torch.Tensor or range
            Int64 ``(batch|1, seq_k)`` or a ``range``.
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
            q, k, q_positions, k_positions, head_dim=self.head_dim, stop=self.max_len
        )
        same = q_positions is k_positions or (
            isinstance(q_positions, range) and q_positions == k_positions
        )
        length_from = None  # one length for queries and keys: the last position + 1
        if self.dynamic and not same:
            both = (q_positions, k_positions)
            length_from = torch.cat([position_tensor(p, q.device).flatten() for p in both])
            known = [known_bounds(p) for p in both]
            hi = joined(*known)  # the largest, where the host knows it: nothing to read back
            if hi is not None:
                remember_bounds(length_from, min(b[0] for b in known), hi)
        cs = self._rows(q_positions, q.dtype, length_from, q.device)  # (b|1, 1, sq, r/2, 2)
        cs_k = cs
        if not same:
            cs_k = self._rows(k_positions, k.dtype, length_from, k.device)
        return rotate_qk(q, k, cs, cs_k, self.pairing, inplace=inplace)

    def forward(self, q, k, positions=None):
        """Rotate ``q`` and ``k`` that share positions; returns the rotated pair.

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq, head_dim)``.
        k : torch.Tensor
            Keys, ``(batch, kv_heads, seq, head_dim)``.
        positions : torch.Tensor or range, optional
            ``(seq,)`` or ``(batch, seq)``; default ``0 .. seq - 1``.

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
        pos = position_arg(positions, q.shape[0], q.shape[2])
        return self.encode_qk(q, k, pos, pos)

    def rope(self, q, k, positions=None, *, out=None):
        """Rotate ``q`` and ``k`` that share positions, optionally into preallocated buffers.

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq, head_dim)``.
        k : torch.Tensor
            Keys, ``(batch, kv_heads, seq, head_dim)``.
        positions : torch.Tensor or range, optional
            Default ``0 .. seq - 1`` (a slice of the table, no gather).
        out : tuple of torch.Tensor, optional
            Preallocated ``(q_out, k_out)`` shaped like ``q`` and ``k`` and not overlapping
            the inputs: the allocation-free path for inference loops (eager, no autograd).

        Returns
        -------
        q : torch.Tensor
            Rotated queries.
        k : torch.Tensor
            Rotated keys.
        """
        check_qk(q, k, self.head_dim)
        if q.shape[2] != k.shape[2]:
            raise ValueError(
                f"q and k must have the same seq, got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        pos = position_arg(positions, q.shape[0], q.shape[2])
        if out is not None:
            outs = {t.untyped_storage().data_ptr() for t in out}
            ins = {t.untyped_storage().data_ptr() for t in (q, k)}
            if len(outs) < 2 or outs & ins:
                raise ValueError("out must be two buffers sharing memory with nothing else")
        pos = check_values("positions", pos, self.max_len)
        cs = self._rows(pos, q.dtype, device=q.device)  # (b|1, 1, seq, r // 2, 2) or rows
        return rotate_qk(q, k, cs, cs, self.pairing, out=out)

    def extra_repr(self):
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"pairing={self.pairing!r}, max_len={self.max_len}"
        )
