"""Edge cases found in review: each test pins one silently-wrong (or silently costly) path."""

import threading

import numpy as np
import pytest
import torch

import posenc
from posenc.scaling import DynamicNTK
from posenc.torch import (
    ALiBi,
    MultiHeadAttention,
    RotaryEmbedding,
    T5RelativeBias,
    TransformerLM,
    XPos,
    attend,
    attention_mask,
)


def test_cache_stores_the_values_of_a_range_of_positions():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, encoding=ALiBi(4)).double().eval()
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 10]])
    with torch.no_grad():
        full = attn(x, positions)
        cache = attn.new_cache(1, 8)
        attn(x[:, :3], cache=cache)
        last = attn(x[:, 3:], range(10, 11), cache=cache)  # a range that skips ahead
    torch.testing.assert_close(last, full[:, 3:], rtol=0, atol=1e-12)
    assert cache.positions[0, :4].tolist() == [0, 1, 2, 10]
    rot = RotaryEmbedding(4, max_len=64)
    lm = TransformerLM(11, 16, 1, 4, encoding=rot).double().eval()
    idx = torch.randint(0, 11, (1, 5))
    with torch.no_grad():
        ref = lm(idx, range(5, 10))
        c = lm.new_cache(1, 5)
        lm(idx[:, :4], range(5, 9), cache=c)
        step = lm(idx[:, 4:], cache=c)  # continues at 9, after the range
    torch.testing.assert_close(step, ref[:, 4:], rtol=0, atol=1e-12)


def test_a_failed_step_leaves_the_cache_as_it_was():
    torch.manual_seed(1)
    lm = TransformerLM(11, 16, 1, 4, encoding=RotaryEmbedding(4, max_len=6)).double().eval()
    idx = torch.randint(0, 11, (1, 6))
    cache = lm.new_cache(1, 16)
    with torch.no_grad():
        lm(idx[:, :4], cache=cache)
        with pytest.raises(ValueError, match="positions must be < max_len=6, got 7"):
            lm(idx.repeat(1, 1)[:, :4], cache=cache)  # positions 4..7: past the table
        assert len(cache) == 4 and not cache.valid[0, 4:].any()
        step = lm(idx[:, 4:5], cache=cache)
        torch.testing.assert_close(step, lm(idx[:, :5])[:, 4:], rtol=0, atol=1e-12)


def test_public_attention_mask_returns_fresh_memory_and_no_workspace_without_a_bias():
    from posenc.torch.attention import mask as mask_mod

    with torch.no_grad():
        m1, _ = attention_mask(ALiBi(2), range(4), range(4), causal=True, heads=2,
                               dtype=torch.float32)  # fmt: skip
        m2, _ = attention_mask(ALiBi(2), range(5), range(5), causal=True, heads=2,
                               dtype=torch.float32)  # fmt: skip
    assert m1.data_ptr() != m2.data_ptr() and torch.isfinite(m1[0, 0].tril()).all()
    seen = {}

    def rope_only():
        attn = MultiHeadAttention(16, 4, encoding=RotaryEmbedding(4, max_len=64))
        with torch.no_grad():
            attn(torch.randn(1, 32, 16), padding_mask=torch.ones(1, 32, dtype=torch.bool))
        seen["mask"] = getattr(mask_mod._LOCAL, "mask", None)

    thread = threading.Thread(target=rope_only)
    thread.start()
    thread.join()
    assert seen["mask"] is None  # no bias: no (b, h, sq, sk) workspace kept


def test_device_moves_keep_the_float64_work_dtype():
    alibi = ALiBi(4).double()
    assert alibi.to("cpu").work_dtype == torch.float64
    assert alibi.float().work_dtype == torch.float32
    assert alibi.half().work_dtype == torch.float32
    bias = ALiBi(6).double().to("cpu")(range(3))
    assert bias.dtype == torch.float64


def test_length_dependent_rope_builds_its_table_where_the_input_is():
    rot = RotaryEmbedding(8, scaling=DynamicNTK(2.0, 4), max_len=64)
    q = torch.empty(1, 2, 10, 8, device="meta")
    qr, kr = rot(q, q)  # would fail with a CPU table
    assert qr.device.type == "meta" and qr.shape == q.shape


def test_meta_calls_keep_meta_tables_until_real_weights_are_loaded():
    # RoPE built on meta, run on meta q and k: shapes only, its tables stay on meta
    with torch.device("meta"):
        rope = RotaryEmbedding(8)
    q = torch.empty(1, 2, 4, 8, device="meta")
    qr, kr = rope(q, q)
    assert qr.is_meta and kr.is_meta and rope.cos_sin.is_meta
    # a real xPos given meta q and k: the keys' table too is looked up where k is
    xpos = XPos(8, max_len=16).double()
    q64 = torch.empty(1, 2, 4, 8, device="meta", dtype=torch.float64)
    assert all(t.is_meta for t in xpos.encode_qk(q64, q64, range(4), range(4)))
    # T5 built on meta (every parameter meta): its bucket table stays with the weight it
    # indexes, on meta, whatever device the positions are on; loading real weights with
    # assign=True builds it for real there, equal to a CPU-built module's
    with torch.device("meta"):
        t5 = T5RelativeBias(2, num_buckets=8, max_distance=16)
    for p in (torch.arange(3)[None], torch.arange(3, device="meta")[None]):
        assert t5.score_bias(p, p).is_meta and t5.bucket.is_meta
    t5.score_mod(range(3), range(3))  # FlexAttention's hook: the same rule
    assert t5.bucket.is_meta
    real = T5RelativeBias(2, num_buckets=8, max_distance=16)
    t5.load_state_dict(real.state_dict(), assign=True)
    p = torch.arange(3)[None]
    assert torch.equal(t5.score_bias(p, p), real.score_bias(p, p))
    assert t5.bucket.device.type == "cpu" and torch.equal(t5.bucket, real.bucket)


def test_attend_needs_query_positions_when_queries_outnumber_keys():
    q, k = torch.ones(1, 2, 6, 8), torch.ones(1, 2, 4, 8)
    with pytest.raises(ValueError, match="q_positions must be given when there are more"):
        attend(q, k, k, ALiBi(2, symmetric=True), causal=False)


def test_xpos_limits_are_exact():
    reach = XPos(8, max_len=64).window(torch.float32)
    XPos(8, max_len=2 * reach + 1)  # centre = reach: position 0 is exactly reach away
    with pytest.raises(ValueError, match="max_len must be <= "):
        XPos(8, max_len=2 * reach + 2)
    with pytest.raises(NotImplementedError, match="XPos has no Hugging Face config"):
        XPos.from_hf({})


def test_out_buffers_must_not_alias_each_other_or_the_input():
    rot = RotaryEmbedding(8, max_len=16)
    q = torch.randn(1, 1, 4, 8)
    buf = torch.empty_like(q)
    with pytest.raises(ValueError, match="out must be two buffers"):
        rot.rope(q, q, out=(buf, buf))
    big = torch.randn(2, 1, 4, 8)
    with pytest.raises(ValueError, match="out must not share memory with the input"):
        posenc.torch.apply_rope(big[:1], out=big[1:])  # same storage, other half


def test_score_encodings_validate_positions_and_causality():
    alibi = ALiBi(2)
    for bad in (torch.tensor([-5, 0]), torch.tensor([0.5, 1.5])):
        with pytest.raises(ValueError, match="q_positions must"):
            alibi(bad)
    with pytest.raises(ValueError, match="k_positions must have the batch of q_positions"):
        alibi(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="is for causal attention only"):
        MultiHeadAttention(16, 2, encoding=ALiBi(2), causal=False)
    with pytest.raises(ValueError, match="is for causal attention only"):
        TransformerLM(5, 16, 1, 2, encoding=ALiBi(2), causal=False)
    MultiHeadAttention(16, 2, encoding=ALiBi(2, symmetric=True), causal=False)  # fine
    q = torch.randn(1, 2, 3, 8)
    k = torch.randn(1, 2, 3, 8, requires_grad=True)
    with pytest.raises(ValueError, match="backend='flex' has no backward on the CPU"):
        attend(q, k, q, ALiBi(2), backend="flex")


def test_pope_scores_validate_2d_positions():
    with pytest.raises(ValueError, match="q_positions must be non-negative"):
        posenc.pope_scores(np.ones((2, 3, 4)), np.ones((2, 3, 4)), [[0, 1, 2], [0, -1, 2]], 3)
    got = posenc.pope_scores(np.ones((2, 3, 4)), np.ones((2, 3, 4)), [[0, 1, 2], [5, 6, 7]], 3)
    assert got.shape == (2, 3, 3)


@pytest.mark.compile
def test_flex_decoding_with_a_cache_compiles_once_per_shape():
    from torch._dynamo.utils import counters

    torch.manual_seed(2)
    lm = TransformerLM(11, 16, 1, 2, encoding=ALiBi(2), backend="flex").eval()
    idx = torch.randint(0, 11, (1, 12))
    cache = lm.new_cache(1, 12)
    with torch.no_grad():
        lm(idx[:, :4], cache=cache)
        lm(idx[:, 4:5], cache=cache)  # first decode step: compiles
        before = counters["stats"]["unique_graphs"]
        for t in range(5, 12):
            lm(idx[:, t : t + 1], cache=cache)
    assert counters["stats"]["unique_graphs"] == before  # later steps reuse it
