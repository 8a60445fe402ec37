"""ALiBi and T5RelativeBias (posenc.torch.bias): what the mutation run left unpinned.

* the tables and position tensors are built next to the module, not on torch's default
  device (checked with ``with torch.device("meta")`` around the call, the one CPU-only way
  to tell the two apart), for ``score_bias``, ``score_mod`` and the ``out=`` buffer;
* a meta-built ALiBi asks for its slopes on the device of the positions it is given;
* ``out=`` in the work dtype is written in place; in another dtype it is filled through a
  buffer in the work dtype, every head, also for a decoding step (one query, many keys);
* T5's ``num_buckets`` is refused with the reference's message before any table is made,
  and its bucket lookup table covers ``key - query`` in ``[-max_distance, max_distance]``.

Values are checked against the float64 NumPy reference (``posenc.alibi_bias``,
``posenc.t5_buckets``).
"""

from __future__ import annotations

import numpy as np
import torch
from expect import raises_exactly

import posenc
from posenc.torch import ALiBi, T5RelativeBias

HEADS = 4


def _alibi_ref(q, k, heads=HEADS):
    """float64 reference ``(heads, sq, sk)`` for ranges ``q`` and ``k``."""
    return posenc.alibi_bias(posenc.alibi_slopes(heads), np.asarray(q), np.asarray(k))


def _t5_ref(t5, q, k):
    """float64 reference ``(heads, sq, sk)``: the table read at the reference buckets."""
    rel = np.asarray(k)[None, :] - np.asarray(q)[:, None]  # key - query
    buckets = posenc.t5_buckets(
        rel,
        bidirectional=t5.bidirectional,
        num_buckets=t5.num_buckets,
        max_distance=t5.max_distance,
    )
    return t5.weight.detach().double().numpy()[buckets].transpose(2, 0, 1)


def _run_score_mod(mod, nq, nk, heads=HEADS):
    """Evaluate a ``score_mod`` on a zero score grid, ``(heads, nq, nk)``."""
    q_idx, kv_idx = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    b = torch.tensor(0)
    return torch.stack([mod(torch.zeros(()), b, torch.tensor(h), q_idx, kv_idx)
                        for h in range(heads)])  # fmt: skip


def test_alibi_bias_stays_with_the_module_under_another_default_device():
    alibi = ALiBi(HEADS)
    with torch.device("meta"):
        bias = alibi(range(2, 5), range(5))
    assert bias.device.type == "cpu"
    np.testing.assert_array_equal(bias[0].double().numpy(), _alibi_ref(range(2, 5), range(5)))


def test_alibi_score_mod_stays_with_the_module_under_another_default_device():
    alibi = ALiBi(HEADS)
    with torch.device("meta"):
        mod = alibi.score_mod(range(3, 6), range(1, 7))
    got = _run_score_mod(mod, 3, 6)
    assert got.device.type == "cpu"
    np.testing.assert_array_equal(got.double().numpy(), _alibi_ref(range(3, 6), range(1, 7)))


def test_t5_bias_and_score_mod_stay_with_the_module_under_another_default_device():
    torch.manual_seed(0)
    t5 = T5RelativeBias(HEADS, num_buckets=8, max_distance=16, bidirectional=True)
    q, k = range(20, 23), range(0, 30)  # distances beyond max_distance both ways
    want = _t5_ref(t5, q, k)
    with torch.device("meta"), torch.no_grad():
        bias = t5(q, k)
        mod = t5.score_mod(q, k)
    assert bias.device.type == "cpu"
    np.testing.assert_array_equal(bias[0].double().numpy(), want)
    with torch.no_grad():
        np.testing.assert_array_equal(_run_score_mod(mod, 3, 30).double().numpy(), want)


def test_low_precision_out_buffer_stays_on_the_out_device():
    alibi = ALiBi(HEADS)
    out = torch.full((1, HEADS, 3, 5), float("nan"), dtype=torch.bfloat16)
    with torch.device("meta"):
        got = alibi.score_bias(range(2, 5), range(5), out=out)
    assert got is out
    # every value is a multiple of 2**-8 below 4 in magnitude: exact in bfloat16
    np.testing.assert_array_equal(out[0].double().numpy(), _alibi_ref(range(2, 5), range(5)))


def _record_materialize(module):
    """Wrap ``module._materialize``; return the list of devices it is asked for."""
    asked, real = [], module._materialize

    def spy(device=None):
        asked.append(device)
        return real(device)

    module._materialize = spy
    return asked


def test_meta_alibi_asks_for_its_slopes_on_the_device_of_the_positions():
    # On a CPU-only machine the fallback device is the CPU too, so the request is what can
    # be checked: score_bias and score_mod pass the positions' device on (a CUDA tensor
    # would otherwise get CPU slopes and a CPU bias).
    for method in ("score_bias", "score_mod"):
        with torch.device("meta"):
            alibi = ALiBi(HEADS)
        asked = _record_materialize(alibi)
        pos = torch.arange(2, 5)[None]
        getattr(alibi, method)(pos, pos)
        assert asked == [pos.device], method
        assert alibi.slopes.device.type == "cpu"
        np.testing.assert_array_equal(alibi.slopes.numpy(), posenc.alibi_slopes(HEADS))


def test_out_in_the_work_dtype_is_written_in_place():
    alibi = ALiBi(HEADS)
    out = torch.full((1, HEADS, 3, 5), float("nan"))  # float32: the work dtype
    got = alibi.score_bias(range(2, 5), range(5), out=out)
    assert got is out
    np.testing.assert_array_equal(out[0].double().numpy(), _alibi_ref(range(2, 5), range(5)))
    double = ALiBi(HEADS).double()
    out64 = torch.full((2, HEADS, 3, 5), float("nan"), dtype=torch.float64)
    pos = torch.tensor([[2, 3, 4], [7, 8, 9]])
    assert double.score_bias(pos, range(5), out=out64) is out64
    np.testing.assert_array_equal(out64[1].numpy(), _alibi_ref(range(7, 10), range(5)))


def test_out_in_another_dtype_is_computed_in_the_work_dtype():
    # 257 * 2**-2 = 64.25 needs 9 significant bits: exact in float32 (the work dtype), not in
    # the bfloat16 that torch's default dtype is set to here
    alibi = ALiBi(HEADS)
    out = torch.full((1, HEADS, 1, 301), float("nan"), dtype=torch.float64)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        got = alibi.score_bias(range(300, 301), range(301), out=out)
    finally:
        torch.set_default_dtype(old)
    assert got is out
    want = _alibi_ref(range(300, 301), range(301))  # all exact in float32
    assert want[0, 0, 43] == -64.25  # slope 2**-2, distance 257
    np.testing.assert_array_equal(out[0].numpy(), want)


def test_decoding_step_fills_every_head_of_a_low_precision_out():
    # one query, 2_000_000 keys: 2M elements a head, so 2 heads per 4M-element block and two
    # blocks for 4 heads; fewer query rows than heads per block and than heads
    n = 2_000_000
    alibi = ALiBi(HEADS)
    q, k = range(n - 1, n), range(n)
    want = alibi.score_bias(q, k).to(torch.bfloat16)
    out = torch.full((1, HEADS, 1, n), float("nan"), dtype=torch.bfloat16)
    with torch.no_grad():
        got = alibi.score_bias(q, k, out=out)
    assert got is out
    assert torch.equal(out, want)  # no NaN left: every head written, rounded like .to()
    # spot values from the reference: distance n - 1 for key 0, 0 on the diagonal
    slopes = posenc.alibi_slopes(HEADS)
    assert out[0, :, 0, -1].tolist() == [0.0] * HEADS
    np.testing.assert_array_equal(
        out[0, :, 0, 0].double().numpy(),
        torch.tensor(-slopes * (n - 1)).to(torch.bfloat16).double().numpy(),
    )


def test_t5_refuses_bad_num_buckets_with_the_reference_message():
    with raises_exactly("num_buckets must be >= 2, got -1"):
        T5RelativeBias(2, num_buckets=-1)
    with raises_exactly("num_buckets must be >= 2, got 1"):
        T5RelativeBias(2, num_buckets=1)
    with raises_exactly("num_buckets must be an integer, got 4.0"):
        T5RelativeBias(2, num_buckets=4.0)
    with raises_exactly("num_buckets must be >= 4 when bidirectional, got 2"):
        T5RelativeBias(2, num_buckets=2, bidirectional=True)
    with raises_exactly("max_distance must be > num_buckets // 2 = 2, got 2"):
        T5RelativeBias(2, num_buckets=4, max_distance=2)
    assert T5RelativeBias(2, num_buckets=2).weight.shape == (2, 2)  # causal: 2 is allowed
    assert T5RelativeBias(2, num_buckets=4, max_distance=3, bidirectional=True).bucket.numel() == 7


def test_t5_bucket_table_covers_exactly_minus_to_plus_max_distance():
    for md, bidirectional in ((16, True), (5, False)):
        t5 = T5RelativeBias(2, num_buckets=8, max_distance=md, bidirectional=bidirectional)
        rel = np.arange(-md, md + 1)
        want = posenc.t5_buckets(rel, bidirectional=bidirectional, num_buckets=8, max_distance=md)
        assert t5.bucket.shape == (2 * md + 1,)
        np.testing.assert_array_equal(t5.bucket.numpy(), want)


def test_work_dtype_is_torch_default_at_construction_not_at_the_call():
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        t5 = T5RelativeBias(2, num_buckets=8, max_distance=16)
    finally:
        torch.set_default_dtype(old)
    assert t5.weight.dtype == torch.float64 and t5.work_dtype == torch.float64
    assert t5.score_bias(range(3), range(3)).dtype == torch.float64  # read after the reset
    assert T5RelativeBias(2).work_dtype == torch.float32


def test_an_integer_out_buffer_is_not_used():
    # writing -m * distance into an int64 buffer would truncate every slope to 0
    out = torch.zeros(1, 2, 3, 3, dtype=torch.int64)
    got = ALiBi(2).score_bias(range(3), range(3), out=out)
    assert got is not out and got.dtype == torch.float32
    want = torch.from_numpy(posenc.alibi_bias(posenc.alibi_slopes(2), range(3), range(3)))
    torch.testing.assert_close(got[0], want.float())
