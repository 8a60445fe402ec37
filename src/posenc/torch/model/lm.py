"""A small pre-norm decoder-only language model for the experiments in the docs."""

from __future__ import annotations

import torch
from torch import nn

from posenc._checks import check_int
from posenc.torch.attention.core import check_backend, check_padding_mask
from posenc.torch.attention.mask import refuse_bidirectional_window, release
from posenc.torch.cache.kv import KVCache
from posenc.torch.cache.step import place, plan_layer
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.encodings.checks import check_encoding
from posenc.torch.model.mha import (
    MultiHeadAttention,
    _new_cache,
    check_cache,
    check_one_cache_shape,
    share_encoding,
    tables_after_load,
)
from posenc.torch.model.schedule import Schedule

__all__ = ["TransformerLM"]


class _Block(nn.Module):
    def __init__(self, dim, heads, encoding, **attn_kw):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, heads, **attn_kw)  # window, chunk: the layer's
        share_encoding(self.attn, encoding)  # the model owns it: one state_dict entry
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, step, layer):  # x: (batch, seq, dim)
        x = x + self.attn._attend_step(self.norm1(x), step, layer)
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Decoder-only transformer: embeddings, ``depth`` pre-norm blocks, a linear head.

    One encoding object serves the whole model and is owned by it (``lm.encoding``, one
    entry per parameter in ``state_dict``): its input hook runs once on the token
    embeddings, its query/key and score hooks in every attention layer. Or a
    :class:`~posenc.torch.Schedule` gives each layer its own scheme (encoding, sliding
    window, chunk) and the input its encoding; the model then owns its distinct
    encodings (``lm.encodings``). Each step's positions are placed once, and its attention
    mask planned once per kind of layer and shared by the layers of that kind.

    Parameters
    ----------
    vocab_size : int
        Number of token ids.
    dim : int
        Model width.
    depth : int
        Number of blocks.
    heads : int
        Query heads per block.
    encoding : PositionalEncoding, optional
        Where and how position enters (:class:`~posenc.torch.NoPE` for none), the same in
        every layer.
    schedule : Schedule, optional
        Instead of ``encoding``: a scheme per layer (``len(schedule) == depth``).
    kv_heads : int, optional
        Key/value heads per block (grouped-query attention); default ``heads``.
    bias : bool
        Bias in the attention projections.
    max_len : int, optional
        If given, longer sequences (cache included) raise :class:`ValueError`.
    causal : bool
        Causal self-attention (default) or bidirectional.
    backend : {"auto", "sdpa", "flex"}
        Attention kernel of every layer (see :func:`~posenc.torch.attend`); ``"auto"``:
        FlexAttention for score biases on CUDA, else SDPA.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import RotaryEmbedding, TransformerLM
    >>> _ = torch.manual_seed(0)
    >>> lm = TransformerLM(10, 16, 1, 4, kv_heads=2, encoding=RotaryEmbedding(4, max_len=64))
    >>> lm(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 10])
    >>> out = lm.generate(torch.tensor([[1, 2, 3]]), 4)  # one token per step, KV cache
    >>> out.shape, bool((out == lm.generate(torch.tensor([[1, 2, 3]]), 4, use_cache=False)).all())
    (torch.Size([1, 7]), True)
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        depth: int,
        heads: int,
        *,
        encoding: PositionalEncoding | None = None,
        schedule: Schedule | None = None,
        kv_heads: int | None = None,
        bias: bool = False,
        max_len: int | None = None,
        causal: bool = True,
        backend: str = "auto",
    ):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.depth = check_int("depth", depth, minimum=1)
        self.max_len = None if max_len is None else check_int("max_len", max_len, minimum=1)
        if (encoding is None) == (schedule is None):
            raise ValueError("give one of encoding= and schedule=, got "
                             f"{'both' if encoding is not None else 'neither'}")  # fmt: skip
        if schedule is None:
            self.encoding = check_encoding(encoding)  # one state_dict entry, as it always was
            schedule = Schedule.uniform(encoding, self.depth)
        elif not isinstance(schedule, Schedule):
            raise ValueError(f"schedule must be a Schedule, got {type(schedule).__name__}")
        elif len(schedule) != self.depth:
            raise ValueError(f"schedule must have depth={depth} layers, got {len(schedule)}")
        elif not all(layer.attention for layer in schedule):
            i = next(i for i, layer in enumerate(schedule) if not layer.attention)
            raise ValueError(
                f"schedule layer {i} has no attention (a recurrent or linear-attention layer): "
                "TransformerLM runs softmax attention in every layer, which is not that model"
            )
        else:
            self.encodings = nn.ModuleList(schedule.encodings)  # the model owns them
        self.schedule = schedule
        self.causal, self.backend = bool(causal), check_backend(backend)
        for i, layer in enumerate(schedule if not causal else ()):
            if layer.window is not None:
                refuse_bidirectional_window(layer.window, f" (schedule layer {i})")
        kw = {"kv_heads": kv_heads, "bias": bias, "causal": causal, "backend": backend}
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(
            _Block(dim, heads, schedule.encoding_of(i), window=layer.window, chunk=layer.chunk,
                   sinks=layer.sinks, **kw)
            for i, layer in enumerate(schedule)
        )  # fmt: skip
        check_one_cache_shape(self.blocks)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.register_load_state_dict_post_hook(tables_after_load)

    def new_cache(self, batch: int, max_len: int, *, static: bool = False) -> KVCache:
        """An empty :class:`~posenc.torch.KVCache` for every layer, in the model's dtype and device.

        Parameters
        ----------
        batch : int
            Batch size of the calls that will use it.
        max_len : int
            Capacity in tokens (prompt plus generated); at most the model's ``max_len``
            when ``static``.
        static : bool
            A :class:`~posenc.torch.StaticKVCache`: shapes fixed between steps, so
            ``torch.compile(lm, fullgraph=True)`` compiles prefill and decode once each.

        Returns
        -------
        posenc.torch.KVCache
            Pass it as ``cache=`` to ``forward``.
        """
        if static and self.max_len is not None and max_len > self.max_len:
            self._refuse_static(max_len)
        return _new_cache(self, self.depth, batch, max_len, static)

    def forward(self, idx, positions=None, padding_mask=None, *, cache=None, documents=None,
                context=None):  # fmt: skip
        """Logits for every new token.

        Parameters
        ----------
        idx : torch.Tensor
            Token ids, int64 ``(batch, seq)``.
        positions : torch.Tensor or range, optional
            Int positions ``(seq,)`` or ``(batch, seq)``. Default ``0 .. seq - 1``, or with a
            cache: one past each row's last cached position; with a ``padding_mask``,
            counted over the real tokens only (0 at each row's first, each document's).
        padding_mask : torch.Tensor, optional
            Bool ``(batch, seq)``, ``True`` for real tokens; remembered by the cache.
        cache : posenc.torch.KVCache, optional
            From :meth:`new_cache`; this call's keys and values are appended to it, and the
            tokens attend to everything it holds.
        documents : torch.Tensor, optional
            Int64 ``(batch, seq)`` ids of the documents packed into each row
            (non-decreasing): each document's logits are those it would get alone
            (attention stays within it, positions restart at 0 unless given). With a
            cache, on its first step only; later steps continue each row's last document.
        context : object, optional
            Set by :func:`~posenc.torch.context_parallel_forward` (never by hand): ``idx``
            is then this rank's share of a sequence split across ranks.

        Returns
        -------
        torch.Tensor
            Logits, shape ``(batch, seq, vocab_size)``.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, seq), got {tuple(idx.shape)}")
        b, n = idx.shape
        static = getattr(cache, "static", False)  # its length is a tensor, its size bounded
        total = n + (0 if cache is None or static else cache.length)
        if context is not None:  # this rank holds a share: the limit is the whole sequence's
            total = len(context.k_index)
        if self.max_len is not None and total > self.max_len:
            raise ValueError(f"sequence length must be <= max_len={self.max_len}, got {total}")
        if static and self.max_len is not None and cache.max_len > self.max_len:
            self._refuse_static(cache.max_len)  # it could fill past the model's max_len
        if cache is not None:
            check_cache(self, cache, self.depth)
        x = self.embed(idx)  # (b, n, dim)
        steps = {}  # one plan per kind of layer: (encoding, window, chunk) -> Step
        try:
            axes = self.blocks[0].attn.encoding.position_axes
            if context is None:
                placed = place(axes, b, n, positions, padding_mask, cache, documents)
            else:  # this rank's share of a sequence; its keys are every rank's
                if cache is not None or padding_mask is not None:
                    raise ValueError("context parallelism takes no cache and no padding_mask")
                placed = context.placed(place(axes, b, n, positions, None, None), documents)
            if self.schedule.input is not None:
                x = self.schedule.input.encode_input(x, placed.q_positions)  # (b, n, dim)
            for layer, block in enumerate(self.blocks):
                attn = block.attn
                kind = (attn.encoding, attn.window, attn.chunk)
                if kind not in steps:
                    steps[kind] = plan_layer(attn.encoding, placed, **attn._plan_options(x))
                x = block(x, steps[kind], layer)  # (b, n, dim)
        except Exception:
            if cache is not None:
                cache._rollback()  # a failed step leaves the cache as it was
            raise
        finally:
            for step in steps.values():
                release(step)  # the step's mask workspace is free for the next step
        if cache is not None:
            cache._commit()
        return self.head(self.norm(x))  # (b, n, vocab)

    def _refuse_static(self, max_len):
        raise ValueError(
            f"max_len of a static cache must be <= the model's max_len={self.max_len}, "
            f"got {max_len}"
        )

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, *, use_cache=True, padding_mask=None):
        """Greedy decoding: append the most likely token ``max_new_tokens`` times.

        Parameters
        ----------
        idx : torch.Tensor
            Prompt token ids, int64 ``(batch, seq)``; left-pad rows of different lengths.
        max_new_tokens : int
            How many tokens to append.
        use_cache : bool
            With a KV cache (default), one forward of one token per step; without, the
            whole sequence is re-run every step (for comparison).
        padding_mask : torch.Tensor, optional
            Bool ``(batch, seq)``, ``False`` on the padding of the prompt (either side):
            positions count the real tokens only (0 at each row's first), and so do the
            windows and chunks of the layers. Each row's first new token is predicted at
            its last real token; new tokens follow the last slot (right padding stays
            between the prompt and them).

        Returns
        -------
        torch.Tensor
            Shape ``(batch, seq + max_new_tokens)``.
        """
        check_int("max_new_tokens", max_new_tokens, minimum=0)
        if idx.dim() != 2 or (max_new_tokens and idx.shape[1] == 0):
            raise ValueError(
                f"idx must be a (batch, seq) prompt of at least one token, got {tuple(idx.shape)}"
            )
        b, n = idx.shape
        if max_new_tokens == 0:
            return idx
        rows, at = torch.arange(b, device=idx.device), -1  # the slot whose logits come next
        if padding_mask is not None:  # each row's last real slot (right padding after it)
            real = check_padding_mask(padding_mask, b, n).to(idx.device)
            at = torch.where(real, torch.arange(n, device=idx.device), 0).amax(1)  # (b,)
        out, cache = [idx], self.new_cache(b, n + max_new_tokens) if use_cache else None
        logits = self(idx, None, padding_mask, cache=cache)  # (b, n, vocab)
        for i in range(max_new_tokens):
            nxt, at = logits[rows, at].argmax(-1, keepdim=True), -1  # (b, 1)
            out.append(nxt)
            if i + 1 == max_new_tokens:
                break
            if cache is not None:
                logits = self(nxt, cache=cache)  # (b, 1, vocab): one token per step
                continue
            if padding_mask is not None:  # without a cache: the whole sequence again
                padding_mask = torch.cat([padding_mask, torch.ones_like(nxt, dtype=torch.bool)], 1)
            logits = self(torch.cat(out, dim=1), None, padding_mask)  # (b, n + i + 1, vocab)
        return torch.cat(out, dim=1)  # (b, n + max_new_tokens)
