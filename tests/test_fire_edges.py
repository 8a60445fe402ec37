"""FIRE's construction and bias (posenc.torch.learned_bias): what the mutation run left unpinned.

* the documented initial values: ``c = 0.1``, ``L = 512``, ``hidden = 32`` by default, and
  ``c``, ``L`` stored as their logarithms (float32);
* the refusals of ``heads``, ``hidden``, ``c`` and ``threshold`` with their exact messages,
  at the boundary (the largest refused value and the smallest accepted one);
* ``extra_repr`` and the public ``mlp`` being the ReLU network ``f_theta`` itself;
* a module cast to bfloat16 computes its bias in float32 from the bfloat16 parameters
  (``c`` and ``L`` exponentiated in float32, not rounded to bfloat16);
* the bias is built next to the module, not on torch's default device (checked with
  ``with torch.device("meta")`` around the call, the one CPU-only way to tell them apart);

Expected values are written out in float64 NumPy from the FIRE formula
``B = f(psi(|i - j|) / (psi(max(L, i)) + eps))``, ``psi(x) = log(c x + 1)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from expect import raises_exactly

from posenc.torch import FIRE


def _fire_ref(fire, q, k):
    """float64 ``(heads, sq, sk)`` from the module's own parameters, as the formula reads."""
    first, last = fire.mlp[0], fire.mlp[2]
    w1 = first.weight.detach().double().numpy()[:, 0]  # (hidden,)
    b1 = first.bias.detach().double().numpy()
    w2 = last.weight.detach().double().numpy()  # (heads, hidden)
    b2 = last.bias.detach().double().numpy()
    c = math.exp(float(fire.log_c.detach().double()))
    big_l = math.exp(float(fire.log_threshold.detach().double()))
    i = np.asarray(q, dtype=np.float64)[:, None]
    j = np.asarray(k, dtype=np.float64)[None, :]
    x = np.log1p(c * np.abs(i - j)) / (np.log1p(c * np.maximum(big_l, i)) + 1e-6)
    hidden = np.maximum(x[..., None] * w1 + b1, 0.0)  # (sq, sk, hidden)
    return (hidden @ w2.T + b2).transpose(2, 0, 1)


def test_defaults_are_c_one_tenth_threshold_512_hidden_32():
    fire = FIRE(2)
    assert fire.log_c.dtype == torch.float32
    assert fire.log_c.item() == np.float32(math.log(0.1))
    assert fire.log_threshold.item() == np.float32(math.log(512.0))
    assert fire.mlp[0].out_features == 32 and fire.mlp[2].in_features == 32
    assert fire.extra_repr() == "heads=2, hidden=32"


def test_default_bias_follows_the_formula():
    torch.manual_seed(0)
    fire = FIRE(3)
    q, k = range(5, 9), range(0, 9)
    with torch.no_grad():
        got = fire(q, k)[0].double().numpy()
    np.testing.assert_allclose(got, _fire_ref(fire, q, k), rtol=1e-5, atol=1e-7)


def test_given_c_and_threshold_are_stored_as_logs():
    fire = FIRE(1, c=2.5, threshold=7.0)
    assert fire.log_c.item() == np.float32(math.log(2.5))
    assert fire.log_threshold.item() == np.float32(math.log(7.0))


def test_extra_repr_names_heads_and_hidden_width():
    fire = FIRE(3, hidden=5)
    assert fire.extra_repr() == "heads=3, hidden=5"
    assert repr(fire).splitlines()[1] == "  heads=3, hidden=5"


def test_the_public_mlp_is_the_relu_network():
    torch.manual_seed(1)
    fire = FIRE(2, hidden=6)
    x = torch.linspace(-1.0, 1.0, 9, dtype=torch.float64)
    w1 = fire.mlp[0].weight.detach().double()[:, 0]
    b1, b2 = fire.mlp[0].bias.detach().double(), fire.mlp[2].bias.detach().double()
    w2 = fire.mlp[2].weight.detach().double()
    want = torch.clamp(x[:, None] * w1 + b1, min=0.0) @ w2.T + b2  # (9, heads)
    assert isinstance(fire.mlp[1], torch.nn.ReLU)
    with torch.no_grad():
        got = fire.double().mlp(x[:, None])
    torch.testing.assert_close(got, want)


def test_heads_refused_at_zero_accepted_at_one():
    with raises_exactly("heads must be >= 1, got 0"):
        FIRE(0)
    with raises_exactly("heads must be an integer, got 1.5"):
        FIRE(1.5)
    assert FIRE(1)(range(2)).shape == (1, 1, 2, 2)


def test_hidden_refused_at_zero_accepted_at_one():
    with raises_exactly("hidden must be >= 1, got 0"):
        FIRE(2, hidden=0)
    with raises_exactly("hidden must be an integer, got 2.0"):
        FIRE(2, hidden=2.0)
    torch.manual_seed(2)
    fire = FIRE(2, hidden=1)
    assert fire.extra_repr() == "heads=2, hidden=1"
    with torch.no_grad():
        got = fire(range(4))[0].double().numpy()
    np.testing.assert_allclose(got, _fire_ref(fire, range(4), range(4)), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["c", "threshold"])
def test_c_and_threshold_refused_at_zero_accepted_just_above(name):
    with raises_exactly(f"{name} must be a positive finite number, got 0.0"):
        FIRE(1, **{name: 0})
    with raises_exactly(f"{name} must be a positive finite number, got -1.0"):
        FIRE(1, **{name: -1.0})
    with raises_exactly(f"{name} must be a positive real number, got 'x'"):
        FIRE(1, **{name: "x"})
    fire = FIRE(1, **{name: 1e-300})  # tiny but positive: accepted, its log stored
    log = fire.log_c if name == "c" else fire.log_threshold
    assert log.item() == np.float32(math.log(1e-300))


def test_bfloat16_module_computes_in_float32_from_its_parameters():
    torch.manual_seed(3)
    fire = FIRE(2, hidden=4, c=0.1, threshold=512.0).to(torch.bfloat16)
    q, k = range(0, 6), range(0, 6)
    with torch.no_grad():
        got = fire(q, k)
    assert got.dtype == torch.float32
    # the bfloat16 parameters are exact in float64; c and L are exponentiated in float32
    np.testing.assert_allclose(got[0].double().numpy(), _fire_ref(fire, q, k), rtol=1e-5,
                               atol=1e-6)  # fmt: skip


def test_bfloat16_module_past_its_threshold():
    torch.manual_seed(4)
    fire = FIRE(2, hidden=4, c=0.3, threshold=3.0).to(torch.bfloat16)
    q, k = range(2, 8), range(0, 8)  # queries on both sides of L
    with torch.no_grad():
        got = fire(q, k)[0].double().numpy()
    np.testing.assert_allclose(got, _fire_ref(fire, q, k), rtol=1e-5, atol=1e-6)


def test_bias_stays_with_the_module_under_another_default_device():
    torch.manual_seed(5)
    fire = FIRE(2, hidden=4, threshold=4.0)
    q, k = range(2, 7), range(0, 7)
    want = _fire_ref(fire, q, k)
    with torch.device("meta"), torch.no_grad():
        bias = fire.score_bias(q, k)  # ranges carry no device: the module decides
    assert bias.device.type == "cpu"
    np.testing.assert_allclose(bias[0].double().numpy(), want, rtol=1e-5, atol=1e-7)


def test_meta_built_fire_gives_a_meta_bias_for_cpu_positions():
    with torch.device("meta"):
        fire = FIRE(3, hidden=4)
    bias = fire.score_bias(torch.arange(4)[None], torch.arange(5)[None])
    assert bias.device.type == "meta" and bias.shape == (1, 3, 4, 5)
