"""The KV cache's contract in full: where its buffers live, what each refusal says, a 1-D
range step into a grid cache, and a failed step followed by another failed step.

Companion of ``tests/test_kv_cache.py`` (cached decode == full forward); here each check
pins one behaviour a user meets when a cache and a model do not fit together.
"""

from __future__ import annotations

import pytest
import torch
from expect import raises_exactly

import posenc
from posenc.torch import KVCache, MRoPE, MultiHeadAttention, RotaryEmbedding

DIM, HEADS, KV = 48, 4, 2
HD = DIM // HEADS
MADE = "; make the cache with the model's new_cache (after any .to())"


def _mha(enc, dtype=torch.float64):
    torch.manual_seed(0)
    return MultiHeadAttention(DIM, HEADS, kv_heads=KV, encoding=enc).to(dtype)


def test_every_buffer_lives_on_the_device_asked_for():
    cache = KVCache(layers=2, batch=2, max_len=5, kv_heads=2, key_dim=4, value_dim=3,
                    dtype=torch.float16, device="meta")  # fmt: skip
    for t in (*cache.keys, *cache.values, cache.positions, cache.valid):
        assert t.device.type == "meta"
    assert cache.positions.dtype == torch.long and cache.valid.dtype == torch.bool
    assert cache.keys[1].dtype == torch.float16 and cache.values[0].shape == (2, 2, 5, 3)


def test_a_cache_that_does_not_fit_the_model_says_what_differs():
    attn = _mha(RotaryEmbedding(HD, max_len=32))
    x = torch.zeros(2, 3, DIM, dtype=torch.float64)
    shape = dict(batch=2, max_len=8, kv_heads=KV, key_dim=HD, value_dim=HD)
    bad = [
        (KVCache(layers=1, **shape, dtype=torch.float32),
         f"cache holds torch.float32, the model computes in torch.float64{MADE}"),
        (KVCache(layers=1, **shape, dtype=torch.float64, device="meta"),
         f"cache is on meta, the model on cpu{MADE}"),
        (KVCache(layers=1, **{**shape, "kv_heads": 4}, dtype=torch.float64),
         f"cache has (kv_heads, key_dim, value_dim) = (4, {HD}, {HD}), the model needs "
         f"({KV}, {HD}, {HD}){MADE}"),
    ]  # fmt: skip
    for cache, message in bad:
        with raises_exactly(message):
            attn(x, cache=cache)


def test_keys_of_another_batch_size_are_refused_with_the_expected_shape():
    cache = KVCache(layers=1, batch=3, max_len=4, kv_heads=2, key_dim=5, value_dim=5)
    cache._begin(None, None, 3, 2)
    with raises_exactly("keys must have shape (batch, kv_heads, n, key_dim) = (3, 2, n, 5), "
                "got (2, 2, 2, 5)"):  # fmt: skip
        cache._store(0, 0, torch.zeros(2, 2, 2, 5), torch.zeros(2, 2, 2, 5))


def test_a_range_step_into_a_grid_cache_is_the_text_point_p_p_p():
    # text + image with M-RoPE grid positions, then text given as a plain range: the range
    # is widened to the points (p, p, p), exactly as the grid positions of that text say
    attn = _mha(MRoPE(HD, sections=(2, 2, 2), max_len=32))
    pos = torch.from_numpy(posenc.mrope_positions([3, (1, 4, 6), 4], spatial_merge=2))
    pos = pos[None].expand(2, -1, -1)  # (2, 13, 3); the last 4 tokens are text at 6..9
    x = torch.randn(2, 13, DIM, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    full = attn(x, pos)
    cache = attn.new_cache(2, 13)
    first = attn(x[:, :9], pos[:, :9], cache=cache)
    text = attn(x[:, 9:], range(6, 10), cache=cache)
    torch.testing.assert_close(torch.cat([first, text], 1), full, rtol=1e-10, atol=1e-10)
    assert cache.positions[:, 9:].tolist() == [[[p] * 3 for p in range(6, 10)]] * 2
    # a cache shared with a layer of another grid (the encodings check their own axes first)
    grid = KVCache(layers=1, batch=2, max_len=4, kv_heads=1, key_dim=2, value_dim=2)
    grid._begin(torch.zeros(2, 1, 3, dtype=torch.long), None, 2, 1)
    grid._commit()
    with raises_exactly("positions must have n_axes=3 (the cache's), got torch.Size([2, 1, 2])"):
        grid._begin(torch.zeros(2, 1, 2, dtype=torch.long), None, 2, 1)


def test_two_failed_steps_in_a_row_leave_the_cache_as_it_was():
    attn = _mha(RotaryEmbedding(HD, max_len=8))
    x = torch.randn(2, 4, DIM, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    cache = attn.new_cache(2, 16)
    attn(x[:, :2], cache=cache)
    before = cache.positions.clone()
    with pytest.raises(ValueError, match="max_len"):  # RoPE refuses positions 9, 10
        attn(x[:, :2], range(9, 11), cache=cache)
    with pytest.raises(ValueError, match="^positions must be non-negative"):
        attn(x[:, :1], torch.tensor([[-1], [-1]]), cache=cache)
    assert len(cache) == 2 and torch.equal(cache.positions, before)
    assert not cache.valid[:, 2:].any()
    torch.testing.assert_close(attn(x[:, 2:], cache=cache), attn(x)[:, 2:], rtol=1e-10, atol=0)


def test_range_positions_in_a_grid_cache_are_built_on_the_cache_device():
    # a cache on meta (standing in for an accelerator) widened to 3 axes by a grid step;
    # a later text step given as a range becomes (1, n, 3) coordinates on the cache's device
    cache = KVCache(layers=1, batch=1, max_len=8, kv_heads=1, key_dim=4, value_dim=4,
                    device="meta")  # fmt: skip
    cache._grid_positions(torch.zeros(1, 2, 3, dtype=torch.long, device="meta"))
    q_pos = cache._grid_positions(range(2, 4))
    assert q_pos.device.type == "meta" and q_pos.shape == (1, 2, 3)
    on_cpu = KVCache(layers=1, batch=1, max_len=8, kv_heads=1, key_dim=4, value_dim=4)
    on_cpu._grid_positions(torch.zeros(1, 2, 3, dtype=torch.long))
    assert on_cpu._grid_positions(range(2, 4)).tolist() == [[[2, 2, 2], [3, 3, 3]]]


def _state(cache):
    """What a step may write, copied (last_document is read only while packed)."""
    names = ["positions", "valid", "documents", "next_position", "filled",
             "length", "packed", "contiguous", "padded"]  # fmt: skip
    got = {n: getattr(cache, n) for n in names if hasattr(cache, n)}
    return {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in got.items()}


def _same(a, b):
    assert a.keys() == b.keys()
    for n in a:
        same = torch.equal(a[n], b[n]) if isinstance(a[n], torch.Tensor) else a[n] == b[n]
        assert same, n


@pytest.mark.parametrize("prefill", [1, 3])
def test_a_failed_step_after_a_packed_prefill_leaves_no_trace(prefill):
    # a packed prefill (documents) of 1 or 3 tokens; a step RoPE refuses (position 8 >=
    # max_len) after the cache wrote it: the cache is as before, and decoding continues
    # each row's last document exactly as a cache that never saw the failure
    attn = _mha(RotaryEmbedding(HD, max_len=8))
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    docs = torch.tensor([[0, 0, 1], [0, 1, 1]])[:, :prefill]
    caches = [attn.new_cache(2, 8), attn.new_cache(2, 8)]
    for cache in caches:
        attn(x[:, :prefill], cache=cache, documents=docs)
    before = _state(caches[0])
    assert before["packed"]
    with pytest.raises(ValueError, match="max_len"):
        attn(x[:, prefill : prefill + 2], range(7, 9), cache=caches[0])
    _same(_state(caches[0]), before)
    got, want = (attn(x[:, prefill:], cache=c) for c in caches)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(caches[0].documents, caches[1].documents)


def test_a_failed_packed_prefill_leaves_an_empty_cache_unpacked():
    attn = _mha(RotaryEmbedding(HD, max_len=4))
    x = torch.randn(1, 6, DIM, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    cache, fresh = attn.new_cache(1, 8), attn.new_cache(1, 8)
    before = _state(cache)
    with pytest.raises(ValueError, match="max_len"):  # positions 0..4 of one document
        attn(x[:, :5], cache=cache, documents=torch.zeros(1, 5, dtype=torch.long))
    _same(_state(cache), before)
    # a plain prompt next: no document carried over from the failed step
    torch.testing.assert_close(attn(x[:, :3], cache=cache), attn(x[:, :3], cache=fresh))
    _same(_state(cache), _state(fresh))


@pytest.mark.parametrize("static", [False, True], ids=["KVCache", "StaticKVCache"])
def test_a_failed_grid_step_leaves_no_trace(static):
    # M-RoPE coordinates (batch, n, 3) in the cache; a step past max_len is undone in every
    # axis, and the next step continues as on a cache that never saw it
    attn = _mha(MRoPE(HD, sections=(2, 2, 2), max_len=12))
    pos = torch.from_numpy(posenc.mrope_positions([2, (1, 2, 4), 3], spatial_merge=2))
    pos = pos[None].expand(2, -1, -1)  # (2, 7, 3): text, a 1x1x2 image, text at 4..6
    x = torch.randn(2, 7, DIM, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    caches = [attn.new_cache(2, 7, static=static) for _ in range(2)]
    for cache in caches:
        attn(x[:, :4], pos[:, :4], cache=cache)
    before = _state(caches[0])
    bad = torch.tensor([[[12, 0, 0], [13, 0, 0]]]).expand(2, -1, -1)
    with pytest.raises(ValueError, match="max_len"):
        attn(x[:, 4:6], bad, cache=caches[0])
    _same(_state(caches[0]), before)
    got, want = (attn(x[:, 4:], pos[:, 4:], cache=c) for c in caches)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, attn(x, pos)[:, 4:], rtol=1e-10, atol=1e-10)
