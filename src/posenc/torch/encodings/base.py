"""The one interface every torch encoding implements: hooks at the places position enters.

Attention has three places where position can enter, and an encoding overrides the
hook for the place where it acts (and only that one):

========================  =====================================  ==========================
place                     hook                                   examples
========================  =====================================  ==========================
the input                 ``encode_input(x, positions)``         sinusoidal, learned
the queries and keys      ``encode_qk(q, k, q_pos, k_pos)``      RoPE
the scores                ``score_bias(q_pos, k_pos)``           ALiBi, T5 buckets
========================  =====================================  ==========================

Shape legend: ``x`` is ``(batch, seq, dim)``; ``q`` is ``(batch, heads, seq_q, head_dim)``
and ``k`` is ``(batch, kv_heads, seq_k, head_dim)`` with ``kv_heads`` dividing ``heads``
(grouped-query attention). Positions reaching a hook are either an int64 tensor
``(batch, seq)`` / ``(1, seq)`` or a :class:`range` -- contiguous positions shared by the
batch, the common case, which lets table encodings slice instead of gather and keeps
:func:`torch.compile` free of data-dependent branches. :func:`as_positions` turns either
into a tensor.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PositionalEncoding", "NoPE"]

PLACES = ("input", "qk", "scores")


class PositionalEncoding(nn.Module):
    """Base class: subclasses override the hook(s) of the place(s) where they act.

    The defaults do nothing, so an encoding that acts only on the input never
    touches queries, keys or scores. :attr:`places` reports which hooks a subclass
    overrides; the attention core calls the query/key and score hooks, the model calls
    the input hook once before its first block.

    Three more members let an encoding shape the attention around it without the
    attention code knowing which encoding it is: :meth:`qk_dim` (the width of the encoded
    queries and keys), :meth:`softmax_scale`, and :attr:`caches_encoded_keys` (whether a KV
    cache may store keys after ``encode_qk``).

    Derived state (tables computed from the constructor arguments, such as cos/sin
    tables) is declared by overriding ``_derived_tensors``: it is registered as
    non-persistent buffers (never saved to or loaded from a checkpoint) that keep the
    right numbers through every ``.to()``, ``.half()``, device move or ``to_empty()``
    (moved in their own dtype, recomputed only when they were on the meta device), so a
    module built on the meta device is exact once materialised, by ``to_empty()`` or by
    ``load_state_dict(assign=True)``.
    """

    #: Whether a KV cache may keep keys *after* :meth:`encode_qk`. ``False`` for encodings
    #: whose key transform depends on the length of the whole sequence (length-dependent
    #: RoPE scalings): the cache then keeps raw keys and the hook sees all of them each step.
    caches_encoded_keys: bool = True

    #: Coordinates per token the encoding reads: 1 for positions on a line; 2 or 3 for the
    #: grid encodings (:class:`~posenc.torch.AxialRotaryEmbedding`,
    #: :class:`~posenc.torch.MRoPE`, :class:`~posenc.torch.SinusoidalEncoding2D`), whose
    #: hooks may receive int64 ``(batch|1, seq, position_axes)`` coordinates. The attention
    #: core rejects grid coordinates for an encoding that reads a line.
    position_axes: int = 1

    #: Whether the encoding is defined for causal attention only (bidirectional attention
    #: with it raises ``ValueError``), such as ALiBi's ``-m (i - j)`` without ``symmetric``.
    requires_causal: bool = False

    def __init__(self) -> None:
        super().__init__()
        # the work dtype follows torch's default dtype at construction, not at each call
        self.__dict__["_work"] = (
            torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        )

    def encode_input(self, x: torch.Tensor, positions) -> torch.Tensor:
        """Add position to token embeddings (default: return ``x`` unchanged).

        Parameters
        ----------
        x : torch.Tensor
            Embeddings, shape ``(batch, seq, dim)``.
        positions : torch.Tensor or range
            Int64 ``(batch, seq)`` / ``(1, seq)``, or a ``range`` of length ``seq``.

        Returns
        -------
        torch.Tensor
            Same shape and dtype as ``x``.
        """
        return x

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace: bool = False):
        """Transform queries and keys by their positions (default: unchanged).

        Parameters
        ----------
        q : torch.Tensor
            Queries, shape ``(batch, heads, seq_q, head_dim)``.
        k : torch.Tensor
            Keys, shape ``(batch, kv_heads, seq_k, head_dim)``; ``kv_heads`` divides ``heads``.
        q_positions : torch.Tensor or range
            Positions of the queries: int64 ``(batch|1, seq_q)`` or a ``range``.
        k_positions : torch.Tensor or range
            Positions of the keys: int64 ``(batch|1, seq_k)`` or a ``range``.
        inplace : bool
            The caller owns ``q`` and ``k`` and allows the result to be written into them
            (the attention core does this for its fresh projections outside autograd).

        Returns
        -------
        q : torch.Tensor
            Shape ``(batch, heads, seq_q, qk_dim(head_dim))``, dtype of the input ``q``.
        k : torch.Tensor
            Shape ``(batch, kv_heads, seq_k, qk_dim(head_dim))``, dtype of the input ``k``.
        """
        return q, k

    def score_bias(self, q_positions, k_positions, *, out=None) -> torch.Tensor | None:
        """Bias added to the scaled scores before the softmax (default: none).

        Parameters
        ----------
        q_positions : torch.Tensor or range
            Positions of the queries: int64 ``(batch|1, seq_q)`` or a ``range``.
        k_positions : torch.Tensor or range
            Positions of the keys: int64 ``(batch|1, seq_k)`` or a ``range``.
        out : torch.Tensor, optional
            A ``(batch|1, heads, seq_q, seq_k)`` buffer in the scores' dtype that the
            encoding may write the bias into (computed in ``work_dtype``, rounded once
            when written) and return. The attention core passes one it reuses between
            inference calls: a fresh bias of that size costs more in page faults than in
            arithmetic. Encodings may ignore it and return a new tensor.

        Returns
        -------
        torch.Tensor or None
            Float bias broadcastable to ``(batch, heads, seq_q, seq_k)``, or ``None``.
        """
        return None

    def score_mod(self, q_positions, k_positions):
        """The score bias as a FlexAttention ``score_mod`` (default: from :meth:`score_bias`).

        The default materialises :meth:`score_bias` once and indexes it; encodings whose
        bias is an elementwise function of the positions override this to compute it in
        the kernel, in float32, without a ``(batch, heads, seq_q, seq_k)`` tensor.

        Parameters
        ----------
        q_positions : torch.Tensor or range
            Positions of the queries: int64 ``(batch|1, seq_q)`` or a ``range``.
        k_positions : torch.Tensor or range
            Positions of the keys: int64 ``(batch|1, seq_k)`` or a ``range``.

        Returns
        -------
        callable or None
            ``f(score, b, h, q_idx, kv_idx) -> score`` for
            :func:`torch.nn.attention.flex_attention.flex_attention`, or ``None``.
        """
        bias = self.score_bias(q_positions, k_positions)
        if bias is None:
            return None
        bias = bias.float()  # (b|1, h|1, sq, sk)
        one_b, one_h = bias.shape[0] == 1, bias.shape[1] == 1

        def add_bias(score, b, h, q_idx, kv_idx):
            return score + bias[0 if one_b else b, 0 if one_h else h, q_idx, kv_idx]

        return add_bias

    def qk_dim(self, head_dim: int) -> int:
        """Width of the queries and keys returned by :meth:`encode_qk` (default ``head_dim``).

        Parameters
        ----------
        head_dim : int
            Width of one head of the projections (and of the values).

        Returns
        -------
        int
            The width attention computes ``q . k`` over; a KV cache allocates it.
        """
        return head_dim

    def softmax_scale(self, head_dim: int) -> float:
        """Factor on ``q . k`` before the softmax (default ``1 / sqrt(head_dim)``).

        Parameters
        ----------
        head_dim : int
            Width of one head of the projections, not :meth:`qk_dim`.

        Returns
        -------
        float
            Passed to attention as its ``scale``.
        """
        return head_dim**-0.5

    @property
    def places(self) -> tuple[str, ...]:
        """The places (``"input"``, ``"qk"``, ``"scores"``) whose hooks this class overrides."""
        hooks = ("encode_input", "encode_qk", "score_bias")
        cls = type(self)
        return tuple(
            place
            for place, hook in zip(PLACES, hooks, strict=True)
            if getattr(cls, hook) is not getattr(PositionalEncoding, hook)
        )

    # -- derived state ----------------------------------------------------------------------
    #: Names of the non-persistent buffers built by ``_derived_tensors``.
    _DERIVED: tuple[str, ...] = ()

    def _derived_tensors(self) -> dict[str, torch.Tensor]:
        """Tables computed from the constructor arguments, on the CPU (default: none)."""
        return {}

    def _register_derived(self, device=None) -> None:
        """(Re)compute the derived tables and register them as non-persistent buffers.

        ``device`` defaults to torch's default device, so a module built inside
        ``with torch.device("meta")`` holds meta tables until it is materialised.
        """
        device = torch.get_default_device() if device is None else device
        for name, table in self._derived_tensors().items():
            self.register_buffer(name, table.to(device), persistent=False)

    def _materialize(self, device=None) -> None:
        """Build the derived tables if they are still on the meta device.

        A module built on meta whose parameters were then loaded with
        ``load_state_dict(assign=True)`` (HF's and accelerate's empty-weight loading) has
        real parameters but meta tables: they are built on ``device`` (default: where the
        parameters are, else the CPU) instead of being read as uninitialised memory.
        """
        present = [self._buffers[n] for n in self._DERIVED if self._buffers.get(n) is not None]
        if not any(t.is_meta for t in present):
            return
        if device is None or torch.device(device).type == "meta":
            real = [p.device for p in self.parameters() if not p.is_meta]
            device = real[0] if real else torch.device("cpu")
        with torch.inference_mode(False), torch.no_grad():  # usable by training later
            self._register_derived(device)

    @property
    def work_dtype(self) -> torch.dtype:
        """Dtype the encoding computes its tables and biases in: float64 after ``.double()``
        (or with float64 as torch's default dtype at construction), else float32 -- never
        lower, whatever the module is cast to."""
        work = self.__dict__.get("_work")
        if work is None:
            default = torch.get_default_dtype()
            work = torch.float64 if default == torch.float64 else torch.float32
        return work

    def _apply(self, fn, recurse=True):
        # .to(), .half(), .cuda(), to_empty() ... all land here: let torch move everything,
        # then put the derived tables back exactly, in their own dtype, on the new device.
        before = {n: self._buffers.get(n) for n in self._DERIVED}
        super()._apply(fn, recurse)
        # what the move does to floats: a device-only move keeps both probes' dtypes and
        # leaves the work dtype alone; a cast sets it (float64, or float32 for any other)
        p32 = fn(torch.zeros((), dtype=torch.float32))
        p64 = fn(torch.zeros((), dtype=torch.float64))
        if not (p32.dtype == torch.float32 and p64.dtype == torch.float64):
            self.__dict__["_work"] = torch.float64 if p32.dtype == torch.float64 else torch.float32
        names = [n for n in self._DERIVED if before.get(n) is not None]
        if not names:
            return self
        device = self._buffers[names[0]].device
        if device.type == "meta" or any(before[n].is_meta for n in names):
            self._register_derived(device)  # nothing exact to keep: compute them
            return self
        for n in names:  # the exact tables, in their own dtype: moved, never recomputed
            self._buffers[n] = before[n].to(device)  # the same tensor when nothing moves
        return self


class NoPE(PositionalEncoding):
    """No positional encoding: every hook is the default no-op.

    Without a causal mask, attention is then permutation-equivariant; with one,
    a decoder can still infer order from the mask itself (Haviv et al., 2022;
    Kazemnejad et al., 2023).

    Examples
    --------
    >>> from posenc.torch import NoPE
    >>> NoPE().places
    ()
    """

    def forward(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        """Return ``x`` unchanged (there is no position to add).

        Parameters
        ----------
        x : torch.Tensor
            Embeddings ``(batch, seq, dim)``.
        positions : torch.Tensor or range, optional
            Ignored.

        Returns
        -------
        torch.Tensor
            ``x`` itself.
        """
        return x


def check_float(name, t) -> torch.Tensor:
    """Return ``t`` if it is a floating-point tensor, else raise ``ValueError`` naming it."""
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def check_qk(q, k, head_dim) -> None:
    """Refuse queries/keys a query/key hook cannot take: not floating point, not
    ``(batch, heads, seq, head_dim)``, different batches, or key heads that do not divide
    the query heads (grouped-query attention)."""
    for name, t in (("q", q), ("k", k)):
        check_float(name, t)
        if t.dim() != 4 or t.shape[-1] != head_dim:
            raise ValueError(
                f"{name} must have shape (batch, heads, seq, head_dim={head_dim}), "
                f"got {tuple(t.shape)}"
            )
    if q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        raise ValueError(
            "q and k must share batch and k's heads must divide q's, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )


def check_heads(encoding, heads) -> None:
    """Refuse an encoding built for another number of heads (its ``heads``, if it has one)."""
    own = getattr(encoding, "heads", None)
    if isinstance(own, int) and own != heads:
        raise ValueError(
            f"encoding {type(encoding).__name__} was built for heads={own}, "
            f"attention has heads={heads}"
        )


def check_encoding(encoding, causal=True) -> PositionalEncoding:
    """Return ``encoding`` if it is a :class:`PositionalEncoding` usable with ``causal``."""
    if not isinstance(encoding, PositionalEncoding):
        raise ValueError(f"encoding must be a PositionalEncoding, got {type(encoding).__name__}")
    if not causal and encoding.requires_causal:
        raise ValueError(
            f"encoding {encoding!r} is for causal attention only (causal=False was given)"
        )
    return encoding
