"""Plain NumPy (float64) forward passes of MultiHeadAttention and TransformerLM.

Written from the definitions, with the modules' weights, so the torch code is checked
against something that shares none of its code: attention from ``posenc.attention``,
RoPE from ``posenc.rope``, the sinusoidal table from ``posenc.sinusoidal``.
"""

import math

import numpy as np

import posenc

_erf = np.vectorize(math.erf)


def _np(t):
    return None if t is None else t.detach().double().cpu().numpy()


def layer_norm(x, ln):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + ln.eps) * _np(ln.weight) + _np(ln.bias)


def gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def linear(x, lin):
    y = x @ _np(lin.weight).T
    return y if lin.bias is None else y + _np(lin.bias)


def mha(
    attn, x, positions, padding_mask=None, *, rope=None, encode_qk=None, scores=None, bias=None,
    causal=True, window=None, chunk=None, softmax_factor=1.0,
):  # fmt: skip
    """``attn`` on ``x`` (batch, seq, dim); ``positions`` int (batch, seq).

    ``rope``: keyword arguments of :func:`posenc.rope` to rotate q and k with;
    ``encode_qk``: a function ``(q, k, positions (batch, 1, seq)) -> (q, k)`` instead;
    ``scores``: a function ``(q, k, positions (batch, seq)) -> (batch, heads, seq, seq)``
    replacing ``q . k`` (then scaled by ``1 / sqrt(head_dim)``), e.g. PoPE's;
    ``bias``: a function ``(q_pos, k_pos) -> (batch|1, heads|1, seq, seq)`` added to scores;
    ``window`` / ``chunk``: query slot ``i`` sees key slot ``j`` only if ``i - window < j`` /
    ``i // chunk == j // chunk``; ``softmax_factor`` multiplies ``1 / sqrt(head_dim)``.
    """
    b, n, _ = x.shape
    h, kvh, hd = attn.heads, attn.kv_heads, attn.head_dim
    qkv = linear(x, attn.qkv).reshape(b, n, h + 2 * kvh, hd)
    q, k, v = qkv[:, :, :h], qkv[:, :, h : h + kvh], qkv[:, :, h + kvh :]
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # (b, ·, n, hd)
    k, v = (np.repeat(t, h // kvh, axis=1) for t in (k, v))  # query head i uses kv i // g
    if rope is not None:
        q, k = (posenc.rope(t, positions[:, None, :], **rope) for t in (q, k))
    if encode_qk is not None:
        q, k = encode_qk(q, k, positions[:, None, :])
    allowed = posenc.causal_mask(n) if causal else np.ones((n, n), bool)
    i, j = np.arange(n)[:, None], np.arange(n)[None]
    if window is not None:
        allowed = allowed & (j > i - window)
    if chunk is not None:
        allowed = allowed & (i // chunk == j // chunk)
    allowed = np.broadcast_to(allowed, (b, 1, n, n))
    q = q * softmax_factor
    if padding_mask is not None:
        allowed = (allowed & padding_mask[:, None, None, :]) | np.eye(n, dtype=bool)
    scores_bias = None if bias is None else bias(positions, positions)
    if scores is not None:  # the scores become the bias of an attention with q . k = 0
        raw = scores(q, k, positions) / np.sqrt(hd)
        scores_bias = raw if scores_bias is None else raw + scores_bias
        q, k = np.zeros_like(q), np.zeros_like(k)
    out, _ = posenc.attention(q, k, v, mask=allowed, bias=scores_bias)  # (b, h, n, hd)
    return linear(out.transpose(0, 2, 1, 3).reshape(b, n, h * hd), attn.out)


def lm(model, idx, positions=None, padding_mask=None, *, table=None, layers=None, **encoding):
    """Logits of ``model`` (a TransformerLM) for ``idx`` (batch, seq), in float64 NumPy.

    ``table``: the absolute table added to the embeddings (rows by position), if any;
    ``encoding``: keyword arguments of :func:`mha` (``rope``, ``encode_qk``, ``bias``...),
    the same for every layer, or ``layers``: one such dict per layer.
    """
    idx = np.asarray(idx)
    b, n = idx.shape
    positions = np.broadcast_to(np.arange(n), (b, n)) if positions is None else positions
    x = _np(model.embed.weight)[idx]  # (b, n, dim)
    if table is not None:
        x = x + table[positions]
    layers = [encoding] * len(model.blocks) if layers is None else layers
    for block, kw in zip(model.blocks, layers, strict=True):
        x = x + mha(
            block.attn, layer_norm(x, block.norm1), positions, padding_mask,
            causal=model.causal, **kw,
        )  # fmt: skip
        hidden = gelu(linear(layer_norm(x, block.norm2), block.mlp[0]))
        x = x + linear(hidden, block.mlp[2])
    return layer_norm(x, model.norm) @ _np(model.head.weight).T  # (b, n, vocab)
