"""NumPy reference of the sinusoidal encoding: golden values, properties, bad input."""

import numpy as np
import pytest

import posenc


def test_position_one_dim_four_golden():
    # PE[1] for dim 4: omega = (1, 1/100) -> [sin 1, cos 1, sin 0.01, cos 0.01]
    expected = [np.sin(1.0), np.cos(1.0), np.sin(0.01), np.cos(0.01)]
    np.testing.assert_allclose(posenc.sinusoidal(2, 4)[1], expected, rtol=0, atol=1e-15)


def test_seed_002_table_d4_three_decimals():
    # Source: seeds/002 ("The cat sat", d_model = 4), values printed to 3 decimals.
    seed = [
        [0.000, 1.000, 0.000, 1.000],
        [0.841, 0.540, 0.010, 0.999],
        [0.909, -0.416, 0.020, 0.999],
        [0.141, -0.990, 0.030, 0.999],
    ]
    # the seed truncates cos(0.01) = 0.99995 to 0.999; compare to within 1e-3
    np.testing.assert_allclose(posenc.sinusoidal(4, 4), seed, atol=1e-3)


def test_columns_are_sin_and_cos_of_frequencies():
    dim, base = 10, 500.0
    pos = np.array([0, 3, 17, 250])
    table = posenc.sinusoidal(pos, dim, base=base)
    omega = base ** (-np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(table[:, 0::2], np.sin(pos[:, None] * omega), atol=1e-15)
    np.testing.assert_allclose(table[:, 1::2], np.cos(pos[:, None] * omega), atol=1e-15)
    assert table.dtype == np.float64 and table.shape == (4, dim)


def test_bounded_in_unit_interval_seed_001():
    # Source: seeds/001 "Property 1": 10000 x 512 table has min -1.000000, max 1.000000
    table = posenc.sinusoidal(10_000, 512)
    assert table.shape == (10_000, 512)
    assert table.min() >= -1.0 and table.max() <= 1.0
    assert round(float(table.min()), 6) == -1.0 and round(float(table.max()), 6) == 1.0


def test_frequencies_and_wavelengths_seed_001():
    # Source: seeds/001 section 6 (d_model = 64): dims 0, 10, 30, 62 -> pairs 0, 5, 15, 31
    wl = posenc.wavelengths(64)
    assert wl.shape == (32,)
    assert f"{wl[0]:.2f}" == "6.28"
    assert f"{wl[5]:.2f}" == "26.50"
    assert f"{wl[15]:.2f}" == "471.17"
    assert f"{wl[31]:.2e}" == "4.71e+04"
    np.testing.assert_allclose(posenc.frequencies(64), 2 * np.pi / wl, rtol=1e-15)
    assert posenc.frequencies(64)[0] == 1.0


def test_int_length_equals_arange():
    np.testing.assert_array_equal(posenc.sinusoidal(7, 6), posenc.sinusoidal(np.arange(7), 6))
    np.testing.assert_array_equal(posenc.sinusoidal([2.0, 5.0], 6), posenc.sinusoidal([2, 5], 6))
    assert posenc.sinusoidal(0, 6).shape == (0, 6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(positions=4, dim=7), "dim must be even, got 7"),
        (dict(positions=4, dim=0), "dim must be a positive even integer, got 0"),
        (dict(positions=4, dim=-4), "dim must be a positive even integer, got -4"),
        (dict(positions=4, dim=4.0), "dim must be an integer, got 4.0"),
        (dict(positions=[0, 1.5], dim=4), "positions must hold integers, got 1.5"),
        (dict(positions=[0, -2], dim=4), "positions must be non-negative, got -2"),
        (dict(positions=-3, dim=4), "positions must be >= 0, got -3"),
        (dict(positions=[[0, 1]], dim=4), r"positions must be an int or a 1-D array"),
        (dict(positions=4, dim=4, base=0.0), "base must be a positive finite number, got 0.0"),
        (dict(positions=4, dim=4, base=-10), "base must be a positive finite number, got -10"),
    ],
)
def test_bad_input_names_parameter_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.sinusoidal(**kwargs)


@pytest.mark.parametrize("fn", [posenc.frequencies, posenc.wavelengths])
def test_frequency_helpers_validate(fn):
    with pytest.raises(ValueError, match="dim must be even, got 5"):
        fn(5)
    with pytest.raises(ValueError, match="base must be a positive finite number"):
        fn(4, base=-1.0)
