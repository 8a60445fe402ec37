"""StaticKVCache: decoding over a fixed-shape buffer equals the full forward, eager and compiled.

The models are those of ``tests/test_kv_cache.py`` (float64, grouped-query attention),
whose full forward is checked there against the NumPy model; here a static-cache decode
must reproduce that forward to 1e-10. The compiled tests count dynamo's graphs: after
the prefill and the first decode step, no step may compile again.
"""

import pytest
import torch
from test_kv_cache import LEFT_PAD, LEFT_POS, V, make_lm
from torch._dynamo.utils import counters

from posenc.torch import (
    ALiBi,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    StaticKVCache,
    TransformerLM,
)

ALL = ["nope", "sinusoidal", "learned", "rope_half", "rope_interleaved", "rope_longrope",
       "xpos", "pope", "score_bias", "alibi", "t5", "kerple", "fire"]  # fmt: skip
# one compiled test per encoding of each family: input, queries/keys, scores
FAMILIES = ["nope", "sinusoidal", "learned", "rope_half", "xpos", "pope", "alibi", "t5",
            "kerple", "fire"]  # fmt: skip


def decode_static(fn, lm, idx, prefill, positions=None, padding_mask=None, max_len=16):
    """Prefill ``prefill`` tokens into a static cache, then one token per call of ``fn``."""
    cache = lm.new_cache(idx.shape[0], max_len, static=True)
    sl = slice(0, prefill)
    pos = None if positions is None else positions[:, sl]
    pm = None if padding_mask is None else padding_mask[:, sl]
    out = [fn(idx[:, sl], pos, pm, cache=cache)]
    for t in range(prefill, idx.shape[1]):
        out.append(fn(idx[:, t : t + 1], cache=cache))
    assert len(cache) == idx.shape[1] and cache.keys[0].shape[2] == max_len
    return torch.cat(out, 1)


def tokens(batch=2, n=12, seed=1):
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("padded", [False, True])
def test_static_decode_equals_full_forward(name, padded):
    lm = make_lm(name)
    idx = tokens()
    pos, pm = (LEFT_POS, LEFT_PAD) if padded else (None, None)
    with torch.no_grad():
        full = lm(idx, pos, pm)
        static = decode_static(lm, lm, idx, 7, pos, pm)
    torch.testing.assert_close(static, full, rtol=0, atol=1e-10)


def test_static_cache_bidirectional_hides_unfilled_slots():
    # without a causal mask only the validity of the slots hides the unfilled ones
    torch.manual_seed(0)
    lm = TransformerLM(V, 16, 1, 4, encoding=ALiBi(4, symmetric=True), causal=False).double()
    idx = tokens(1, 5)
    with torch.no_grad():
        full = lm(idx)
        cache = lm.new_cache(1, 9, static=True)
        static = lm(idx, cache=cache)
        grown = lm(idx, cache=lm.new_cache(1, 5))
    torch.testing.assert_close(static, full, rtol=0, atol=1e-10)
    torch.testing.assert_close(grown, full, rtol=0, atol=1e-10)


def test_static_cache_state_errors_and_rollback():
    lm = make_lm("alibi", depth=1)
    cache = lm.new_cache(2, 4, static=True)
    assert isinstance(cache, StaticKVCache) and isinstance(cache, KVCache)
    assert cache.keys[0].shape == (2, 2, 4, 8) and len(cache) == 0
    with torch.no_grad():
        lm(tokens(2, 3), cache=cache)
        with pytest.raises(ValueError, match="cache is full: max_len=4, holds 3 tokens, got 2"):
            lm(tokens(2, 2), cache=cache)
        assert len(cache) == 3 and not bool(cache.valid[:, 3:].any())  # rolled back
        with pytest.raises(ValueError, match="batch must be 2"):
            lm(tokens(1, 1), cache=cache)
        last = lm(tokens(2, 4)[:, 3:], cache=cache)
    assert len(cache) == 4
    with torch.no_grad():
        full = lm(torch.cat([tokens(2, 3), tokens(2, 4)[:, 3:]], 1))
    torch.testing.assert_close(last, full[:, 3:], rtol=0, atol=1e-10)
    cache.reset()
    assert len(cache) == 0 and int(cache.filled) == 0 and not bool(cache.valid.any())
    with pytest.raises(ValueError, match="length is its tensor 'filled', got 2"):
        cache.length = 2
    short = TransformerLM(V, 16, 1, 4, encoding=ALiBi(4), max_len=8)
    with pytest.raises(ValueError, match="static cache must be <= the model's max_len=8, got 9"):
        short.new_cache(1, 9, static=True)
    assert short.new_cache(1, 9).max_len == 9  # a growing cache is checked per call
    single = short.blocks[0].attn.new_cache(1, 4, static=True)
    assert isinstance(single, StaticKVCache) and len(single.keys) == 1


def test_attention_layer_with_static_cache_equals_full_call():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, kv_heads=2, encoding=RotaryEmbedding(4, max_len=16))
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    attn = attn.double()
    cache = attn.new_cache(2, 10, static=True)
    with torch.no_grad():
        full = attn(x)
        steps = [attn(x[:, :4], cache=cache)] + [attn(x[:, t : t + 1], cache=cache)
                                                 for t in (4, 5)]  # fmt: skip
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-12)
    assert len(cache) == 6 and bool(cache.valid[:, :6].all()) and not cache.valid[:, 6:].any()


def compiled_decode(name, steps, prefill=3, batch=2, padded=False, again=False):
    """Eager and compiled static-cache decodes of ``steps`` tokens; graphs after warm-up.
    ``again``: then decode once more after ``cache.reset()`` (the same graphs must serve)."""
    lm = make_lm(name, depth=1)
    n = prefill + steps
    idx = tokens(batch, n)
    pos = pm = None
    if padded:
        pm = torch.ones(batch, n, dtype=torch.bool)
        pm[0, :2] = False  # row 0: two left-padding tokens
        pos = (pm.long().cumsum(1) - 1).clamp(min=0)
    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(lm, fullgraph=True)
    cache = lm.new_cache(batch, n, static=True)
    with torch.no_grad():
        first = pos if pos is None else pos[:, :prefill]
        mask = pm if pm is None else pm[:, :prefill]
        out = [fn(idx[:, :prefill], first, mask, cache=cache)]
        out.append(fn(idx[:, prefill : prefill + 1], cache=cache))
        warm = counters["stats"]["unique_graphs"]
        for t in range(prefill + 1, n):
            out.append(fn(idx[:, t : t + 1], cache=cache))
        if again:
            cache.reset()
            again = [fn(idx[:, :prefill], first, mask, cache=cache)]
            again += [fn(idx[:, t : t + 1], cache=cache) for t in range(prefill, n)]
            torch.testing.assert_close(torch.cat(again, 1), torch.cat(out, 1), rtol=0, atol=0)
        eager = decode_static(lm, lm, idx, prefill, pos, pm, max_len=n)
    return torch.cat(out, 1), eager, warm, counters["stats"]["unique_graphs"]


@pytest.mark.compile
@pytest.mark.parametrize("name", FAMILIES)
def test_compiled_static_decode_never_recompiles(name):
    compiled, eager, warm, graphs = compiled_decode(name, steps=4, padded=name == "rope_half")
    assert warm == 2  # the prefill and the decode step
    assert graphs == warm  # no recompile in the later steps
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-10)


@pytest.mark.compile
def test_compiled_static_decode_100_steps_one_graph():
    compiled, eager, warm, graphs = compiled_decode("alibi", steps=101, batch=1, again=True)
    assert (warm, graphs) == (2, 2)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-10)


# backend='flex' with a static cache is tested with eager FlexAttention in test_flex_paths.py:
# inside a whole-model torch.compile, inductor's CPU flex lowering fails (torch 2.13).
