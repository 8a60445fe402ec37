"""KERPLE and FIRE's ``score_mod`` (posenc.torch.learned_bias): what the mutation run left unpinned.

* KERPLE refuses ``heads < 1`` with the shared message, and starts at ALiBi: ``"log"`` holds
  ``r1 = 1, r2 = m_h`` and ``"power"`` holds ``r1 = m_h, r2 = 1`` (raw ``r2`` exactly 0),
  with ``m_h`` the ALiBi slopes, also after the parameters are overwritten and reset;
* the bias and the ``score_mod`` are built next to the module, not on torch's default device
  (checked with ``with torch.device("meta")`` around the call, the one CPU-only way to tell);
* FIRE's ``score_mod`` table: one row for every query while the last query is at or below
  ``L`` (``i <= L``: one MLP input row), one per query past it, with the values of
  ``score_bias`` on both sides of the boundary; an empty query range evaluates to an empty
  grid; a float16 module reads ``c`` and ``L`` in the work dtype (float32) like ``score_bias``.

Values are checked against the float64 NumPy references (``posenc.kerple_bias``,
``posenc.fire_bias``) and against ``score_bias``, the eager bias.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from expect import raises_exactly

import posenc
from posenc.torch import FIRE, KERPLE

HEADS = 4
SLOPES_6 = [
    2.0**-2,
    2.0**-4,
    2.0**-6,
    2.0**-8,
    2.0**-1,
    2.0**-3,
]  # 4 heads' slopes, then 8's [0::2]


def _grid(mod, heads, nq, nk):
    """Evaluate a ``score_mod`` on a zero score, ``(heads, nq, nk)``, as flex does eagerly."""
    q_idx, kv_idx = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    b = torch.tensor(0)
    with torch.no_grad():
        return torch.stack([mod(torch.zeros(()), b, torch.tensor(h), q_idx, kv_idx)
                            for h in range(heads)])  # fmt: skip


# --- KERPLE: construction -------------------------------------------------------------------


@pytest.mark.parametrize("heads", [0, -1])
def test_kerple_refuses_heads_below_one(heads):
    with raises_exactly(f"heads must be >= 1, got {heads}"):
        KERPLE(heads)


def test_kerple_refuses_non_integer_heads():
    with raises_exactly("heads must be an integer, got 1.5"):
        KERPLE(1.5)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_accepts_one_head(variant):
    enc = KERPLE(1, variant=variant)
    assert enc.heads == 1
    d = np.abs(np.arange(3)[:, None] - np.arange(3)[None, :])  # |i - j|
    m = 2.0**-8  # the ALiBi slope of one head
    want = -np.log1p(m * d) if variant == "log" else -m * d
    got = enc(range(3)).detach()
    assert got.shape == (1, 1, 3, 3)
    np.testing.assert_allclose(got[0, 0].double().numpy(), want, rtol=1e-6)


def test_kerple_log_starts_at_unit_scale_and_alibi_rates():
    enc = KERPLE(6)
    # softplus(x) = 1  <=>  x = log(e - 1); softplus(x) = m  <=>  x = log(e^m - 1)
    want_raw_r1 = np.full(6, math.log(math.e - 1.0))
    want_raw_r2 = np.log(np.expm1(SLOPES_6))
    np.testing.assert_allclose(enc.raw_r1.detach().double().numpy(), want_raw_r1, rtol=1e-6)
    np.testing.assert_allclose(enc.raw_r2.detach().double().numpy(), want_raw_r2, rtol=1e-6)
    np.testing.assert_allclose(enc.r1.detach().double().numpy(), np.ones(6), rtol=1e-6)
    np.testing.assert_allclose(enc.r2.detach().double().numpy(), SLOPES_6, rtol=1e-6)


def test_kerple_power_starts_at_alibi_scale_and_unit_exponent():
    enc = KERPLE(6, variant="power")
    np.testing.assert_array_equal(enc.raw_r2.detach().numpy(), np.zeros(6))  # 2 sigmoid(0) = 1
    np.testing.assert_array_equal(enc.r2.detach().numpy(), np.ones(6))
    np.testing.assert_allclose(
        enc.raw_r1.detach().double().numpy(), np.log(np.expm1(SLOPES_6)), rtol=1e-6
    )
    np.testing.assert_allclose(enc.r1.detach().double().numpy(), SLOPES_6, rtol=1e-6)
    # exactly symmetric ALiBi: -m_h |i - j|
    q, k = np.arange(2, 5), np.arange(6)
    want = -np.asarray(SLOPES_6)[:, None, None] * np.abs(q[:, None] - k[None, :])
    got = enc(range(2, 5), range(6)).detach()[0].double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_reset_parameters_goes_back_to_the_start(variant):
    enc = KERPLE(HEADS, variant=variant)
    start = [p.detach().clone() for p in (enc.raw_r1, enc.raw_r2)]
    with torch.no_grad():
        enc.raw_r1.fill_(3.0)
        enc.raw_r2.fill_(-2.0)
    enc.reset_parameters()
    torch.testing.assert_close(enc.raw_r1.detach(), start[0], rtol=0, atol=0)
    torch.testing.assert_close(enc.raw_r2.detach(), start[1], rtol=0, atol=0)


# --- KERPLE: bias and score_mod next to the module -------------------------------------------


def _kerple_ref(variant, q, k, heads=HEADS):
    slopes = posenc.alibi_slopes(heads)
    r1, r2 = (np.ones(heads), slopes) if variant == "log" else (slopes, np.ones(heads))
    return posenc.kerple_bias(np.asarray(q), np.asarray(k), r1, r2, variant=variant)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_bias_stays_with_the_module_under_another_default_device(variant):
    enc = KERPLE(HEADS, variant=variant)
    q, k = range(3, 6), range(1, 7)
    with torch.device("meta"), torch.no_grad():
        bias = enc(q, k)
    assert bias.device.type == "cpu"
    np.testing.assert_allclose(bias[0].double().numpy(), _kerple_ref(variant, q, k), rtol=1e-6)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_score_mod_stays_with_the_module_under_another_default_device(variant):
    enc = KERPLE(HEADS, variant=variant)
    q, k = range(3, 6), range(1, 7)
    with torch.device("meta"):
        mod = enc.score_mod(q, k)
    got = _grid(mod, HEADS, 3, 6)
    assert got.device.type == "cpu"
    want = _kerple_ref(variant, q, k)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(got, enc.score_bias(q, k)[0].float(), rtol=1e-6, atol=1e-7)


# --- FIRE: the score_mod table ---------------------------------------------------------------


def _fire(threshold, *, c=0.1):
    """A FIRE whose MLP is ``f(x) = (1000 x, 1 - 500 x)``: a change of ``x`` shows, amplified.

    Every weight is exact in float16.
    """
    fire = FIRE(2, hidden=1, c=c, threshold=threshold)
    with torch.no_grad():
        fire.mlp[0].weight.fill_(1.0)
        fire.mlp[0].bias.zero_()
        fire.mlp[2].weight.copy_(torch.tensor([[1000.0], [-500.0]]))
        fire.mlp[2].bias.copy_(torch.tensor([0.0, 1.0]))
    return fire


def _fire_ref(fire, q, k):
    """float64 ``posenc.fire_bias`` at the module's own ``c`` and ``L`` (its stored logs)."""
    first, last = fire.mlp[0], fire.mlp[2]
    return posenc.fire_bias(
        np.asarray(q),
        np.asarray(k),
        c=math.exp(float(fire.log_c.detach().double())),
        threshold=math.exp(float(fire.log_threshold.detach().double())),
        w1=first.weight.detach().double().numpy()[:, 0],
        b1=first.bias.detach().double().numpy(),
        w2=last.weight.detach().double().numpy(),
        b2=last.bias.detach().double().numpy(),
    )


def _mlp_rows(fire):
    """Wrap ``fire._mlp``; return the list of the leading shapes of its inputs."""
    shapes, real = [], fire._mlp

    def spy(x):
        shapes.append(tuple(x.shape))
        return real(x)

    fire._mlp = spy
    return shapes


def test_fire_table_shared_up_to_the_threshold_then_per_query():
    fire = _fire(6.0)  # float32: exp(log 6) is exactly 6.0
    assert float(fire.log_threshold.detach().exp()) == 6.0
    rows = _mlp_rows(fire)
    for stop, want_rows in ((7, [(1, 7)]), (8, [(8, 8)])):  # last query at L; one past it
        q, k = range(0, stop), range(0, stop)
        mod = fire.score_mod(q, k)
        assert rows == want_rows  # (queries sharing a row | each query, distances)
        rows.clear()
        got = _grid(mod, 2, stop, stop)
        with torch.no_grad():
            torch.testing.assert_close(got, fire.score_bias(q, k)[0], rtol=1e-6, atol=1e-4)
        np.testing.assert_allclose(got.double().numpy(), _fire_ref(fire, q, k), atol=2e-4)
        rows.clear()


def test_fire_table_per_query_once_a_query_is_past_the_threshold():
    fire = _fire(6.0)
    q, k = range(4, 8), range(0, 8)  # queries 4..6 see psi(L), query 7 sees psi(7)
    got = _grid(fire.score_mod(q, k), 2, 4, 8)
    np.testing.assert_allclose(got.double().numpy(), _fire_ref(fire, q, k), atol=2e-4)


def test_fire_score_mod_of_no_query_is_an_empty_grid():
    fire = _fire(6.0)
    mod = fire.score_mod(range(0), range(4))
    b, h = torch.arange(1)[:, None, None, None], torch.arange(2)[None, :, None, None]
    q_idx, kv_idx = torch.arange(0)[None, None, :, None], torch.arange(4)[None, None, None, :]
    with torch.no_grad():
        got = mod(torch.zeros(1, 2, 0, 4), b, h, q_idx, kv_idx)
    assert got.shape == (1, 2, 0, 4)


def test_fire_score_mod_stays_with_the_module_under_another_default_device():
    fire = _fire(6.0)
    q, k = range(4, 9), range(0, 9)  # past L: the per-query table
    with torch.device("meta"):
        mod = fire.score_mod(q, k)
    got = _grid(mod, 2, 5, 9)
    assert got.device.type == "cpu"
    np.testing.assert_allclose(got.double().numpy(), _fire_ref(fire, q, k), atol=2e-4)
    fire = _fire(512.0)  # below L: the shared table
    with torch.device("meta"):
        mod = fire.score_mod(q, k)
    got = _grid(mod, 2, 5, 9)
    assert got.device.type == "cpu"
    np.testing.assert_allclose(got.double().numpy(), _fire_ref(fire, q, k), atol=2e-4)


def test_fire_half_module_reads_c_and_threshold_in_float32():
    # L = 5 in float16: log 5 rounds to h with exp(h) = 4.99969 in float32 but exactly 5.0
    # when the exponential is rounded to float16, so query 5 is past L only in float32.
    fire = _fire(5.0).half()
    h = fire.log_threshold.detach()
    assert float(h.float().exp()) < 5.0 <= float(h.exp())
    q, k = range(0, 6), range(0, 6)
    got = _grid(fire.score_mod(q, k), 2, 6, 6)
    with torch.no_grad():
        bias = fire.score_bias(q, k)[0]
    assert bias.dtype == torch.float32
    torch.testing.assert_close(got, bias, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(got.double().numpy(), _fire_ref(fire, q, k), atol=2e-4)
