"""The shared input checks, exactly: each message in full, each boundary from both sides.

Every public constructor relies on these, so a check that lets one bad value through (or
refuses a good one) is a silent wrong answer somewhere else.
"""

from __future__ import annotations

import numpy as np
import pytest
from expect import raises_exactly

from posenc._checks import check_dim, check_int, check_positions, check_positive


@pytest.mark.parametrize("value", [0, 1, 7, -3, np.int64(5), np.int32(0)])
def test_check_int_returns_a_python_int(value):
    out = check_int("n", value)
    assert out == int(value) and type(out) is int


@pytest.mark.parametrize("value", [True, False, 2.0, "3", None, np.float64(2.0)])
def test_check_int_refuses_non_integers(value):
    with raises_exactly(f"n must be an integer, got {value!r}"):
        check_int("n", value)


def test_check_int_minimum_is_inclusive():
    assert check_int("n", 3, minimum=3) == 3
    with raises_exactly("n must be >= 3, got 2"):
        check_int("n", 2, minimum=3)
    assert check_int("n", -5) == -5  # no minimum: nothing refused for its size


def test_check_int_even():
    assert check_int("n", 4, even=True) == 4
    assert check_int("n", 0, even=True) == 0
    with raises_exactly("n must be even, got 5"):
        check_int("n", 5, even=True)
    assert check_int("n", 5) == 5  # odd is fine unless asked


@pytest.mark.parametrize("value", [2, 4, 64, np.int64(8)])
def test_check_dim_accepts_positive_even(value):
    assert check_dim("dim", value) == int(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "dim must be a positive even integer, got 0"),
        (-2, "dim must be a positive even integer, got -2"),
        (3, "dim must be even, got 3"),
        (1, "dim must be >= 2, got 1"),
        (True, "dim must be an integer, got True"),
        (2.0, "dim must be an integer, got 2.0"),
    ],
)
def test_check_dim_messages(value, message):
    with raises_exactly(message):
        check_dim("dim", value)


@pytest.mark.parametrize("value", [1, 0.5, 1e-300, np.float32(2.5), 10_000])
def test_check_positive_returns_a_float(value):
    out = check_positive("base", value)
    assert out == float(value) and type(out) is float


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "base must be a positive finite number, got 0.0"),
        (-1.5, "base must be a positive finite number, got -1.5"),
        (float("inf"), "base must be a positive finite number, got inf"),
        (float("nan"), "base must be a positive finite number, got nan"),
        (True, "base must be a positive real number, got True"),
        ("2", "base must be a positive real number, got '2'"),
        (1j, "base must be a positive real number, got 1j"),
    ],
)
def test_check_positive_messages(value, message):
    with raises_exactly(message):
        check_positive("base", value)


def test_check_positions_int_is_a_range():
    out = check_positions(4)
    assert out.dtype == np.int64 and out.tolist() == [0, 1, 2, 3]
    assert check_positions(np.int64(2)).tolist() == [0, 1]
    assert check_positions(0).shape == (0,)
    with raises_exactly("pos must be >= 0, got -1"):
        check_positions(-1, name="pos")


@pytest.mark.parametrize(
    "positions",
    [
        [3, 0, 7],
        np.array([5, 2], dtype=np.int32),
        [3.0, 4.0],
        np.array([1.0, 6.0], dtype=np.float32),
        np.array([], dtype=int),
    ],
)
def test_check_positions_arrays(positions):
    out = check_positions(positions)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.asarray(positions, dtype=np.int64))


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        ([[0, 1]], "pos must be an int or a 1-D array, got shape (1, 2)"),
        (np.array(3), "pos must be an int or a 1-D array, got shape ()"),
        ([True, False], "pos must hold integers, got dtype bool"),
        (["a"], "pos must hold integers, got dtype <U1"),
        ([1.0, 2.5], "pos must hold integers, got 2.5"),
        (np.array([1.0, 2.5], dtype=np.float32), "pos must hold integers, got 2.5"),
        ([0.0, float("nan")], "pos must hold integers, got nan"),
        ([float("inf")], "pos must hold integers, got inf"),
        ([2, -1, -3], "pos must be non-negative, got -1"),
        ([0.0, -2.0], "pos must be non-negative, got -2.0"),
        (True, "pos must be an int or a 1-D array, got shape ()"),
    ],
)
def test_check_positions_messages(positions, message):
    with raises_exactly(message):
        check_positions(positions, name="pos")


def test_check_positions_default_name():
    with raises_exactly("positions must be non-negative, got -1"):
        check_positions([-1])
