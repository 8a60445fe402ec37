"""The flex backend's plan, checked eagerly (no torch.compile): every ``score_mod`` against the
encoding's ``score_bias`` (the SDPA path), and the block mask against SDPA's float mask.

``flex_attention`` itself is compiled (``compile``-marked tests elsewhere); what posenc adds
to it -- the score functions and the visibility rule -- is plain Python evaluated here on
index grids, so a mutation run without compiled tests still sees it.
"""

import pytest
import torch

from posenc.torch import FIRE, KERPLE, ALiBi, T5RelativeBias, attention_mask
from posenc.torch.attention.flex import flex_plan

ENCODINGS = {
    "alibi": lambda: ALiBi(4),
    "alibi_symmetric": lambda: ALiBi(4, symmetric=True),
    "t5": lambda: T5RelativeBias(4, num_buckets=8, max_distance=12, bidirectional=True),
    "kerple_log": lambda: KERPLE(4),
    "kerple_power": lambda: KERPLE(4, variant="power"),
    "fire": lambda: FIRE(4, hidden=8),
}

POSITIONS = {  # (q_positions, k_positions): shared ranges, an offset, per-row tensors
    "range": (range(7), range(7)),
    "decode": (range(9, 12), range(12)),
    "rows": (
        torch.tensor([[3, 4, 5], [0, 1, 2]]),
        torch.tensor([[0, 0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 1, 2]]),
    ),
}


def _grid(batch, heads, sq, sk):
    b = torch.arange(batch)[:, None, None, None]
    h = torch.arange(heads)[None, :, None, None]
    q = torch.arange(sq)[None, None, :, None]
    kv = torch.arange(sk)[None, None, None, :]
    return b, h, q, kv


def _rows(pos):
    return 1 if isinstance(pos, range) else pos.shape[0]


@pytest.mark.parametrize("where", list(POSITIONS))
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_score_mod_equals_score_bias(name, where):
    torch.manual_seed(0)
    enc = ENCODINGS[name]()
    if name == "t5":
        with torch.no_grad():
            enc.weight.normal_()  # distinct buckets, not N(0, 0.02^2) near-zeros
    qp, kp = POSITIONS[where]
    with torch.no_grad():
        bias = enc.score_bias(qp, kp)  # (b|1, heads, sq, sk)
        mod, _ = flex_plan(enc, qp, kp, causal=False)
        batch = max(_rows(qp), _rows(kp))
        sq, sk = len(qp) if isinstance(qp, range) else qp.shape[1], bias.shape[-1]
        b, h, q, kv = _grid(batch, 4, sq, sk)
        score = torch.full((batch, 4, sq, sk), 0.5)
        got = mod(score, b, h, q, kv)
    torch.testing.assert_close(got, 0.5 + bias.expand(batch, -1, -1, -1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("where", ["range", "decode"])
def test_block_mask_equals_the_sdpa_mask(where, padded, causal):
    qp, kp = POSITIONS[where]
    sq, sk = len(qp), len(kp)
    valid = None
    if padded:
        valid = torch.ones(2, sk, dtype=torch.bool)
        valid[0, :2] = False  # left padding in row 0
        valid[1, -1] = False  # a padding key that a query still sees as itself
    if not causal and valid is None:
        _, block = flex_plan(ALiBi(4), qp, kp, causal=False)
        assert block is None  # every key visible: no mask
        return
    _, block = flex_plan(ALiBi(4, symmetric=True), qp, kp, causal=causal, key_valid=valid)
    dense = block.to_dense()  # (b|1, 1, sq / 128, sk / 128) blocks: one block here
    assert dense.shape[-2:] == (1, 1) and bool(dense.all())
    b, h, q, kv = _grid(2 if padded else 1, 1, sq, sk)
    allowed = block.mask_mod(b, h, q, kv)  # (b|1, 1, sq, sk) bool
    mask, _ = attention_mask(
        ALiBi(4, symmetric=True), qp, kp, causal=causal, key_valid=valid, dtype=torch.float32
    )  # fmt: skip
    want = torch.isfinite(mask[:, :1])
    torch.testing.assert_close(allowed.expand_as(want), want)


def test_q_start_places_the_queries_in_a_full_cache_buffer():
    valid = torch.tensor([[True] * 6 + [False] * 4])  # 6 filled slots of 10
    _, block = flex_plan(ALiBi(2), range(4, 6), range(10), causal=True, key_valid=valid, q_start=4)
    b, h, q, kv = _grid(1, 1, 2, 10)
    got = block.mask_mod(b, h, q, kv)[0, 0]
    want = torch.tensor([[True] * 5 + [False] * 5, [True] * 6 + [False] * 4])
    torch.testing.assert_close(got, want)
