"""Pins down posenc.scaling at its edges: the exact refusal messages and the smallest accepted
and largest refused values of every constructor argument, YaRN's ramp clamps and zero-width
ramp, YaRN's attention temperature near factor 1 and with DeepSeek's mscale pair, Llama 3's
inclusive wavelength bounds (hit exactly, to the bit), LongRoPE's attention scale at factor 1
and its factor-count check, and Proportional's fraction bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from expect import raises_exactly

from posenc.scaling import NTK, DynamicNTK, Linear, Llama3, LongRoPE, Proportional, YaRN

TAU = 2 * math.pi
POS = "must be a positive finite number, got"


def default_rates(dim, base):
    """HF's default rates in plain Python: base ** (-2i / dim)."""
    return np.array([base ** (-2 * i / dim) for i in range(dim // 2)])


# --- original_max_len: 1 is the smallest accepted value, 0 is refused, by every scaling ---

ORIG_LEN_BUILDERS = {
    "dynamic": lambda n: DynamicNTK(2.0, n),
    "yarn": lambda n: YaRN(2.0, n),
    "llama3": lambda n: Llama3(8.0, 1.0, 4.0, n),
    "longrope": lambda n: LongRoPE((1.0,), (2.0,), n, 1.0),
}


@pytest.mark.parametrize("name", ORIG_LEN_BUILDERS)
def test_original_max_len_one_accepted_zero_refused(name):
    build = ORIG_LEN_BUILDERS[name]
    assert build(1).original_max_len == 1
    with raises_exactly("original_max_len must be >= 1, got 0"):
        build(0)
    with raises_exactly("original_max_len must be an integer, got 2.5"):
        build(2.5)


# --- positive real arguments: the message names the argument ---

POSITIVE_ARGS = [
    ("beta_fast", lambda v: YaRN(2.0, 64, beta_fast=v)),
    ("beta_slow", lambda v: YaRN(2.0, 64, beta_slow=v)),
    ("low_freq_factor", lambda v: Llama3(8.0, v, 4.0, 64)),
    ("high_freq_factor", lambda v: Llama3(8.0, 1.0, v, 64)),
    ("factor", lambda v: LongRoPE((1.0,), (2.0,), 64, v)),
    (
        "short_mscale",
        lambda v: LongRoPE((1.0,), (2.0,), 64, 2.0, short_mscale=v, long_mscale=1.0),
    ),
    (
        "long_mscale",
        lambda v: LongRoPE((1.0,), (2.0,), 64, 2.0, short_mscale=1.0, long_mscale=v),
    ),
    ("factor", lambda v: Proportional(0.5, v)),
    ("fraction", lambda v: Proportional(v)),
]


@pytest.mark.parametrize(("name", "build"), POSITIVE_ARGS)
def test_positive_arguments_refuse_zero_by_name(name, build):
    with raises_exactly(f"{name} {POS} 0.0"):
        build(0.0)
    with raises_exactly(f"{name} must be a positive real number, got 'x'"):
        build("x")


# --- Llama3: high_freq_factor must be strictly above low_freq_factor ---


def test_llama3_equal_freq_factors_refused():
    with raises_exactly("high_freq_factor must be > low_freq_factor=2.0, got 2.0"):
        Llama3(8.0, 2.0, 2.0, 64)
    assert Llama3(8.0, 2.0, float(np.nextafter(2.0, 3.0)), 64).low_freq_factor == 2.0


# --- LongRoPE refusals ---


@pytest.mark.parametrize("which", ["short_factor", "long_factor"])
def test_longrope_zero_factor_refused(which):
    factors = {"short_factor": (1.0, 2.0), "long_factor": (1.0, 2.0)}
    factors[which] = (1.0, 0.0)
    with raises_exactly(f"{which} must be a non-empty list of positive numbers"):
        LongRoPE(factors["short_factor"], factors["long_factor"], 64, 2.0)


def test_longrope_mscales_only_together():
    msg = "short_mscale and long_mscale must be given together, got"
    with raises_exactly(f"{msg} 1.5 and None"):
        LongRoPE((1.0,), (2.0,), 64, 2.0, short_mscale=1.5)
    with raises_exactly(f"{msg} None and 1.5"):
        LongRoPE((1.0,), (2.0,), 64, 2.0, long_mscale=1.5)


@pytest.mark.parametrize("seq_len", [None, 64, 65])  # 65 reads long_factor
def test_longrope_factor_count_must_be_half_dim(seq_len):
    rope = LongRoPE((1.0,) * 3, (2.0,) * 3, 64, 2.0)
    with raises_exactly("LongRoPE factors must have dim // 2 = 4 entries, got 3"):
        rope.inv_freq(8, 10_000.0, seq_len)
    inv, _ = rope.inv_freq(6, 10_000.0, seq_len)  # 3 entries fit dim 6
    assert inv.shape == (3,)


def test_longrope_scale_formula_needs_original_len_two():
    # sqrt(1 + log(factor) / log(original_max_len)) divides by log 1 = 0 at original_max_len 1
    msg = "original_max_len must be at least 2 when factor > 1 sets the attention scale, got 1"
    with raises_exactly(msg):
        LongRoPE((1.0,), (2.0,), 1, 2.0)
    assert LongRoPE((1.0,), (2.0,), 1, 2.0, attention_factor=1.5).inv_freq(2, 1e4)[1] == 1.5
    _, scale = LongRoPE((1.0,), (2.0,), 2, 4.0).inv_freq(2, 1e4)
    assert scale == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(2.0)))  # sqrt(3)


@pytest.mark.parametrize(
    ("dim", "msg"),
    [(7, "dim must be even, got 7"), (0, "dim must be a positive even integer, got 0")],
)
def test_inv_freq_called_directly_checks_dim(dim, msg):
    for scaling in (Linear(2.0), NTK(2.0), DynamicNTK(2.0, 64), YaRN(2.0, 64),
                    Llama3(8.0, 1.0, 4.0, 64),
                    LongRoPE((1.0,) * 3, (2.0,) * 3, 64, 2.0), Proportional(0.5)):  # fmt: skip
        with raises_exactly(msg):
            scaling.inv_freq(dim, 1e4)


def test_longrope_factor_one_scale_is_one_even_at_original_len_one():
    # factor <= 1 short-circuits to 1.0; the formula would be sqrt(1 + log 1 / log 1) = 0 / 0
    _, scale = LongRoPE((1.0,), (2.0,), 1, 1.0).inv_freq(2, 10_000.0)
    assert scale == 1.0


# --- Proportional: fraction in (0, 1] ---


def test_proportional_fraction_one_accepted_above_refused():
    inv, scale = Proportional(1.0).inv_freq(8, 100.0)
    np.testing.assert_allclose(inv, default_rates(8, 100.0), rtol=1e-15)
    assert scale == 1.0
    above = float(np.nextafter(1.0, 2.0))
    with raises_exactly(f"fraction must be in (0, 1], got {above}"):
        Proportional(above)
    with raises_exactly("fraction must be in (0, 1], got 2.0"):
        Proportional(2.0)


# --- YaRN attention temperature: 0.1 * m * log(factor) + 1, and 1 at factor <= 1 ---


@pytest.mark.parametrize("factor", [1.5, 2.0])
def test_yarn_temperature_just_above_factor_one(factor):
    assert YaRN(factor, 64).inv_freq(8, 1e4)[1] == pytest.approx(0.1 * math.log(factor) + 1)


@pytest.mark.parametrize("name", ["mscale", "mscale_all_dim"])
@pytest.mark.parametrize("value", [math.inf, math.nan, -0.5])
def test_yarn_mscale_must_be_finite_and_not_negative(name, value):
    with raises_exactly(f"{name} {POS} {value}"):
        YaRN(2.0, 64, **{name: value})
    assert YaRN(2.0, 64, **{name: 0.0}).inv_freq(8, 1e4)[1] == YaRN(2.0, 64).inv_freq(8, 1e4)[1]


def test_yarn_mscale_pair_uses_mscale_all_dim():
    # DeepSeek: (0.1 * 1.0 * log 4 + 1) / (0.1 * 0.5 * log 4 + 1) = 1.138629 / 1.069315
    got = YaRN(4.0, 64, mscale=1.0, mscale_all_dim=0.5).inv_freq(8, 1e4)[1]
    want = (0.1 * math.log(4.0) + 1) / (0.05 * math.log(4.0) + 1)
    assert got == pytest.approx(want, rel=1e-14)
    assert want == pytest.approx(1.064821, abs=1e-6)


# --- YaRN ramp: bounds from correction_dim(r) = dim * log(L / (2 pi r)) / (2 log base) ---


def yarn_expected(dim, base, factor, ramp):
    """Rates from a hand-computed ramp: 0 keeps a pair's rate, 1 divides it by factor."""
    inv = default_rates(dim, base)
    return np.array([v / factor * r + v * (1 - r) for v, r in zip(inv, ramp, strict=True)])


def test_yarn_low_bound_clamped_at_zero():
    # dim 8, base 1e4, L 64: correction_dim(32) = -0.497 -> floor -1 -> clamp 0;
    # correction_dim(1) = 1.008 -> ceil 2; ramp (i - 0) / 2 = [0, 0.5, 1, 1]
    inv, _ = YaRN(4.0, 64).inv_freq(8, 1e4)
    np.testing.assert_allclose(inv, yarn_expected(8, 1e4, 4.0, [0, 0.5, 1, 1]), rtol=1e-14)


def test_yarn_high_bound_clamped_at_dim_minus_one():
    # dim 8, base 10, L 8192: correction_dim(2048) = -0.78 -> 0; correction_dim(1) = 12.46
    # -> ceil 13 -> clamp dim - 1 = 7; ramp i / 7
    inv, _ = YaRN(4.0, 8192, beta_fast=2048.0).inv_freq(8, 10.0)
    want = yarn_expected(8, 10.0, 4.0, [0, 1 / 7, 2 / 7, 3 / 7])
    np.testing.assert_allclose(inv, want, rtol=1e-14)


def test_yarn_zero_width_ramp_at_origin():
    # L 4 < 2 pi: correction_dim(32) = -1.70 -> 0, correction_dim(1) = -0.196 -> ceil 0;
    # low == high == 0 -> high = 0.001; ramp clip(i / 0.001) = [0, 1, 1, 1]
    inv, _ = YaRN(4.0, 4).inv_freq(8, 1e4)
    np.testing.assert_allclose(inv, yarn_expected(8, 1e4, 4.0, [0, 1, 1, 1]), rtol=1e-14)


def test_yarn_equal_betas_untruncated_give_a_step():
    # beta_fast == beta_slow == 1, no truncation: low == high == correction_dim(1) = 1.5029
    # (L 200); high = 1.5039, ramp clip((i - 1.5029) / 0.001) = [0, 0, 1, 1]
    inv, _ = YaRN(4.0, 200, beta_fast=1.0, beta_slow=1.0, truncate=False).inv_freq(8, 1e4)
    np.testing.assert_allclose(inv, yarn_expected(8, 1e4, 4.0, [0, 0, 1, 1]), rtol=1e-14)


# --- Llama3: wavelength bands, both bounds inclusive in the smooth band (as in HF) ---


def llama3_expected(dim, base, factor, lff, hff, orig):
    """HF's _compute_llama3_parameters in plain Python float64, pair by pair."""
    out = []
    for inv in default_rates(dim, base):
        wavelen = TAU / inv
        if wavelen < orig / hff:
            out.append(inv)
        elif wavelen > orig / lff:
            out.append(inv / factor)
        else:
            s = (orig / wavelen - lff) / (hff - lff)
            out.append((1 - s) * inv / factor + s * inv)
    return np.array(out)


def test_llama3_low_freq_factor_divides_the_length():
    # dim 16, base 1e4, L 64: wavelengths 6.3, 19.9, 62.8, 199, ...; bands at 64/8 = 8 and
    # 64/2 = 32: pair 0 kept, pair 1 smoothed, pairs 2.. divided by 8
    inv, scale = Llama3(8.0, 2.0, 8.0, 64).inv_freq(16, 1e4)
    want = llama3_expected(16, 1e4, 8.0, 2.0, 8.0, 64)
    np.testing.assert_allclose(inv, want, rtol=1e-14)
    np.testing.assert_allclose(inv[2:], default_rates(16, 1e4)[2:] / 8, rtol=1e-14)
    assert scale == 1.0


def test_llama3_wavelength_on_low_bound_is_interpolated():
    # pair 0 has rate 1 and wavelength 2 pi; low_freq_factor = L / (2 pi) puts it exactly on
    # L / low_freq_factor; the smooth weight is 0 there, so the rate is 1 / factor
    orig = 64
    lff = orig / TAU
    assert orig / lff == TAU  # precondition: exactly on the bound
    inv, _ = Llama3(8.0, lff, lff + 5.0, orig).inv_freq(8, 1e4)
    assert inv[0] == 1 / 8.0


def test_llama3_wavelength_on_high_bound_takes_smooth_formula():
    # high_freq_factor one ulp above L / (2 pi) still puts wavelength 2 pi exactly on
    # L / high_freq_factor, but the smooth weight is then 1 - 2e-15, not 1: the smooth
    # branch (HF: wavelen >= high_freq_wavelen) gives 0.9999999999999984, not the kept 1.0
    orig = 100
    hff = float(np.nextafter(orig / TAU, np.inf))
    lff = hff - 1.0
    assert orig / hff == TAU and orig / TAU != hff  # preconditions
    s = (orig / TAU - lff) / (hff - lff)
    want = (1 - s) * 1.0 / 8.0 + s * 1.0
    assert want != 1.0
    inv, _ = Llama3(8.0, lff, hff, orig).inv_freq(8, 1e4)
    assert inv[0] == want


@pytest.mark.parametrize("scaling", [NTK(2.0), DynamicNTK(2.0, 8)])
def test_ntk_needs_dim_four(scaling):
    # base * factor ** (dim / (dim - 2)) divides by zero at dim 2
    with raises_exactly("dim must be >= 4 for NTK scaling (base ** (dim / (dim - 2))), got 2"):
        scaling.inv_freq(2, 1e4, 64)
    inv, _ = NTK(2.0).inv_freq(4, 100.0)
    np.testing.assert_allclose(inv, [1.0, (100.0 * 2.0**2) ** -0.5], rtol=1e-15)  # 4 / (4 - 2)
