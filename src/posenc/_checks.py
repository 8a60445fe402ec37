"""Input validation shared by the NumPy reference and the torch layer.

Every check raises :class:`ValueError` naming the parameter and the bad value, so a
user sees ``dim must be a positive even integer, got 7`` rather than a shape error
three calls later.
"""

from __future__ import annotations

import numbers

import numpy as np


def check_int(name: str, value, *, minimum: int | None = None, even: bool = False) -> int:
    """Return ``value`` as an ``int`` or raise ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even, got {value}")
    return value


def check_dim(name: str, value) -> int:
    """A positive even width such as ``dim`` or ``head_dim``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value <= 0:
        raise ValueError(f"{name} must be a positive even integer, got {value}")
    return check_int(name, value, minimum=2, even=True)


def check_positive(name: str, value) -> float:
    """A finite real number > 0 such as ``base`` or ``factor``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive real number, got {value!r}")
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


def check_positions(positions, name: str = "positions") -> np.ndarray:
    """Turn an int length or an array of positions into a 1-D int64 array.

    An int ``n`` means ``0, 1, ..., n - 1``. Arrays must hold non-negative
    integer values (floats such as ``3.0`` are accepted, ``2.5`` is not).
    """
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        n = check_int(name, positions, minimum=0)
        return np.arange(n, dtype=np.int64)
    arr = np.asarray(positions)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be an int or a 1-D array, got shape {arr.shape}")
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            raise ValueError(f"{name} must hold integers, got {arr[bad][0].item()!r}")
    if (arr < 0).any():
        raise ValueError(f"{name} must be non-negative, got {arr[arr < 0][0].item()!r}")
    return arr.astype(np.int64)
