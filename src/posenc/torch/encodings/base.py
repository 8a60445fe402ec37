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

import functools

import torch

from posenc.torch.encodings.derived import DerivedState

__all__ = ["PositionalEncoding", "NoPE"]

PLACES = ("input", "qk", "scores")


class PositionalEncoding(DerivedState):
    """Base class: subclasses override the hook(s) of the place(s) where they act.

    The defaults do nothing, so an encoding that acts only on the input never
    touches queries, keys or scores. :attr:`places` reports which hooks a subclass
    overrides; the attention core calls the query/key and score hooks, the model calls
    the input hook once before its first block.

    Three more members let an encoding shape the attention around it without the
    attention code knowing which encoding it is: :meth:`qk_dim` (the width of the encoded
    queries and keys), :meth:`softmax_scale`, and :attr:`caches_encoded_keys` (whether a KV
    cache may store keys after ``encode_qk``).

    Tables computed from the constructor arguments (cos/sin tables, slopes) are derived
    state, declared as ``DerivedState`` (in ``posenc.torch.encodings.derived``) describes.
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

    #: Whether ``score_bias`` is a function of the encoding's tensors, its attributes and
    #: the positions alone, so that attention may keep a step's mask over ``range``
    #: positions between calls (``posenc.torch.attention.reuse``; never for an encoding
    #: with parameters, whose writes through ``.data`` nothing can see); off by default.
    reuses_masks: bool = False

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
        return _places(type(self))

    def __setattr__(self, name, value):
        # any attribute set (ALiBi's ``symmetric``, a wrapper's ``inner``, ``training``, a
        # setting back to None): count it, so what attention keeps between calls
        # (posenc.torch.attention.reuse) knows it may have changed without reading every
        # attribute on every call
        super().__setattr__(name, value)
        self._count_setting()

    def __delattr__(self, name):
        # a deleted attribute may fall back to a class default: a change like any set
        super().__delattr__(name)
        self._count_setting()

    def _count_setting(self):
        self.__dict__["_settings_version"] = self.__dict__.get("_settings_version", 0) + 1

    def __getstate__(self):
        # what attention kept of the last call (posenc.torch.attention.reuse.keep_last)
        # holds this module's tables and a mask: a copy or a pickle starts without it
        state = super().__getstate__()
        return {k: v for k, v in state.items() if k != "_last_call"}


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


@functools.cache
def _places(cls) -> tuple[str, ...]:
    """:attr:`PositionalEncoding.places` of a class (read on every attention call: kept)."""
    hooks = ("encode_input", "encode_qk", "score_bias")
    return tuple(
        place
        for place, hook in zip(PLACES, hooks, strict=True)
        if getattr(cls, hook) is not getattr(PositionalEncoding, hook)
    )
