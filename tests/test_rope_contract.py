"""RotaryEmbedding and apply_rope at their edges: length-dependent scaling when queries and
keys have different positions, an explicit ``seq_len``, defaults and every refusal's message.

The reference is the NumPy ``posenc.rope`` (float64, cache-free) given the length that
the scaling must see: the last position of queries *and* keys, plus one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from expect import raises_exactly

import posenc
from posenc.scaling import DynamicNTK
from posenc.torch import RotaryEmbedding, apply_rope

HD = 8
SCALING = DynamicNTK(2.0, 8)  # the rates change for every length past 8


def _ref(x, positions, seq_len):
    """NumPy RoPE of (batch, heads, seq, HD) ``x`` with the scaling at length ``seq_len``."""
    out = posenc.rope(x.numpy(), np.asarray(positions), scaling=SCALING, seq_len=seq_len)
    return torch.from_numpy(out)


@pytest.mark.parametrize(
    ("q_pos", "k_pos"),
    [
        (range(14, 16), range(16)),  # decoding: queries last, keys all
        (range(2), range(16)),  # queries early: the length still comes from the keys
        (torch.tensor([[3, 1]]), torch.arange(16)[None]),  # tensors, not ranges
        (range(12), range(5)),  # keys shorter: the length comes from the queries
    ],
)
def test_dynamic_scaling_takes_one_length_from_queries_and_keys(q_pos, k_pos):
    g = torch.Generator().manual_seed(0)
    q_len = len(q_pos) if isinstance(q_pos, range) else q_pos.shape[-1]
    k_len = len(k_pos) if isinstance(k_pos, range) else k_pos.shape[-1]
    q = torch.randn(1, 2, q_len, HD, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, k_len, HD, generator=g, dtype=torch.float64)
    length = 1 + max(max(q_pos) if isinstance(q_pos, range) else int(q_pos.max()),
                     max(k_pos) if isinstance(k_pos, range) else int(k_pos.max()))  # fmt: skip
    rq, rk = RotaryEmbedding(HD, scaling=SCALING, max_len=64).encode_qk(q, k, q_pos, k_pos)
    qp = np.asarray(list(q_pos) if isinstance(q_pos, range) else q_pos[0])
    kp = np.asarray(list(k_pos) if isinstance(k_pos, range) else k_pos[0])
    torch.testing.assert_close(rq, _ref(q, qp, length), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rk, _ref(k, kp, length), rtol=1e-12, atol=1e-12)


def test_dynamic_scaling_with_shared_positions_uses_their_length():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 12, HD, generator=g, dtype=torch.float64)
    rope = RotaryEmbedding(HD, scaling=SCALING, max_len=64)
    for pos in (range(12), torch.arange(12)[None]):
        rq, rk = rope.encode_qk(q, q.clone(), pos, pos)
        torch.testing.assert_close(rq, _ref(q, np.arange(12), 12), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(rk, rq, rtol=0, atol=0)


@pytest.mark.parametrize("seq_len", [1, 9, 16])
def test_apply_rope_feeds_seq_len_to_a_length_dependent_scaling(seq_len):
    x = torch.randn(1, 2, 1, HD, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = apply_rope(x, torch.tensor([0]), scaling=SCALING, seq_len=seq_len)
    torch.testing.assert_close(out, _ref(x, [0], seq_len), rtol=1e-12, atol=1e-12)
    out = apply_rope(x, torch.tensor([5]), scaling=SCALING, seq_len=seq_len + 7)
    torch.testing.assert_close(out, _ref(x, [5], seq_len + 7), rtol=1e-12, atol=1e-12)
    if seq_len > 9:  # the length is not the position's: at 6 the rates are the defaults
        assert not torch.allclose(out, _ref(x, [5], 6))


def test_apply_rope_refusals():
    x = torch.zeros(1, 1, 2, HD)
    with raises_exactly("seq_len must be >= 1, got 0"):
        apply_rope(x, scaling=SCALING, seq_len=0)
    with raises_exactly("seq_len must be an integer, got 2.5"):
        apply_rope(x, scaling=SCALING, seq_len=2.5)
    with raises_exactly("x must have shape (batch, heads, seq, head_dim), got (2, 8)"):
        apply_rope(torch.zeros(2, HD))


def test_rotary_embedding_defaults_and_refusals():
    rope = RotaryEmbedding(HD)
    assert rope.max_len == 4096 and rope.base == 10_000.0 and rope.pairing == "half"
    assert RotaryEmbedding(HD, max_len=1).max_len == 1
    with raises_exactly("max_len must be >= 1, got 0"):
        RotaryEmbedding(HD, max_len=0)
    with raises_exactly("max_len must be an integer, got 2.0"):
        RotaryEmbedding(HD, max_len=2.0)
    q4, k3 = torch.zeros(1, 2, 3, HD), torch.zeros(1, 2, 3)  # same size at dim 2: only 3-D
    shapes = "q and k must be 4-D with the same seq, got"
    with raises_exactly(f"{shapes} (1, 2, 3, {HD}) and (1, 2, 3)"):
        rope(q4, k3)
    with raises_exactly(f"{shapes} (1, 2, 3) and (1, 2, 3, {HD})"):
        rope(k3, q4)
    with raises_exactly(f"{shapes} (1, 2, 3, {HD}) and (1, 2, 4, {HD})"):
        rope(q4, torch.zeros(1, 2, 4, HD))
