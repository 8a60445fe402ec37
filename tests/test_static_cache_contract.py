"""StaticKVCache's contract beyond plain decoding: a step that fails after writing its slots
is undone, positions given as a range or per row continue correctly for chunks, buffers live
on the device asked for, a refusal says the expected shape, the compiled full-cache check,
the causal fast path, and commits/rollbacks with nothing pending.
"""

from __future__ import annotations

import pytest
import torch
from expect import raises_exactly

from posenc.torch import MultiHeadAttention, RotaryEmbedding, StaticKVCache

DIM, HEADS, KV = 16, 4, 2
HD = DIM // HEADS


def _attn():
    torch.manual_seed(0)
    return MultiHeadAttention(DIM, HEADS, kv_heads=KV, encoding=RotaryEmbedding(HD, max_len=12))


def _x(n=10):
    return torch.randn(2, n, DIM, generator=torch.Generator().manual_seed(1))


def _cache(batch=2, max_len=4, device=None):
    return StaticKVCache(layers=1, batch=batch, max_len=max_len, kv_heads=1, key_dim=2,
                         value_dim=2, device=device)  # fmt: skip


def test_a_step_that_fails_after_writing_its_slots_is_undone():
    attn, x = _attn(), _x()
    cache = attn.new_cache(2, 14, static=True)
    with torch.no_grad():
        first = attn(x[:, :3], cache=cache)
        valid, positions = cache.valid.clone(), cache.positions.clone()
        with pytest.raises(ValueError, match="max_len=12"):  # RoPE refuses 12, 13 ...
            attn(x[:, 3:5], range(12, 14), cache=cache)  # ... after the slots were written
        assert int(cache.filled) == 3
        assert torch.equal(cache.valid, valid) and torch.equal(cache.positions, positions)
        rest = attn(x[:, 3:], cache=cache)  # continues at position 3 as if nothing happened
        full = attn(x)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("given", ["range", "tensor"])
def test_given_positions_then_chunks_continue_each_row(given):
    # prefill at positions 5.. (a range) or per row (a tensor), then 3-token chunks with no
    # positions: every row continues after its own last position, + 1, + 2, + 3
    attn, x = _attn(), _x(9)
    pos = torch.stack([torch.arange(9) + 1, torch.arange(9) + 2]) if given == "tensor" else None
    prefill = range(1, 4) if given == "range" else pos[:, :3]
    full_pos = torch.arange(1, 10)[None] if given == "range" else pos
    cache = attn.new_cache(2, 9, static=True)
    with torch.no_grad():
        out = [attn(x[:, :3], prefill, cache=cache)]
        out += [attn(x[:, i : i + 3], cache=cache) for i in (3, 6)]
        full = attn(x, full_pos)
    torch.testing.assert_close(torch.cat(out, 1), full, rtol=1e-5, atol=1e-6)
    assert cache.positions[:, :9].tolist() == full_pos.expand(2, 9).tolist()


def test_every_buffer_lives_on_the_device_asked_for():
    cache = _cache(device="meta")
    for t in (cache.filled, cache.next_position, cache.slots, cache.positions, cache.valid,
              cache.keys[0], cache.values[0]):  # fmt: skip
        assert t.device.type == "meta"
    assert cache.next_position.shape == (2, 1) and cache.slots.shape == (4,)


def test_keys_of_another_shape_are_refused_with_the_expected_shape():
    cache = StaticKVCache(layers=1, batch=2, max_len=4, kv_heads=3, key_dim=5, value_dim=5)
    cache._begin(None, None, 2, 1)
    for k in (torch.zeros(2, 2, 1, 5), torch.zeros(2, 3, 1, 4)):  # wrong heads; wrong width
        expected = "keys must have shape (batch, kv_heads, n, key_dim) = (2, 3, n, 5)"
        message = f"{expected}, got {tuple(k.shape)}"
        with raises_exactly(message):
            cache._store(0, cache.filled, k, k)


def test_a_padding_mask_on_another_device_is_moved_to_the_cache_when_traced(monkeypatch):
    # A CPU mask with a CUDA cache is the real case; a meta cache stands in for it here. The
    # eager check reads `filled` with int(), which meta cannot, so take the compiled branch
    # (a device-side assert), as torch.compile does. A plain call first, so that mutmut's
    # stats (blind while is_compiling is patched) see this test reach _begin.
    _cache()._begin(None, None, 2, 1)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cache = _cache(device="meta")
    mask = torch.tensor([[False, True], [True, True]])  # on the CPU
    _, q_pos, k_pos, key_valid, _ = cache._begin(None, mask, 2, 2)
    assert cache.valid.device.type == "meta" and key_valid.device.type == "meta"
    assert q_pos.shape == (2, 2) and k_pos.shape == key_valid.shape == (2, 4)


@pytest.mark.parametrize("positions", [None, "range", "tensor"])
def test_every_step_kind_builds_its_indices_on_the_cache_device(monkeypatch, positions):
    # slots, range positions and CPU per-row positions all land where the (meta) cache lives
    _cache()._begin(None, None, 2, 1)  # plain call first, for mutmut's stats (as above)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cache = _cache(device="meta")
    given = {None: None, "range": range(1, 3), "tensor": torch.tensor([[1, 2], [3, 4]])}
    _, q_pos, k_pos, _, _ = cache._begin(given[positions], None, 2, 2)
    cache._commit()
    _, q_next, _, _, _ = cache._begin(None, None, 2, 1)  # continues every row (or the slots)
    assert {t.device.type for t in (q_pos, k_pos, q_next, cache._new_slots)} == {"meta"}


def test_compiled_branch_refuses_a_step_past_the_end_through_the_checking_op(monkeypatch):
    # Under torch.compile the full-cache check is the checking op on the new slots, which the
    # writes depend on (a ValueError on the CPU, a device assert on CUDA: no sync); take that
    # branch eagerly. A plain call first, so mutmut's stats see this test reach _begin.
    cache = _cache(max_len=4)
    cache._begin(None, None, 2, 1)
    cache._rollback()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cache._begin(None, None, 2, 4)  # exactly fills the buffer: allowed
    cache._rollback()
    cache._begin(None, None, 2, 3)
    cache._commit()
    before = cache.keys[0].clone()
    msg = "cache slots must be < max_len=4, got 4; the StaticKVCache is full (adding 2)"
    with raises_exactly(msg):  # 3 + 2 > 4
        cache._begin(None, None, 2, 2)
    assert torch.equal(cache.keys[0], before) and int(cache.filled) == 3


def test_plain_causal_steps_share_one_key_row_and_leave_masking_to_causality():
    # the documented fast path of _begin: no positions and no padding ever given -> keys at
    # (1, max_len) positions and key_valid None, on a fresh cache and again after a reset
    cache = _cache(batch=3, max_len=5)
    for _ in range(2):
        _, q_pos, k_pos, key_valid, _ = cache._begin(None, None, 3, 2)
        assert key_valid is None and k_pos.shape == (1, 5) and q_pos.tolist() == [[0, 1]]
        cache._commit()
        cache._begin(None, torch.ones(3, 1, dtype=torch.bool), 3, 1)  # padding: per row now
        cache._commit()
        _, _, k_pos, key_valid, _ = cache._begin(None, None, 3, 1)
        assert key_valid is not None and k_pos.shape == key_valid.shape == (3, 5)
        cache._commit()
        cache.reset()
    _, _, k_pos, key_valid, _ = cache._begin(range(0, 2), None, 3, 2)  # positions: per row too
    assert key_valid is not None and k_pos.shape == (3, 5)


def test_commit_or_rollback_without_a_pending_step_changes_nothing():
    cache = _cache()
    cache._begin(None, None, 2, 2)
    cache._commit()
    valid, positions = cache.valid.clone(), cache.positions.clone()
    cache._commit()  # a second commit counts nothing
    cache._rollback()  # nothing to undo
    cache._begin(None, None, 2, 1)
    cache._rollback()
    cache._commit()  # the step was undone: nothing to count
    assert int(cache.filled) == 2 and cache.next_position.tolist() == [[2], [2]]
    assert torch.equal(cache.valid, valid) and torch.equal(cache.positions, positions)


def test_keys_and_values_of_another_dtype_are_stored_in_the_cache_dtype():
    cache = _cache()
    cache._begin(None, None, 2, 1)
    k = torch.full((2, 1, 1, 2), 1 / 3, dtype=torch.float64)
    keys, values = cache._store(0, cache.filled, k, -k)
    assert keys.dtype == values.dtype == torch.get_default_dtype()
    torch.testing.assert_close(keys[:, :, :1], k.float(), rtol=0, atol=0)
    torch.testing.assert_close(values[:, :, :1], -k.float(), rtol=0, atol=0)
