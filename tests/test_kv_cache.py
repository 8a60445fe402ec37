"""KV cache, grouped-query attention and generation: cached decode equals the full forward.

Every model here has ``kv_heads < heads`` (grouped-query attention) and runs in float64,
so two computations of the same logits agree to ~1e-13; the bound is 1e-10. The full
forward itself is checked against the plain NumPy model of ``tests/reference.py``.
"""

import numpy as np
import pytest
import reference
import torch

import posenc
from posenc.scaling import DynamicNTK, LongRoPE
from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    LearnedEncoding,
    MultiHeadAttention,
    NoPE,
    PoPE,
    PositionalEncoding,
    RotaryEmbedding,
    SinusoidalEncoding,
    T5RelativeBias,
    TransformerLM,
    XPos,
    attend,
    position_tensor,
)

V, DIM, HEADS, KV, MAX = 13, 32, 4, 2, 64
HD = DIM // HEADS


class DistancePenalty(PositionalEncoding):
    """A score-bias encoding defined here: ``-(m - n) / 4`` per head (one ALiBi slope)."""

    def score_bias(self, q_positions, k_positions):
        qp, kp = position_tensor(q_positions), position_tensor(k_positions)  # (b|1, n)
        return -(qp[:, None, :, None] - kp[:, None, None, :]).double() / 4  # (b, 1, sq, sk)


def np_bias(qp, kp):
    return -(qp[:, None, :, None] - kp[:, None, None, :]) / 4.0


ROPE_SHORT = tuple(1.0 + 0.1 * np.arange(3))  # one factor per rotated pair (rotary_dim 6)
ROPE_LONG = tuple(2.0 + 0.5 * np.arange(3))
LONG = LongRoPE(ROPE_SHORT, ROPE_LONG, 4, 4.0)  # original length 4: long for every test here


def _np(t):
    return t.detach().double().numpy()


def _t5_bias(enc):
    def bias(qp, kp):
        rel = kp[:, None, :] - qp[:, :, None]  # key - query
        buckets = posenc.t5_buckets(rel, bidirectional=False, num_buckets=16, max_distance=20)
        return _np(enc.weight)[buckets].transpose(0, 3, 1, 2)  # (b, heads, sq, sk)

    return bias


def _fire_bias(enc):
    first, last = enc.mlp[0], enc.mlp[2]
    weights = {
        "c": enc.log_c.exp().item(),
        "threshold": enc.log_threshold.exp().item(),
        "w1": _np(first.weight)[:, 0],
        "b1": _np(first.bias),
        "w2": _np(last.weight),
        "b2": _np(last.bias),
    }
    return lambda qp, kp: posenc.fire_bias(qp, kp, **weights)


def _pope(enc):
    delta = _np(enc.raw_delta)  # (heads, head_dim)

    def scores(q, k, pos):  # pos: (b, seq); delta per query head
        return np.stack([
            posenc.pope_scores(q[b], k[b], pos[b], pos[b], delta=delta) for b in range(len(q))
        ])  # fmt: skip

    return scores


def _xpos(q, k, pos):
    return posenc.xpos(q, pos, scale_base=32.0), posenc.xpos(k, pos, scale_base=32.0, key=True)


# name -> (encoding factory, NumPy reference keyword arguments of reference.lm, given the encoding)
ENCODINGS = {
    "nope": (NoPE, lambda enc: {}),
    "sinusoidal": (
        lambda: SinusoidalEncoding(DIM, max_len=MAX),
        lambda enc: {"table": posenc.sinusoidal(MAX, DIM)},
    ),
    "learned": (lambda: LearnedEncoding(MAX, DIM), lambda enc: {"table": _np(enc.weight)}),
    "rope_half": (lambda: RotaryEmbedding(HD, max_len=MAX), lambda enc: {"rope": {}}),
    "rope_interleaved": (
        lambda: RotaryEmbedding(HD, pairing="interleaved", max_len=MAX),
        lambda enc: {"rope": {"pairing": "interleaved"}},
    ),
    "rope_longrope": (
        lambda: RotaryEmbedding(HD, scaling=LONG, rotary_dim=6, max_len=MAX),
        lambda enc: {"rope": {"scaling": LONG, "rotary_dim": 6}},
    ),
    "xpos": (lambda: XPos(HD, scale_base=32.0, max_len=MAX), lambda enc: {"encode_qk": _xpos}),
    "score_bias": (DistancePenalty, lambda enc: {"bias": np_bias}),
    "alibi": (
        lambda: ALiBi(HEADS),
        lambda enc: {"bias": lambda q, k: posenc.alibi_bias(posenc.alibi_slopes(HEADS), q, k)},
    ),
    "t5": (
        lambda: T5RelativeBias(HEADS, num_buckets=16, max_distance=20),
        lambda enc: {"bias": _t5_bias(enc)},
    ),
    "kerple": (
        lambda: KERPLE(HEADS),
        lambda enc: {
            "bias": lambda q, k: posenc.kerple_bias(q, k, _np(enc.r1), _np(enc.r2), variant="log")
        },
    ),
    "fire": (lambda: FIRE(HEADS, hidden=8, threshold=6.0), lambda enc: {"bias": _fire_bias(enc)}),
    "pope": (lambda: PoPE(HD, HEADS, delta_init="uniform"), lambda enc: {"scores": _pope(enc)}),
}


def make_lm(name, depth=2, seed=0, backend="sdpa"):
    torch.manual_seed(seed)
    enc = ENCODINGS[name][0]()
    lm = TransformerLM(V, DIM, depth, HEADS, kv_heads=KV, encoding=enc, backend=backend)
    return lm.double().eval()


def reference_kwargs(name, lm):
    return ENCODINGS[name][1](lm.encoding)


def decode(lm, idx, prefill, positions=None, padding_mask=None, *, pass_positions=False):
    """Prefill ``prefill`` tokens into a cache, then one token per call; all logits."""
    cache = lm.new_cache(idx.shape[0], idx.shape[1])
    sl = slice(0, prefill)
    pos = None if positions is None else positions[:, sl]
    pm = None if padding_mask is None else padding_mask[:, sl]
    out = [lm(idx[:, sl], pos, pm, cache=cache)]
    for t in range(prefill, idx.shape[1]):
        pos = positions[:, t : t + 1] if pass_positions else None
        out.append(lm(idx[:, t : t + 1], pos, cache=cache))
    assert len(cache) == idx.shape[1]
    return torch.cat(out, 1)


LEFT_PAD = torch.tensor([[False] * 3 + [True] * 9, [True] * 12])
LEFT_POS = (LEFT_PAD.long().cumsum(1) - 1).clamp(min=0)  # row 0: 0 0 0 0 1 2 ...


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("padded", [False, True])
def test_cached_decode_equals_full_forward_and_numpy(name, padded):
    lm = make_lm(name)
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    pos, pm = (LEFT_POS, LEFT_PAD) if padded else (None, None)
    with torch.no_grad():
        full = lm(idx, pos, pm)
        cached = decode(lm, idx, 7, pos, pm)  # decode continues each row after its last position
        explicit = decode(lm, idx, 7, pos, pm, pass_positions=True) if padded else cached
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-10)
    torch.testing.assert_close(explicit, full, rtol=0, atol=1e-10)
    np_pos = None if pos is None else pos.numpy()
    np_pm = None if pm is None else pm.numpy()
    ref = reference.lm(lm, idx.numpy(), np_pos, np_pm, **reference_kwargs(name, lm))
    np.testing.assert_allclose(full.numpy(), ref, rtol=0, atol=1e-10)
    if padded:  # the real tokens of row 0 equal a run of them alone
        with torch.no_grad():
            alone = lm(idx[:1, 3:])
        torch.testing.assert_close(full[:1, 3:], alone, rtol=0, atol=1e-10)


def test_length_dependent_scaling_each_step_equals_full_forward_of_its_prefix():
    # Dynamic NTK changes the rates with the length, so a full forward is not causal: the
    # logits of position t depend on the total length. Each decode step must equal the full
    # forward of its own prefix (one layer: earlier layers would see earlier tables).
    torch.manual_seed(0)
    enc = RotaryEmbedding(HD, scaling=DynamicNTK(2.0, 8), max_len=MAX)
    assert not enc.caches_encoded_keys  # keys are re-rotated with each step's table
    lm = TransformerLM(V, DIM, 1, HEADS, kv_heads=KV, encoding=enc).double().eval()
    idx = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cached = decode(lm, idx, 6)
        for t in range(6, 16):
            prefix = lm(idx[:, : t + 1])[:, -1]
            torch.testing.assert_close(cached[:, t], prefix, rtol=0, atol=1e-10)
        ref = reference.lm(lm, idx.numpy(), rope={"scaling": DynamicNTK(2.0, 8)})
        np.testing.assert_allclose(lm(idx).numpy(), ref, rtol=0, atol=1e-10)
        # the scaling is active past 8 tokens: the last step differs from plain RoPE's
        plain = TransformerLM(V, DIM, 1, HEADS, kv_heads=KV, encoding=RotaryEmbedding(HD))
        plain.load_state_dict(lm.state_dict())
        assert (plain.double()(idx)[:, -1] - cached[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("static", [False, True])
def test_length_dependent_scaling_after_a_padded_prefill_continues_each_row(static):
    # once padding was given the cache continues each row after its own largest position
    # (a tensor, no longer a range); the length dynamic NTK reads (largest position + 1)
    # must be the one the full forward of the prefix reads
    torch.manual_seed(0)
    enc = RotaryEmbedding(HD, scaling=DynamicNTK(2.0, 8), max_len=MAX)
    lm = TransformerLM(V, DIM, 1, HEADS, kv_heads=KV, encoding=enc).double().eval()
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = lm.new_cache(2, 12, static=static)
        got = [lm(idx[:, :5], None, LEFT_PAD[:, :5], cache=cache)[:, -1]]
        got += [lm(idx[:, t : t + 1], cache=cache)[:, -1] for t in range(5, 12)]
        for t in range(4, 12):  # each step: the full forward of its prefix
            want = lm(idx[:, : t + 1], None, LEFT_PAD[:, : t + 1])[:, -1]
            torch.testing.assert_close(got[t - 4], want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_an_empty_step_stores_nothing_and_moves_no_position(static, padded):
    # zero new tokens, with positions left to the cache or given as an empty range far
    # ahead: nothing is stored, the next position stays, the next token is the full forward's
    torch.manual_seed(0)
    rope = RotaryEmbedding(HD, max_len=8)  # the empty range lies past its table
    lm = TransformerLM(V, DIM, 1, HEADS, kv_heads=KV, encoding=rope).double()
    idx = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(4))
    pad = LEFT_PAD[:, 3:9] if padded else None  # row 0 starts with 2 pad tokens
    with torch.no_grad():
        cache = lm.new_cache(2, 8, static=static)
        lm(idx[:, :5], None, None if pad is None else pad[:, :5], cache=cache)
        before = cache.next_position.clone()
        for positions in (None, range(9, 9)):
            assert lm(idx[:, 5:5], positions, cache=cache).shape == (2, 0, V)
            assert len(cache) == 5 and torch.equal(cache.next_position, before)
        got = lm(idx[:, 5:], cache=cache)[:, -1]
        torch.testing.assert_close(got, lm(idx, None, pad)[:, -1], rtol=0, atol=1e-10)


def test_a_fresh_cache_remembers_only_position_0_for_its_zeroed_slots():
    # dynamic NTK re-rotates the cached keys with their stored positions: a fresh cache
    # must not claim position 1 is stored when its table holds one row (max_len 1)
    torch.manual_seed(0)
    enc = RotaryEmbedding(HD, scaling=DynamicNTK(2.0, 1), max_len=1)
    lm = TransformerLM(V, DIM, 1, HEADS, kv_heads=KV, encoding=enc).double()
    idx = torch.tensor([[3]])
    with torch.no_grad():
        got = lm(idx, torch.tensor([[0]]), cache=lm.new_cache(1, 1))
        torch.testing.assert_close(got, lm(idx), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["rope_half", "score_bias", "sinusoidal"])
def test_generate_same_tokens_with_and_without_cache(name):
    lm = make_lm(name, seed=3)
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a = lm.generate(prompt, 9)
        b = lm.generate(prompt, 9, use_cache=False)
        pm = torch.tensor([[False, False, True, True, True], [True] * 5])
        c = lm.generate(prompt, 6, padding_mask=pm)
        d = lm.generate(prompt, 6, use_cache=False, padding_mask=pm)
        alone = lm.generate(prompt[:1, 2:], 6)  # row 0 without its padding
    assert torch.equal(a, b) and a.shape == (2, 14) and torch.equal(a[:, :5], prompt)
    assert torch.equal(c, d)
    assert torch.equal(c[0, 5:], alone[0, 3:])
    # greedy: each appended token is the argmax of the logits of its prefix
    with torch.no_grad():
        assert torch.equal(a[:, 5], lm(prompt)[:, -1].argmax(-1))
    assert torch.equal(lm.generate(prompt, 0), prompt)


def test_mha_with_cache_gqa_and_padding_matches_numpy():
    torch.manual_seed(5)
    enc = RotaryEmbedding(HD, pairing="interleaved", max_len=MAX)
    attn = MultiHeadAttention(DIM, HEADS, kv_heads=1, bias=True, encoding=enc).double().eval()
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    pm = torch.tensor([[False, True, True, True, True, True, True, True, True], [True] * 9])
    pos = (pm.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        full = attn(x, pos, pm)
        cache = attn.new_cache(2, 9)
        parts = [attn(x[:, :4], pos[:, :4], pm[:, :4], cache=cache)]
        parts += [attn(x[:, t : t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-10)
    ref = reference.mha(attn, x.numpy(), pos.numpy(), pm.numpy(), rope={"pairing": "interleaved"})
    np.testing.assert_allclose(full.numpy(), ref, rtol=0, atol=1e-10)


def test_causal_mask_is_aligned_to_the_end_when_queries_are_fewer():
    torch.manual_seed(6)
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 7, 8, dtype=torch.float64).unbind(0)
    out = attend(q, k, v, causal=True)  # queries are key slots 4, 5, 6
    kr, vr = (np.repeat(t.numpy(), 2, axis=1) for t in (k, v))
    ref, _ = posenc.attention(q.numpy(), kr, vr, mask=posenc.causal_mask(3, 7))
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    top_left, _ = posenc.attention(q.numpy(), kr, vr, mask=np.tril(np.ones((3, 7), bool)))
    assert np.abs(out.numpy() - top_left).max() > 1e-3  # SDPA's is_causal would be wrong


def test_cache_bad_input():
    lm = make_lm("rope_half")
    cache = lm.new_cache(2, 4)
    assert cache.keys[0].dtype == torch.float64 and cache.keys[0].shape == (2, KV, 4, HD)
    with pytest.raises(ValueError, match="batch must be 2 \\(the cache's\\), got 1"):
        lm(torch.zeros(1, 2, dtype=torch.long), cache=cache)
    lm(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="cache is full: max_len=4, holds 3 tokens, got 2 more"):
        lm(torch.zeros(2, 2, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="kv_heads must divide heads=4, got kv_heads=3"):
        MultiHeadAttention(DIM, HEADS, kv_heads=3)
    with pytest.raises(ValueError, match="padding_mask must be a bool tensor of shape \\(2, 1\\)"):
        lm(torch.zeros(2, 1, dtype=torch.long), padding_mask=torch.ones(2, 2, dtype=torch.bool))
    small = TransformerLM(V, DIM, 1, HEADS, encoding=NoPE(), max_len=4)
    c = small.new_cache(1, 8)
    small(torch.zeros(1, 3, dtype=torch.long), cache=c)
    with pytest.raises(ValueError, match="sequence length must be <= max_len=4, got 5"):
        small(torch.zeros(1, 2, dtype=torch.long), cache=c)
    cache.reset()
    assert len(cache) == 0


@pytest.mark.compile
@pytest.mark.parametrize("name", ["alibi", "rope_half", "t5"])
def test_flex_backend_cached_decode_equals_sdpa_full_forward(name):
    lm = make_lm(name, backend="flex").float()  # FlexAttention runs float32 here
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        flex_cached = decode(lm, idx, 7, LEFT_POS, LEFT_PAD)
        lm.blocks.apply(lambda m: setattr(m, "backend", "sdpa") if hasattr(m, "backend") else None)
        sdpa_full = lm(idx, LEFT_POS, LEFT_PAD)
    torch.testing.assert_close(flex_cached, sdpa_full, rtol=1e-4, atol=1e-4)


def test_chunk_after_per_row_positions_continues_each_row():
    # prefill with per-row positions, then a 3-token chunk with no positions: each row
    # continues from its own last position + 1, + 2, + 3 (the chunk is not one token)
    lm = make_lm("rope_half")
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, V, (2, 9), generator=g)
    pos = torch.stack([torch.arange(9) + 5, torch.arange(9) + 40])  # (2, 9)
    full = lm(idx, pos)
    cache = lm.new_cache(2, 9)
    first = lm(idx[:, :6], pos[:, :6], cache=cache)
    chunk = lm(idx[:, 6:], cache=cache)
    torch.testing.assert_close(torch.cat([first, chunk], 1), full, rtol=1e-10, atol=1e-10)


def test_kv_cache_arguments_and_stored_shapes():
    from posenc.torch import KVCache

    ok = dict(layers=1, batch=1, max_len=1, kv_heads=1, key_dim=1, value_dim=1, position_axes=1)
    cache = KVCache(**ok)  # every size may be 1
    assert cache.keys[0].shape == (1, 1, 1, 1)
    assert cache.positions.shape == (1, 1) and cache.positions.dtype == torch.long
    assert cache.documents.shape == (1, 1) and cache.documents.dtype == torch.long
    for name in ok:
        with pytest.raises(ValueError, match=rf"^{name} must be >= 1, got 0"):
            KVCache(**{**ok, name: 0})
    cache = KVCache(layers=1, batch=2, max_len=4, kv_heads=2, key_dim=3, value_dim=3)
    cache._begin(None, None, 2, 2)
    for k in (torch.zeros(2, 1, 2, 3), torch.zeros(2, 2, 2, 4)):  # wrong heads, wrong dim
        with pytest.raises(ValueError, match=r"\(2, 2, n, 3\), got"):
            cache._store(0, 0, k, k)
