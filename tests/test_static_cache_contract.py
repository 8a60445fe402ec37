"""StaticKVCache's contract beyond plain decoding: a step that fails after writing its slots
is undone, positions given as a range or per row continue correctly for chunks, buffers live
on the device asked for, and a refusal says the expected shape.
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
    cache = StaticKVCache(layers=1, batch=2, max_len=4, kv_heads=1, key_dim=2, value_dim=2,
                          device="meta")  # fmt: skip
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


def test_a_padding_mask_on_another_device_is_moved_to_the_cache(monkeypatch):
    # A CPU mask with a CUDA cache is the real case; a meta cache stands in for it here. The
    # eager check reads `filled` with int(), which meta cannot, so take the compiled branch
    # (a device-side assert), as torch.compile does.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cache = StaticKVCache(layers=1, batch=2, max_len=4, kv_heads=1, key_dim=2, value_dim=2,
                          device="meta")  # fmt: skip
    mask = torch.tensor([[False, True], [True, True]])  # on the CPU
    _, q_pos, k_pos, key_valid = cache._begin(None, mask, 2, 2)
    assert cache.valid.device.type == "meta" and key_valid.device.type == "meta"
    assert q_pos.shape == (2, 2) and k_pos.shape == key_valid.shape == (2, 4)
