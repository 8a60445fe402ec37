"""Multi-head attention with a pluggable encoding, grouped-query heads and a KV cache.

Shape legend: ``x`` is ``(batch, seq, dim)``; ``q`` is ``(batch, heads, seq, head_dim)``;
``k, v`` are ``(batch, kv_heads, seq, head_dim)``.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc._checks import check_int
from posenc.torch.attention.core import check_backend
from posenc.torch.attention.mask import check_limits, release
from posenc.torch.attention.run import _run
from posenc.torch.cache.kv import KVCache
from posenc.torch.cache.static import StaticKVCache
from posenc.torch.cache.step import plan_step
from posenc.torch.encodings.base import NoPE, PositionalEncoding
from posenc.torch.encodings.checks import check_encoding, check_heads
from posenc.torch.encodings.derived import DerivedState

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with a pluggable encoding, grouped-query heads and a KV cache.

    With ``backend="sdpa"`` the encoding's score bias, the causal mask and the padding mask
    are merged into one float ``attn_mask`` for
    :func:`torch.nn.functional.scaled_dot_product_attention`; with ``backend="flex"`` the
    bias is the encoding's FlexAttention ``score_mod`` (see :func:`~posenc.torch.attend`).

    Parameters
    ----------
    dim : int
        Model width; must be divisible by ``heads``.
    heads : int
        Number of query heads; ``head_dim = dim // heads``.
    kv_heads : int, optional
        Number of key/value heads (grouped-query attention); must divide ``heads``.
        Default ``heads`` (multi-head attention); 1 is multi-query attention.
    bias : bool
        Bias in the projections.
    encoding : PositionalEncoding, optional
        Supplies ``encode_qk``, ``score_bias`` and ``softmax_scale``; default :class:`NoPE`.
    causal : bool
        If true, each query attends to keys at or before its own slot.
    backend : {"auto", "sdpa", "flex"}
        The attention kernel (``"flex"``: inference only on the CPU; ``"auto"``:
        ``"flex"`` for score biases on CUDA, else ``"sdpa"``).
    window : int, optional
        Sliding window, counted in positions: the query at position ``q`` sees the keys at
        positions ``q - window < k`` (Mistral, Gemma's local layers); after left padding
        and in packed documents the positions restart, so the window does too. Refused
        with ``causal=False`` (a bidirectional window, HF's ``|i - j| <= w``, is not built).
    chunk : int, optional
        Chunked attention, counted in positions: the query at position ``q`` sees only the
        keys with ``k // chunk == q // chunk`` (Llama 4's layers with RoPE; chunks start at
        each row's first real token and at each document, as in HF's ``masking_utils``).
        Grid coordinates (M-RoPE) count both in slots instead, from each row's first real
        token and each document's first.
    sinks : bool
        A learned sink logit per head (GPT-OSS), ``self.sinks`` ``(heads,)``, initialised
        to 0: each softmax gains a term ``exp(sinks[h])`` for a key with no value, so a head
        may attend to nothing (``posenc.torch.attention.sinks``).

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import MultiHeadAttention
    >>> attn = MultiHeadAttention(16, 4, kv_heads=2)
    >>> x = torch.randn(2, 5, 16)
    >>> attn(x).shape
    torch.Size([2, 5, 16])
    >>> cache = attn.new_cache(2, max_len=8)
    >>> y = attn(x[:, :4], cache=cache)  # prefill 4 tokens
    >>> y = attn(x[:, 4:], cache=cache)  # then one more at position 4
    >>> len(cache)
    5
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        kv_heads: int | None = None,
        bias: bool = False,
        encoding: PositionalEncoding | None = None,
        causal: bool = True,
        backend: str = "auto",
        window: int | None = None,
        chunk: int | None = None,
        sinks: bool = False,
    ):
        super().__init__()
        self.window, self.chunk = check_limits(window, chunk, causal)
        self.dim = check_int("dim", dim, minimum=1)
        self.heads = check_int("heads", heads, minimum=1)
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads={heads}, got dim={dim}")
        self.kv_heads = heads if kv_heads is None else check_int("kv_heads", kv_heads, minimum=1)
        if heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads={heads}, got kv_heads={self.kv_heads}")
        self.head_dim = dim // heads
        self.causal = bool(causal)
        self.encoding = NoPE() if encoding is None else check_encoding(encoding, self.causal)
        check_heads(self.encoding, self.heads)
        self.backend = check_backend(backend)
        self.qkv = nn.Linear(dim, (heads + 2 * self.kv_heads) * self.head_dim, bias=bias)
        self.out = nn.Linear(dim, dim, bias=bias)
        if sinks is not True and sinks is not False:
            raise ValueError(f"sinks must be True or False, got {sinks!r}")
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None  # (heads,)
        self.register_load_state_dict_post_hook(tables_after_load)

    def new_cache(self, batch: int, max_len: int, *, static: bool = False) -> KVCache:
        """An empty one-layer :class:`~posenc.torch.KVCache` in this module's dtype and device.

        Parameters
        ----------
        batch : int
            Batch size of the calls that will use it.
        max_len : int
            Capacity in tokens.
        static : bool
            A :class:`~posenc.torch.StaticKVCache` (shapes fixed between steps, for
            ``torch.compile`` and CUDA graphs) instead of a growing one.

        Returns
        -------
        posenc.torch.KVCache
            Pass it as ``cache=`` to ``forward``.
        """
        return _new_cache(self, 1, batch, max_len, static)

    def forward(self, x, positions=None, padding_mask=None, *, cache=None, documents=None):
        """Attend over ``x`` (and over the cached tokens, if a cache is given).

        Parameters
        ----------
        x : torch.Tensor
            Input, shape ``(batch, seq, dim)``.
        positions : torch.Tensor or range, optional
            Int positions ``(seq,)`` or ``(batch, seq)`` of the new tokens. Default
            ``0 .. seq - 1``, or with a cache: one past each row's last cached position (the
            cache's length when it was filled with default positions); with a
            ``padding_mask``, counted over the real tokens only (0 at each row's first).
        padding_mask : torch.Tensor, optional
            Bool ``(batch, seq)``, ``True`` for real tokens. Padding keys get no weight,
            now and, when cached, in every later step.
        cache : posenc.torch.KVCache, optional
            From :meth:`new_cache`; the new keys and values are appended to it.
        documents : torch.Tensor, optional
            Int64 ``(batch, seq)`` ids of the documents packed into each row
            (non-decreasing): attention stays within a document, and positions not given
            restart at 0 at each one. With a cache, on its first step only (a packed
            prefill); later steps continue each row's last document.

        Returns
        -------
        torch.Tensor
            Shape ``(batch, seq, dim)``.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape (batch, seq, dim={self.dim}), got {tuple(x.shape)}"
            )
        if cache is not None:
            check_cache(self, cache, 1)
        step = None
        try:
            step = plan_step(self.encoding, *x.shape[:2], positions, padding_mask, cache,
                             documents, **self._plan_options(x))  # fmt: skip
            y = self._attend_step(x, step, layer=0)
        except Exception:
            if cache is not None:
                cache._rollback()  # a failed step leaves the cache as it was
            raise
        finally:
            release(step)  # the step's mask workspace is free for the next step
        if cache is not None:
            cache._commit()
        return y

    def _plan_options(self, x):
        """Keyword arguments of the step planning for input ``x`` (shared with the model)."""
        return {
            "causal": self.causal, "heads": self.heads, "backend": self.backend,
            "dtype": x.dtype, "device": x.device, "limits": (self.window, self.chunk),
        }  # fmt: skip

    def _attend_step(self, x, step, layer: int) -> torch.Tensor:
        """Attention for one model step whose positions, cache slots and mask are planned.

        ``x`` is ``(batch, seq, dim)``; ``step`` comes from ``plan`` and is shared by all
        layers of the step; ``layer`` indexes this layer in the step's cache.
        """
        b, n, _ = x.shape
        h, kvh, hd = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(x).view(b, n, h + 2 * kvh, hd).split([h, kvh, kvh], dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, h|kvh, n, hd)
        enc, cache = self.encoding, step.cache
        inplace = not (torch.is_grad_enabled() and q.requires_grad)  # q, k are ours alone
        if step.context is not None:  # this rank's keys at their positions, then every rank's
            if not enc.caches_encoded_keys:
                raise ValueError(f"{type(enc).__name__} rotates keys by the whole length: it "
                                 "cannot run context-parallel")  # fmt: skip
            q, k = enc.encode_qk(q, k, step.q_positions, step.q_positions, inplace=inplace)
            k, v = step.context.gather(k, v)  # (b, kvh, n_all, ·)
        elif cache is None:
            q, k = enc.encode_qk(q, k, step.q_positions, step.k_positions, inplace=inplace)
        elif enc.caches_encoded_keys and not cache.keeps_raw_keys:
            q, k = enc.encode_qk(q, k, step.q_positions, step.q_positions, inplace=inplace)
            k, v = cache._store(layer, step.start, k, v, step.full_kv)  # (b, kvh, n_keys, ·)
        else:  # the cache keeps raw keys; all of them are encoded for this step
            k, v = cache._store(layer, step.start, k, v, step.full_kv)  # (b, kvh, n_keys, hd)
            q, k = enc.encode_qk(q, k, step.q_positions, step.k_positions)
        y = _run(q, k, v, step, enc.softmax_scale(hd), self.sinks)  # (b, h, n, hd)
        return self.out(y.transpose(1, 2).reshape(b, n, h * hd))  # (b, n, dim)

    def extra_repr(self):
        limits = "".join(
            f", {name}={value}" for name, value in (("window", self.window), ("chunk", self.chunk))
            if value is not None
        )  # fmt: skip
        return (
            f"dim={self.dim}, heads={self.heads}, kv_heads={self.kv_heads}, "
            f"causal={self.causal}, backend={self.backend!r}{limits}"
            + (", sinks=True" if self.sinks is not None else "")
        )


def _cache_shape(module, layers):
    """What a cache for ``module`` (an attention layer or a model holding them) must be."""
    attn = module if isinstance(module, MultiHeadAttention) else module.blocks[0].attn
    enc, hd = attn.encoding, attn.head_dim
    key_dim = enc.qk_dim(hd) if enc.caches_encoded_keys else hd
    weight = attn.qkv.weight
    return {
        "layers": layers, "kv_heads": attn.kv_heads, "key_dim": key_dim, "value_dim": hd,
        "dtype": weight.dtype, "device": weight.device, "position_axes": enc.position_axes,
    }  # fmt: skip


def check_one_cache_shape(blocks) -> None:
    """Refuse layers that one cache cannot serve: different key widths or position axes."""
    shapes = {(_cache_shape(b.attn, 1)["key_dim"], b.attn.encoding.position_axes) for b in blocks}
    if len(shapes) > 1:
        raise ValueError(
            "every layer must cache keys of one width and positions of one number of axes, "
            f"got (key width, axes) {sorted(shapes)}"
        )


def _new_cache(module, layers, batch, max_len, static=False):
    """A cache sized for ``module`` (an attention layer or a model holding them)."""
    cls = StaticKVCache if static else KVCache
    return cls(batch=batch, max_len=max_len, **_cache_shape(module, layers))


def check_cache(module, cache, layers):
    """Refuse a cache that ``module`` cannot use (ValueError saying what differs)."""
    if not isinstance(cache, KVCache):
        raise ValueError(f"cache must be a KVCache (from new_cache), got {type(cache).__name__}")
    cache._check_for(**_cache_shape(module, layers))


def tables_after_load(module, incompatible_keys):
    """Load post-hook: derived tables still on meta (``load_state_dict(assign=True)`` into a
    module built on meta) are built next to the loaded weights."""
    weight = module.qkv.weight if isinstance(module, MultiHeadAttention) else module.embed.weight
    if not weight.is_meta:
        for m in module.modules():
            if isinstance(m, DerivedState):
                m._materialize(weight.device)


def share_encoding(attn: MultiHeadAttention, encoding: PositionalEncoding) -> None:
    """Let ``attn`` use ``encoding`` without owning it: one copy in the model's state_dict."""
    attn._modules.pop("encoding", None)
    attn.__dict__["encoding"] = check_encoding(encoding, attn.causal)
    check_heads(encoding, attn.heads)
