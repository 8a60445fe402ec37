"""One attention core for every encoding: ``attend`` and ``MultiHeadAttention``.

Attention calls the query/key hook and the score hook of its
:class:`~posenc.torch.PositionalEncoding` and knows nothing else about position;
encodings that act on the input are applied by the model before the first block.
Shape legend: ``x`` is ``(batch, seq, dim)``; ``q`` is ``(batch, heads, seq_q, head_dim)``;
``k, v`` are ``(batch, kv_heads, seq_k, head_dim)``, ``kv_heads`` dividing ``heads``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from posenc._checks import check_int
from posenc.torch.base import NoPE, PositionalEncoding, check_encoding
from posenc.torch.cache import KVCache
from posenc.torch.positions import position_arg

__all__ = ["MultiHeadAttention", "attend", "attention_mask"]


def attention_mask(
    encoding, q_positions, k_positions, *, causal, key_valid=None, dtype, device=None
):
    """The float mask SDPA adds to the scores: causal, padding and the encoding's bias.

    The queries are the *last* ``seq_q`` of the ``seq_k`` key slots (as when decoding with
    a KV cache), so the causal mask is aligned to the end; a padding query may see itself,
    so no row is empty. Built once per model step and shared by its layers.

    Parameters
    ----------
    encoding : PositionalEncoding
        Supplies ``score_bias``.
    q_positions : torch.Tensor or range
        ``(b|1, seq_q)`` positions of the queries.
    k_positions : torch.Tensor or range
        ``(b|1, seq_k)`` positions of the keys.
    causal : bool
        Key slot ``j`` is visible to query ``i`` only if ``j <= seq_k - seq_q + i``.
    key_valid : torch.Tensor, optional
        Bool ``(batch, seq_k)``, ``False`` for padding keys.
    dtype : torch.dtype
        Dtype of the scores; bias and mask are summed in float32 (float64 for float64)
        and rounded once.
    device : torch.device, optional
        Where the mask is built.

    Returns
    -------
    mask : torch.Tensor or None
        ``(b|1, h|1, seq_q, seq_k)``, or ``None`` when SDPA needs none.
    is_causal : bool
        Whether SDPA's own causal path applies (only when ``mask`` is ``None``).
    """
    seq_q, seq_k = len_of(q_positions), len_of(k_positions)
    bias = encoding.score_bias(q_positions, k_positions)  # None or (b|1, h|1, sq, sk)
    if bias is None and key_valid is None:
        if not causal or seq_q == 1:
            return None, False
        if seq_q == seq_k:
            return None, True  # SDPA's is_causal aligns to the start: right when sq == sk
    work = torch.float64 if dtype == torch.float64 else torch.float32
    i = torch.arange(seq_q, device=device)[:, None] + (seq_k - seq_q)  # query slots (sq, 1)
    j = torch.arange(seq_k, device=device)[None]  # key slots (1, sk)
    allowed = (j <= i) if causal else torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    allowed = allowed[None, None]  # (1, 1, sq, sk)
    if key_valid is not None:
        allowed = (allowed & key_valid[:, None, None, :].to(device)) | (j == i)  # (b, 1, sq, sk)
    mask = torch.zeros(allowed.shape, dtype=work, device=device)
    mask = mask.masked_fill(~allowed, float("-inf"))
    if bias is not None:
        mask = mask + bias.to(work)
    return mask.to(dtype), False


def len_of(positions) -> int:
    return len(positions) if isinstance(positions, range) else positions.shape[-1]


def _sdpa(q, k, v, mask, is_causal, scale):
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )  # (b, heads, seq_q, head_dim)


def attend(
    q,
    k,
    v,
    encoding=None,
    *,
    q_positions=None,
    k_positions=None,
    causal=True,
    padding_mask=None,
):
    """Attention with a positional encoding: the functional core of :class:`MultiHeadAttention`.

    Applies the encoding's query/key hook, then scaled dot-product attention with its
    score bias, the causal mask (aligned to the end when ``seq_q < seq_k``) and the
    padding mask, with the encoding's softmax scale.

    Parameters
    ----------
    q : torch.Tensor
        Queries ``(batch, heads, seq_q, head_dim)``.
    k : torch.Tensor
        Keys ``(batch, kv_heads, seq_k, head_dim)``; ``kv_heads`` divides ``heads``.
    v : torch.Tensor
        Values ``(batch, kv_heads, seq_k, head_dim)``.
    encoding : PositionalEncoding, optional
        Default :class:`~posenc.torch.NoPE`.
    q_positions : torch.Tensor or range, optional
        Default: the last ``seq_q`` key positions.
    k_positions : torch.Tensor or range, optional
        ``(seq_k,)`` or ``(batch, seq_k)``; default ``0 .. seq_k - 1``.
    causal : bool
        Causal attention.
    padding_mask : torch.Tensor, optional
        Bool ``(batch, seq_k)``, ``True`` for real keys.

    Returns
    -------
    torch.Tensor
        ``(batch, heads, seq_q, head_dim)``.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import RotaryEmbedding, attend
    >>> q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    >>> attend(q, k, v, RotaryEmbedding(8, max_len=16)).shape
    torch.Size([1, 4, 6, 8])
    """
    enc = NoPE() if encoding is None else check_encoding(encoding)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-D, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, h, sq, hd = q.shape
    sk = k.shape[2]
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or h % k.shape[1]:
        raise ValueError(
            "k and v must be (batch, kv_heads, seq_k, ·) with kv_heads dividing heads, got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if causal and sq > sk:
        raise ValueError(f"causal attention needs seq_q <= seq_k, got {sq} and {sk}")
    k_pos = position_arg(k_positions, b, sk)
    if q_positions is None:
        q_pos = range(sk - sq, sk) if isinstance(k_pos, range) else k_pos[:, sk - sq :]
    else:
        q_pos = position_arg(q_positions, b, sq)
    valid = None if padding_mask is None else check_padding_mask(padding_mask, b, sk)
    q, k = enc.encode_qk(q, k, q_pos, k_pos)
    mask, is_causal = attention_mask(
        enc, q_pos, k_pos, causal=causal, key_valid=valid, dtype=q.dtype, device=q.device
    )
    return _sdpa(q, k, v, mask, is_causal, enc.softmax_scale(hd))


def check_padding_mask(padding_mask, batch, seq):
    if padding_mask.shape != (batch, seq) or padding_mask.dtype != torch.bool:
        raise ValueError(
            f"padding_mask must be a bool tensor of shape ({batch}, {seq}), "
            f"got {padding_mask.dtype} {tuple(padding_mask.shape)}"
        )
    return padding_mask


@dataclass
class Step:
    """What every attention layer of one model step shares (built once by :func:`plan`)."""

    q_positions: object  # range or (b|1, n) tensor
    k_positions: object  # range or (b|1, n_keys) tensor
    mask: torch.Tensor | None
    is_causal: bool
    cache: KVCache | None
    start: int  # first cache slot of this step


def plan(encoding, batch, n, positions, padding_mask, cache, *, causal, dtype, device) -> Step:
    """Positions, cache slots and the attention mask of one step, for all its layers."""
    if padding_mask is not None:
        check_padding_mask(padding_mask, batch, n)
    if cache is None:
        q_pos = k_pos = position_arg(positions, batch, n)
        start, key_valid = 0, padding_mask
    else:
        start, q_pos, k_pos, key_valid = cache._begin(positions, padding_mask, batch, n)
    mask, is_causal = attention_mask(
        encoding, q_pos, k_pos, causal=causal, key_valid=key_valid, dtype=dtype, device=device
    )
    return Step(q_pos, k_pos, mask, is_causal, cache, start)


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with a pluggable encoding, grouped-query heads and a KV cache.

    Uses :func:`torch.nn.functional.scaled_dot_product_attention`; the encoding's score
    bias, the causal mask and the padding mask are merged into one float ``attn_mask``.

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
    ):
        super().__init__()
        self.dim = check_int("dim", dim, minimum=1)
        self.heads = check_int("heads", heads, minimum=1)
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads={heads}, got dim={dim}")
        self.kv_heads = heads if kv_heads is None else check_int("kv_heads", kv_heads, minimum=1)
        if heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads={heads}, got kv_heads={self.kv_heads}")
        self.head_dim = dim // heads
        self.encoding = NoPE() if encoding is None else check_encoding(encoding)
        self.causal = bool(causal)
        self.qkv = nn.Linear(dim, (heads + 2 * self.kv_heads) * self.head_dim, bias=bias)
        self.out = nn.Linear(dim, dim, bias=bias)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty one-layer :class:`~posenc.torch.KVCache` in this module's dtype and device.

        Parameters
        ----------
        batch : int
            Batch size of the calls that will use it.
        max_len : int
            Capacity in tokens.

        Returns
        -------
        posenc.torch.KVCache
            Pass it as ``cache=`` to ``forward``.
        """
        return _new_cache(self, 1, batch, max_len)

    def forward(self, x, positions=None, padding_mask=None, *, cache=None):
        """Attend over ``x`` (and over the cached tokens, if a cache is given).

        Parameters
        ----------
        x : torch.Tensor
            Input, shape ``(batch, seq, dim)``.
        positions : torch.Tensor or range, optional
            Int positions ``(seq,)`` or ``(batch, seq)`` of the new tokens. Default
            ``0 .. seq - 1``, or with a cache: one past each row's last cached position (the
            cache's length when it was filled with default positions).
        padding_mask : torch.Tensor, optional
            Bool ``(batch, seq)``, ``True`` for real tokens. Padding keys get no weight,
            now and, when cached, in every later step.
        cache : posenc.torch.KVCache, optional
            From :meth:`new_cache`; the new keys and values are appended to it.

        Returns
        -------
        torch.Tensor
            Shape ``(batch, seq, dim)``.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape (batch, seq, dim={self.dim}), got {tuple(x.shape)}"
            )
        step = plan(
            self.encoding, *x.shape[:2], positions, padding_mask, cache,
            causal=self.causal, dtype=x.dtype, device=x.device,
        )  # fmt: skip
        return self._attend_step(x, step, layer=0)

    def _attend_step(self, x, step: Step, layer: int) -> torch.Tensor:
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
        if cache is None:
            q, k = enc.encode_qk(q, k, step.q_positions, step.k_positions, inplace=inplace)
        elif enc.caches_encoded_keys:
            q, k = enc.encode_qk(q, k, step.q_positions, step.q_positions, inplace=inplace)
            k, v = cache._store(layer, step.start, k, v)  # (b, kvh, n_keys, ·)
        else:  # the cache keeps raw keys; all of them are encoded for this step
            k, v = cache._store(layer, step.start, k, v)  # (b, kvh, n_keys, hd)
            q, k = enc.encode_qk(q, k, step.q_positions, step.k_positions)
        y = _sdpa(q, k, v, step.mask, step.is_causal, enc.softmax_scale(hd))  # (b, h, n, hd)
        return self.out(y.transpose(1, 2).reshape(b, n, h * hd))  # (b, n, dim)

    def extra_repr(self):
        return f"dim={self.dim}, heads={self.heads}, kv_heads={self.kv_heads}, causal={self.causal}"


def _new_cache(module, layers, batch, max_len):
    """A cache sized for ``module`` (an attention layer or a model holding them)."""
    attn = module if isinstance(module, MultiHeadAttention) else module.blocks[0].attn
    enc, hd = attn.encoding, attn.head_dim
    key_dim = enc.qk_dim(hd) if enc.caches_encoded_keys else hd
    weight = attn.qkv.weight
    return KVCache(
        layers=layers, batch=batch, max_len=max_len, kv_heads=attn.kv_heads,
        key_dim=key_dim, value_dim=hd, dtype=weight.dtype, device=weight.device,
    )  # fmt: skip


def share_encoding(attn: MultiHeadAttention, encoding: PositionalEncoding) -> None:
    """Let ``attn`` use ``encoding`` without owning it: one copy in the model's state_dict."""
    attn._modules.pop("encoding", None)
    attn.__dict__["encoding"] = check_encoding(encoding)
