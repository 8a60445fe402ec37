"""NumPy reference ``sinusoidal_dot``: its return types and the real-number offsets it accepts.

Pins down that a scalar offset gives a NumPy float scalar (not a 0-d array), an array offset an
array of the same shape, and that any real offset (a ``Fraction``, an int past int64) is read as
a float64 before the closed form ``sum_i cos(omega_i k)`` is taken.
"""

import math
from fractions import Fraction

import numpy as np
import pytest

import posenc


def _dot_formula(k, dim, base=10_000.0):
    return sum(math.cos(float(k) * base ** (-2.0 * i / dim)) for i in range(dim // 2))


@pytest.mark.parametrize("offset", [0, 3, -2.5, 7.0])
def test_scalar_offset_returns_float_scalar(offset):
    got = posenc.sinusoidal_dot(offset, 16)
    assert isinstance(got, np.float64) and not isinstance(got, np.ndarray)
    assert isinstance(got, float)
    assert math.isclose(got, _dot_formula(offset, 16), rel_tol=1e-12, abs_tol=1e-12)


def test_zero_d_array_offset_returns_scalar_and_arrays_keep_shape():
    assert isinstance(posenc.sinusoidal_dot(np.array(2.0), 8), np.float64)
    out = posenc.sinusoidal_dot([[0, 1], [2, 3]], 8)
    assert isinstance(out, np.ndarray) and out.shape == (2, 2) and out.dtype == np.float64
    want = [[_dot_formula(k, 8) for k in row] for row in [[0, 1], [2, 3]]]
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    assert posenc.sinusoidal_dot(np.zeros(0), 8).shape == (0,)


@pytest.mark.parametrize("offset", [Fraction(1, 2), Fraction(-7, 3), 2**64, -(2**70)])
def test_any_real_offset_is_read_as_float64(offset):
    got = posenc.sinusoidal_dot(offset, 8)
    assert isinstance(got, np.float64)
    assert math.isclose(got, _dot_formula(offset, 8), rel_tol=1e-12, abs_tol=1e-12)


def test_list_of_fractions_offset():
    got = posenc.sinusoidal_dot([Fraction(1, 4), Fraction(3, 2)], 4)
    np.testing.assert_allclose(got, [_dot_formula(0.25, 4), _dot_formula(1.5, 4)], rtol=1e-12)


@pytest.mark.parametrize("offset", ["1.5", True, [1, 2j], np.array([b"2"])])
def test_offsets_that_are_not_real_numbers_are_refused(offset):
    # np.asarray(..., float64) would read "1.5" as 1.5 and True as 1.0 without a word
    with pytest.raises(ValueError, match="^offset must hold real numbers, got "):
        posenc.sinusoidal_dot(offset, 8)
