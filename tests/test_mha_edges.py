"""MultiHeadAttention: argument refusals at their boundaries, documented defaults, the values
of a forward pass against a float64 NumPy reference, cache refusals, the ``inplace`` and
``out=`` contracts towards an encoding, raw-key caching, and ``share_encoding``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from expect import raises_exactly

from posenc.torch import (
    KVCache,
    MultiHeadAttention,
    PoPE,
    PositionalEncoding,
    StaticKVCache,
    TransformerLM,
)
from posenc.torch.model.mha import share_encoding


def _reference(attn, x, scale=None, bias=None, width=1):
    """Plain causal softmax attention of ``attn``'s weights in float64 (NumPy).

    ``width``: the encoding concatenates ``width`` copies of each query and key;
    ``bias``: ``(heads, n, n)`` added to the scaled scores.
    """
    w = attn.qkv.weight.detach().double().numpy()
    wo = attn.out.weight.detach().double().numpy()
    xs = x.detach().double().numpy()
    b, n, _ = xs.shape
    h, kvh, hd = attn.heads, attn.kv_heads, attn.head_dim
    qkv = (xs @ w.T).reshape(b, n, h + 2 * kvh, hd)
    q, k, v = qkv[:, :, :h], qkv[:, :, h : h + kvh], qkv[:, :, h + kvh :]
    group = h // kvh
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # head i uses i // group
    scale = hd**-0.5 if scale is None else scale
    s = width * np.einsum("bihd,bjhd->bhij", q, k) * scale
    if bias is not None:
        s = s + bias[None]
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = np.einsum("bhij,bjhd->bihd", p, v).reshape(b, n, h * hd)
    return y @ wo.T


class _Spy(PositionalEncoding):
    """Leaves q, k unchanged and records the ``inplace`` flag of every ``encode_qk`` call."""

    def __init__(self):
        super().__init__()
        self.flags = []

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        self.flags.append(inplace)
        return q, k


class _Doubled(PositionalEncoding):
    """Keys and queries become ``[q, q]``: ``qk_dim = 2 head_dim``; the cache keeps raw keys."""

    caches_encoded_keys = False

    def qk_dim(self, head_dim):
        return 2 * head_dim

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        return torch.cat([q, q], -1), torch.cat([k, k], -1)


class _Distance(PositionalEncoding):
    """Bias ``-0.25 (h + 1) |i - j|`` written into ``out`` when given; records each ``out``."""

    heads = 2

    def __init__(self):
        super().__init__()
        self.outs = []

    def score_bias(self, q_positions, k_positions, *, out=None):
        self.outs.append(out)
        i = torch.as_tensor(list(q_positions), dtype=torch.float32)[:, None]
        j = torch.as_tensor(list(k_positions), dtype=torch.float32)[None]
        slope = 0.25 * torch.arange(1, 3, dtype=torch.float32)[:, None, None]
        bias = (-slope * (i - j).abs())[None]  # (1, 2, sq, sk)
        return bias if out is None else out.copy_(bias)


# -- constructor -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        ((0, 1), {}, "dim must be >= 1, got 0"),
        ((-4, 1), {}, "dim must be >= 1, got -4"),
        (("8", 2), {}, "dim must be an integer, got '8'"),
        ((8, 0), {}, "heads must be >= 1, got 0"),
        ((8, -2), {}, "heads must be >= 1, got -2"),
        ((8, 2.0), {}, "heads must be an integer, got 2.0"),
        ((8, 2), {"kv_heads": 0}, "kv_heads must be >= 1, got 0"),
        ((8, 2), {"kv_heads": -1}, "kv_heads must be >= 1, got -1"),
        ((8, 2), {"kv_heads": True}, "kv_heads must be an integer, got True"),
    ],
)
def test_bad_sizes_are_refused_by_name(args, kw, message):
    with raises_exactly(message):
        MultiHeadAttention(*args, **kw)


def test_smallest_sizes_are_accepted_and_exact():
    torch.manual_seed(0)
    attn = MultiHeadAttention(1, 1)  # dim = heads = kv_heads = head_dim = 1
    assert (attn.dim, attn.heads, attn.kv_heads, attn.head_dim) == (1, 1, 1, 1)
    x = torch.randn(1, 3, 1, dtype=torch.float64)
    attn.double()
    np.testing.assert_allclose(attn(x).detach().numpy(), _reference(attn, x), rtol=1e-12)
    gqa = MultiHeadAttention(4, 4, kv_heads=1)  # one head of width 1, shared by all
    assert (gqa.heads, gqa.kv_heads, gqa.head_dim) == (4, 1, 1)
    assert MultiHeadAttention(4, 1).heads == 1


def test_defaults_are_mha_causal_without_bias():
    attn = MultiHeadAttention(8, 2)
    assert attn.kv_heads == 2 and attn.causal is True
    assert attn.qkv.bias is None and attn.out.bias is None
    assert attn.qkv.weight.shape == (3 * 8, 8)  # (heads + 2 kv_heads) * head_dim rows


def test_gqa_forward_matches_float64_softmax_reference():
    torch.manual_seed(1)
    attn = MultiHeadAttention(8, 4, kv_heads=2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    np.testing.assert_allclose(attn(x).detach().numpy(), _reference(attn, x), rtol=1e-10)


# -- caches ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cache", "name"), [({}, "dict"), (None, None), ("kv", "str")])
def test_a_cache_that_is_not_a_kvcache_is_refused(cache, name):
    attn = MultiHeadAttention(8, 2)
    x = torch.randn(1, 2, 8)
    if cache is None:  # None means no cache: accepted
        assert attn(x, cache=None).shape == (1, 2, 8)
        return
    with raises_exactly(f"cache must be a KVCache (from new_cache), got {name}"):
        attn(x, cache=cache)


def test_a_cache_of_another_module_shape_is_refused():
    cache = MultiHeadAttention(8, 2).new_cache(1, 4)
    with raises_exactly(
        "cache has (kv_heads, key_dim, value_dim) = (2, 4, 4), the model needs (4, 2, 2)"
        "; make the cache with the model's new_cache (after any .to())"
    ):
        MultiHeadAttention(8, 4)(torch.randn(1, 2, 8), cache=cache)


@pytest.mark.parametrize("static", [False, True])
def test_raw_key_cache_is_head_dim_wide_and_decodes_like_a_full_pass(static):
    torch.manual_seed(2)
    attn = MultiHeadAttention(8, 2, encoding=_Doubled()).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    want = _reference(attn, x, width=2)
    cache = attn.new_cache(1, 6, static=static)
    assert cache.keys[0].shape == (1, 2, 6, 4)  # raw keys: head_dim, not qk_dim = 8
    with torch.no_grad():
        ys = [attn(x[:, :3], cache=cache)] + [attn(x[:, i : i + 1], cache=cache) for i in (3, 4)]
    np.testing.assert_allclose(torch.cat(ys, 1).numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(attn(x).detach().numpy(), want, rtol=1e-10)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_raw_key_cache_decodes_over_the_whole_buffer_with_flex(monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention

    import posenc.torch.attention.run

    # eager FlexAttention (no compile): the flex plan attends over every cache slot
    run = posenc.torch.attention.run
    monkeypatch.setattr(run, "flex_attention_compiled", lambda device_type="cpu": flex_attention)
    torch.manual_seed(2)
    attn = MultiHeadAttention(8, 2, encoding=_Doubled(), backend="flex")  # flex: no float64
    x = torch.randn(1, 5, 8)
    cache = attn.new_cache(1, 6)
    with torch.no_grad():
        ys = [attn(x[:, :3], cache=cache)] + [attn(x[:, i : i + 1], cache=cache) for i in (3, 4)]
    want = _reference(attn.double(), x.double(), width=2)  # float64, from the same weights
    np.testing.assert_allclose(torch.cat(ys, 1).numpy(), want, rtol=1e-5, atol=1e-6)


def test_new_cache_is_growing_unless_static():
    attn = MultiHeadAttention(8, 2)
    assert type(attn.new_cache(1, 4)) is KVCache
    assert type(attn.new_cache(1, 4, static=True)) is StaticKVCache


# -- the contracts towards an encoding ----------------------------------------------------------


def test_projections_are_handed_over_inplace_only_outside_autograd():
    torch.manual_seed(3)
    spy = _Spy()
    attn = MultiHeadAttention(8, 2, encoding=spy)
    x = torch.randn(1, 3, 8)
    attn(x)  # trainable weights, grad enabled: q, k are in the graph
    attn.requires_grad_(False)
    attn(x)  # frozen weights: no graph, q and k are fresh and ours
    with torch.no_grad():
        attn.requires_grad_(True)
        attn(x)
        cache = attn.new_cache(1, 4)
        attn(x, cache=cache)  # cached keys (encoded before caching)
        attn(x[:, :1], cache=cache)
    assert spy.flags == [False, True, True, True, True]


def test_inference_calls_reuse_one_score_bias_buffer(no_kept_masks):
    torch.manual_seed(4)
    enc = _Distance()
    attn = MultiHeadAttention(8, 2, encoding=enc, backend="sdpa").double()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    n = np.arange(4)
    bias = -0.25 * np.arange(1, 3)[:, None, None] * np.abs(n[:, None] - n[None])
    with torch.no_grad():
        y1, y2 = attn(x), attn(x)
    assert enc.outs[0] is not None and enc.outs[1] is enc.outs[0]  # freed after each call
    want = _reference(attn, x, bias=bias)
    np.testing.assert_allclose(y1.numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(y2.numpy(), want, rtol=1e-10)


# -- share_encoding ----------------------------------------------------------------------------


def test_a_model_holds_its_encoding_once_in_its_module_tree():
    lm = TransformerLM(11, 8, 2, 2, encoding=PoPE(4, 2))
    found = [n for n, m in lm.named_modules() if isinstance(m, PositionalEncoding)]
    assert found == ["encoding"]
    assert [k for k in lm.state_dict() if "raw_delta" in k] == ["encoding.raw_delta"]
    assert all(b.attn.encoding is lm.encoding for b in lm.blocks)


def test_share_encoding_drops_the_owned_copy_and_can_be_repeated():
    own, shared, again = PoPE(4, 2), PoPE(4, 2), PoPE(4, 2)
    attn = MultiHeadAttention(8, 2, encoding=own)
    assert "encoding.raw_delta" in attn.state_dict()
    share_encoding(attn, shared)
    assert attn.encoding is shared and "encoding" not in dict(attn.named_children())
    assert list(attn.state_dict()) == ["qkv.weight", "out.weight"]
    share_encoding(attn, again)  # nothing owned left to drop
    assert attn.encoding is again
    assert list(attn.state_dict()) == ["qkv.weight", "out.weight"]


def test_extra_repr_gives_the_settings():
    mha = MultiHeadAttention(16, 4, kv_heads=2, encoding=PoPE(4, 4), causal=False)
    assert mha.extra_repr() == "dim=16, heads=4, kv_heads=2, causal=False, backend='auto'"
    mha = MultiHeadAttention(16, 4, encoding=PoPE(4, 4), window=3, chunk=5)
    assert mha.extra_repr().endswith("causal=True, backend='auto', window=3, chunk=5")
