"""Score encodings: paths and messages the mutation run found untested.

* every ``score_mod`` (FlexAttention) equals the dense ``score_bias``, checked with *eager*
  FlexAttention (no compile, so it runs in the mutation session too), at positions that do
  not start at 0 and with per-row positions;
* the blocked low-precision ``out=`` path rounds once, exactly like ``.to(bfloat16)``;
* bad inputs raise ``ValueError``s that name the parameter; defaults are the documented ones.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

import posenc
from posenc.torch import FIRE, KERPLE, ALiBi, T5RelativeBias

HEADS = 4


def _encodings():
    torch.manual_seed(0)
    fire = FIRE(HEADS, hidden=8, threshold=6.0)  # threshold inside the range: both branches
    kerple = KERPLE(HEADS, variant="power")
    with torch.no_grad():  # away from the initial values, so each head differs
        for p in (*fire.parameters(), *kerple.parameters()):
            p.add_(0.3 * torch.randn_like(p))
    t5 = T5RelativeBias(HEADS, num_buckets=8, max_distance=16, bidirectional=True)
    return {
        "alibi": ALiBi(HEADS),
        "alibi-symmetric": ALiBi(HEADS, symmetric=True),
        "t5": t5,
        "kerple": kerple,
        "fire": fire,
    }


POSITIONS = {  # (q_positions, k_positions): offsets, a query block inside the keys, rows
    "offset-ranges": (range(5, 12), range(3, 12)),
    "one-row-tensor": (torch.tensor([[3, 5, 8]]), torch.tensor([[0, 3, 5, 8]])),
    "far": (range(40, 43), torch.arange(0, 70, 7)[None]),  # beyond T5 max_distance, both ways
    "per-row-tensors": (
        torch.tensor([[4, 5, 6], [20, 21, 22]]),
        torch.tensor([[0, 2, 4, 6, 8], [18, 19, 20, 21, 22]]),
    ),
}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("where", POSITIONS)
@pytest.mark.parametrize("name", list(_encodings()))
def test_score_mod_equals_score_bias_in_eager_flex(name, where):
    if name == "kerple" and os.environ.get("MUTANT_UNDER_TEST"):
        pytest.skip("under mutmut: dynamo cannot trace the trampoline of KERPLE's _kerple")
    enc = _encodings()[name]
    qp, kp = POSITIONS[where]
    nq = len(qp) if isinstance(qp, range) else qp.shape[1]
    nk = len(kp) if isinstance(kp, range) else kp.shape[1]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, n, 8, generator=g) for n in (nq, nk, nk))
    with torch.no_grad():
        bias = enc.score_bias(qp, kp)  # (b|1, heads, sq, sk)
        dense = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + bias, -1) @ v
        flex = flex_attention(q, k, v, score_mod=enc.score_mod(qp, kp), scale=8**-0.5)
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


def test_alibi_bias_at_offset_positions_equals_numpy():
    slopes = posenc.alibi_slopes(HEADS)
    for qp, kp in ((range(5, 13), range(13)), (range(7, 8), range(2, 8))):
        got = ALiBi(HEADS)(qp, kp)[0].double().numpy()
        want = posenc.alibi_bias(slopes, np.arange(qp.start, qp.stop), np.arange(kp.start, kp.stop))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_low_precision_out_rounds_once_through_blocks():
    enc = ALiBi(HEADS)  # writes into out (KERPLE and FIRE may ignore it, as documented)
    n = 1100  # 1.2M elements per head: 3 heads per 4M-element block, then a remainder of 1
    want = enc.score_bias(range(n), range(n)).to(torch.bfloat16)
    out = torch.full((1, HEADS, n, n), float("nan"), dtype=torch.bfloat16)
    with torch.no_grad():
        got = enc.score_bias(range(n), range(n), out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, want)


def test_kerple_reference_defaults_and_bounds():
    q, k = np.arange(6), np.arange(6)
    r1, r2 = np.array([1.0, 0.5]), np.array([0.5, 2.0])
    log = posenc.kerple_bias(q, k, r1, r2)
    np.testing.assert_array_equal(log, posenc.kerple_bias(q, k, r1, r2, variant="log"))
    assert not np.allclose(log, posenc.kerple_bias(q, k, r1, r2, variant="power"))
    # r2 = 2 is the power variant's largest allowed exponent: -r1 |i - j|^2
    power = posenc.kerple_bias(q, k, r1, r2, variant="power")
    np.testing.assert_allclose(power[1], -0.5 * np.subtract.outer(q, k) ** 2.0)
    # integer parameters are read as floats: |i - j| ** 0.5 is not truncated
    np.testing.assert_allclose(
        posenc.kerple_bias(q, k, [1], [1], variant="power"),
        posenc.kerple_bias(q, k, [1.0], [1.0], variant="power"),
    )
    with pytest.raises(ValueError, match=r"r1 and r2 must be positive"):
        posenc.kerple_bias(q, k, [0.0, 1.0], r2)
    with pytest.raises(ValueError, match=r"r1 and r2 must be positive"):
        posenc.kerple_bias(q, k, r1, [1.0, 0.0])
    with pytest.raises(ValueError, match=r"r1 and r2 must have shape \(heads,\), got \(2,\)"):
        posenc.kerple_bias(q, k, r1, [1.0])
    with pytest.raises(ValueError, match=r"r1 and r2 must have shape \(heads,\)"):
        posenc.kerple_bias(q, k, [[1.0]], [[1.0]])
    with pytest.raises(ValueError, match=r"r2 must be <= 2 for the power variant, got 2.5"):
        posenc.kerple_bias(q, k, r1, [0.5, 2.5], variant="power")
    with pytest.raises(ValueError, match=r"variant must be one of \('log', 'power'\), got 'x'"):
        posenc.kerple_bias(q, k, r1, r2, variant="x")


def test_fire_reference_messages():
    w = dict(w1=np.ones(3), b1=np.zeros(3), w2=np.ones((2, 3)), b2=np.zeros(2))
    q = np.arange(4)
    for name in ("c", "threshold"):
        kw = {"c": 0.1, "threshold": 8.0, name: 0.0}
        with pytest.raises(ValueError, match=rf"^{name} must be a positive"):
            posenc.fire_bias(q, q, **kw, **w)
    bad = [dict(w, w1=np.ones((3, 1))), dict(w, b1=np.zeros(2)), dict(w, w2=np.ones((2, 4))),
           dict(w, b2=np.zeros(3))]  # fmt: skip
    for weights in bad:
        with pytest.raises(ValueError, match=r"FIRE weights must be w1 \(hidden,\)"):
            posenc.fire_bias(q, q, c=0.1, threshold=8.0, **weights)
    with pytest.raises(ValueError, match=r"k_positions"):
        posenc.fire_bias(q, np.zeros((2, 2, 2), dtype=int), c=0.1, threshold=8.0, **w)


def test_t5_defaults_init_and_messages():
    t5 = T5RelativeBias(1)  # one head is allowed
    assert (t5.num_buckets, t5.max_distance, t5.bidirectional) == (32, 128, False)
    big = T5RelativeBias(64)
    assert 0.018 < big.weight.std().item() < 0.022  # N(0, 0.02^2), as in HF's T5 init
    with pytest.raises(ValueError, match=r"^heads must be >= 1, got 0"):
        T5RelativeBias(0)
    with pytest.raises(ValueError, match=r"num_buckets"):
        T5RelativeBias(2, num_buckets=31, bidirectional=True)
    # T5 in bfloat16: the table is read in float32 (work dtype), then the bias is float32
    t5 = T5RelativeBias(2).to(torch.bfloat16)
    assert t5(range(4)).dtype == torch.float32


def test_score_bias_hook_messages():
    alibi = ALiBi(2)
    with pytest.raises(ValueError, match=r"^k_positions must be \(seq,\) or \(batch, seq\)"):
        alibi(range(3), torch.zeros(1, 1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^q_positions must be \(seq,\) or \(batch, seq\)"):
        alibi(torch.zeros(1, 1, 3, dtype=torch.long), range(3))
    with pytest.raises(ValueError, match=r"batch of q_positions \(2\), got 3"):
        alibi(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long))
    # a range and a (1, seq) tensor of the same positions give the same bias
    torch.testing.assert_close(alibi(range(2, 6)), alibi(torch.arange(2, 6)[None]))
    torch.testing.assert_close(alibi(range(2, 6)), alibi(torch.arange(2, 6)))


def test_position_arg_validates_ranges_lists_and_dtypes():
    from posenc.torch.positions import position_arg

    assert position_arg(range(3, 7), 2, 4) == range(3, 7)
    for bad in (range(0, 8, 2), range(0, 5), range(-1, 3)):  # step, length, negative start
        with pytest.raises(ValueError, match=r"^positions must be a range of 4 consecutive"):
            position_arg(bad, 2, 4)
    torch.testing.assert_close(position_arg([3, 4, 5], 2, 3), torch.tensor([[3, 4, 5]]))
    torch.testing.assert_close(position_arg(np.array([[1, 2], [5, 6]]), 2, 2),
                               torch.tensor([[1, 2], [5, 6]]))  # fmt: skip
    for dtype in (torch.bool, torch.float32, torch.complex64):
        with pytest.raises(ValueError, match=r"^positions must be an integer tensor"):
            position_arg(torch.zeros(3, dtype=dtype), 1, 3)
