"""The evicting cache (StreamingLLM): sink tokens and a recent window, both position conventions.

The oracle for a one-layer model is a full forward over exactly the kept tokens at their
positions (a one-layer model's keys depend on their own token only). For deeper models
(whose cached keys remember the context they were computed in) the oracle is a growing
:class:`~posenc.torch.KVCache` that keeps every token and hides the evicted ones.
"""

from __future__ import annotations

import pytest
import torch

from posenc.torch import (
    ALiBi,
    Layer,
    RotaryEmbedding,
    Schedule,
    TransformerLM,
    evicting_cache,
)

SINK, WINDOW, STEPS = 4, 8, 96  # decode 8 x (sink + window) = 12 x the window


def _kept(t):
    """Token indices the cache holds after token ``t`` is appended."""
    if t + 1 <= SINK + WINDOW:
        return list(range(t + 1))
    return list(range(SINK)) + list(range(t + 1 - WINDOW, t + 1))


def _lm(encoding, depth=1, sinks=False, backend="sdpa", dtype=torch.float64):
    torch.manual_seed(0)
    sched = Schedule([Layer(encoding, sinks=sinks)] * depth)
    lm = TransformerLM(40, 32, depth, 4, kv_heads=2, schedule=sched, backend=backend)
    lm = lm.to(dtype).eval()
    if sinks:
        with torch.no_grad():
            for b in lm.blocks:
                b.attn.sinks.normal_(0, 2)
    return lm


ENCODINGS = {"rope": lambda: RotaryEmbedding(8, max_len=256), "alibi": lambda: ALiBi(4)}


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("convention", ["cache", "original"])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_decoding_past_the_window_equals_a_forward_over_the_kept_tokens(name, convention, sinks):
    lm = _lm(ENCODINGS[name](), sinks=sinks)
    ids = torch.randint(0, 40, (2, STEPS), generator=torch.Generator().manual_seed(1))
    cache = evicting_cache(lm, 2, sink_tokens=SINK, window=WINDOW, positions=convention)
    worst = 0.0
    with torch.no_grad():
        lm(ids[:, :6], cache=cache)
        for t in range(6, STEPS):
            got = lm(ids[:, t : t + 1], cache=cache)[:, -1]  # (2, vocab)
            kept = _kept(t)
            pos = torch.arange(len(kept)) if convention == "cache" else torch.tensor(kept)
            want = lm(ids[:, kept], positions=pos)[:, -1]
            worst = max(worst, float((got - want).abs().max()))
    assert cache.evicted == STEPS - SINK - WINDOW
    assert worst < 1e-12
    if convention == "cache":  # no position past the cache
        assert int(cache.positions.max()) == SINK + WINDOW - 1


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_a_deep_model_with_original_positions_equals_a_cache_that_hides_the_evicted(backend):
    dtype = torch.float64 if backend == "sdpa" else torch.float32
    lm = _lm(RotaryEmbedding(8, max_len=256), depth=3, sinks=True, backend=backend, dtype=dtype)
    ids = torch.randint(0, 40, (1, 60), generator=torch.Generator().manual_seed(2))
    ev = evicting_cache(lm, 1, sink_tokens=SINK, window=WINDOW)
    full = lm.new_cache(1, 60)  # keeps everything; the evicted ones hidden by hand
    worst = 0.0
    with torch.no_grad():
        lm(ids[:, :5], cache=ev)
        lm(ids[:, :5], cache=full)
        for t in range(5, 60):
            got = lm(ids[:, t : t + 1], cache=ev)
            full.padded = True  # read the validity of every cached token
            full.valid[:, : t] = False
            full.valid[:, _kept(t)[:-1]] = True
            want = lm(ids[:, t : t + 1], cache=full)
            worst = max(worst, float((got - want).abs().max()))
    assert worst < (1e-12 if dtype == torch.float64 else 1e-5)


def test_the_two_conventions_differ_once_tokens_are_evicted():
    lm = _lm(RotaryEmbedding(8, max_len=256))
    ids = torch.randint(0, 40, (1, 30), generator=torch.Generator().manual_seed(3))
    outs = {}
    for convention in ("cache", "original"):
        cache = evicting_cache(lm, 1, sink_tokens=SINK, window=WINDOW, positions=convention)
        with torch.no_grad():
            outs[convention] = torch.cat([lm(ids[:, t : t + 1], cache=cache) for t in range(30)], 1)
    same = (outs["cache"] - outs["original"]).abs().amax(-1)[0]  # (30,)
    assert same[: SINK + WINDOW].max() < 1e-12  # nothing evicted yet: the same positions
    assert same[SINK + WINDOW :].min() > 1e-6


def test_what_the_evicting_cache_refuses():
    lm = _lm(RotaryEmbedding(8, max_len=256))
    cache = evicting_cache(lm, 1, sink_tokens=2, window=4, positions="cache")
    x = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="takes no padding_mask"):
        lm(x, padding_mask=torch.ones(1, 3, dtype=torch.bool), cache=cache)
    with pytest.raises(ValueError, match="positions must not be given with positions='cache'"):
        lm(x, positions=torch.arange(3), cache=cache)
    with pytest.raises(ValueError, match="a step of 7 tokens does not fit"):
        lm(torch.zeros(1, 7, dtype=torch.long), cache=cache)
    lm(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="a step of 5 tokens does not fit"):
        lm(torch.zeros(1, 5, dtype=torch.long), cache=cache)  # would evict its own first
    assert len(cache) == 5 and cache.evicted == 0  # a refused step leaves no trace
    with pytest.raises(ValueError, match="positions must be one of"):
        evicting_cache(lm, 1, sink_tokens=2, window=4, positions="slots")
    with pytest.raises(ValueError, match="sink_tokens must be"):
        evicting_cache(lm, 1, sink_tokens=-1, window=4)
    with pytest.raises(ValueError, match="window must be"):
        evicting_cache(lm, 1, sink_tokens=2, window=0)


@pytest.mark.parametrize("convention", ["cache", "original"])
def test_a_step_that_fails_after_evicting_leaves_the_cache_as_it_was(convention):
    lm = _lm(RotaryEmbedding(8, max_len=16), depth=2)
    cache = evicting_cache(lm, 1, sink_tokens=2, window=4, positions=convention)
    with torch.no_grad():
        lm(torch.arange(6)[None], cache=cache)
        for t in range(6, 9):
            lm(torch.tensor([[t]]), cache=cache)  # evicting already
        before = ([b.clone() for b in cache.keys + cache.values], cache.positions.clone(),
                  cache.next_position.clone(), len(cache), cache.evicted)  # fmt: skip
        bad = {"positions": torch.tensor([[16]])} if convention == "original" else {}
        if convention == "cache":  # fail inside the step, after the eviction
            lm.blocks[1].attn.qkv.register_forward_hook(_raise)
        with pytest.raises(ValueError):
            lm(torch.tensor([[9]]), cache=cache, **bad)
        after = ([b.clone() for b in cache.keys + cache.values], cache.positions.clone(),
                 cache.next_position.clone(), len(cache), cache.evicted)  # fmt: skip
    assert all(torch.equal(x, y) for x, y in zip(before[0], after[0], strict=True))
    assert torch.equal(before[1], after[1]) and torch.equal(before[2], after[2])
    assert before[3:] == after[3:]


def _raise(module, args, out):
    raise ValueError("a layer fails")


def test_positions_cache_refuses_a_model_with_input_positions():
    from posenc.torch import SinusoidalEncoding

    lm = TransformerLM(40, 32, 1, 4, encoding=SinusoidalEncoding(32, max_len=64))
    with pytest.raises(ValueError, match="SinusoidalEncoding added positions to the input"):
        evicting_cache(lm, 1, sink_tokens=2, window=4, positions="cache")
    evicting_cache(lm, 1, sink_tokens=2, window=4, positions="original")  # fine
