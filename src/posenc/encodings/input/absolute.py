"""Absolute encodings that are *added to the input*: the sinusoidal table of Vaswani et al.

NumPy reference, float64 and cache-free. Shape legend: ``seq`` positions, ``dim``
embedding width (even), ``dim // 2`` frequency pairs.

Convention: pair ``i`` occupies columns ``(2i, 2i + 1)`` = ``(sin, cos)`` and turns at
the angular rate ``omega_i = base ** (-2i / dim)``.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_dim, check_positions, check_positive

__all__ = ["frequencies", "wavelengths", "sinusoidal", "shift_operator", "sinusoidal_dot"]


def frequencies(dim: int, *, base: float = 10_000.0) -> np.ndarray:
    r"""Angular rates :math:`\omega_i = \text{base}^{-2i/\text{dim}}` of the sinusoidal pairs.

    Parameters
    ----------
    dim : int
        Embedding width; a positive even integer.
    base : float
        The constant that sets the slowest rate; must be positive.

    Returns
    -------
    numpy.ndarray
        Float64 array of shape ``(dim // 2,)``, starting at 1 and decreasing
        geometrically towards ``1 / base``.

    Examples
    --------
    >>> import posenc
    >>> posenc.frequencies(4)
    array([1.  , 0.01])
    """
    dim = check_dim("dim", dim)
    base = check_positive("base", base)
    i = np.arange(dim // 2, dtype=np.float64)  # (dim // 2,)
    return base ** (-2.0 * i / dim)  # (dim // 2,)


def wavelengths(dim: int, *, base: float = 10_000.0) -> np.ndarray:
    r"""Wavelengths :math:`2\pi / \omega_i`, in positions, of the sinusoidal pairs.

    Parameters
    ----------
    dim : int
        Embedding width; a positive even integer.
    base : float
        The constant that sets the slowest rate; must be positive.

    Returns
    -------
    numpy.ndarray
        Float64 array of shape ``(dim // 2,)``; entry ``i`` is the period of
        columns ``2i`` and ``2i + 1``.

    Examples
    --------
    >>> import posenc
    >>> [f"{w:.2f}" for w in posenc.wavelengths(64)[[0, 5, 15, 31]]]
    ['6.28', '26.50', '471.17', '47117.24']
    """
    return 2.0 * np.pi / frequencies(dim, base=base)


def sinusoidal(positions, dim: int, *, base: float = 10_000.0) -> np.ndarray:
    r"""The sinusoidal position table of Vaswani et al. (2017).

    .. math::

        PE_{p,\,2i} = \sin(p\,\omega_i), \qquad PE_{p,\,2i+1} = \cos(p\,\omega_i),
        \qquad \omega_i = \text{base}^{-2i/\text{dim}}.

    Parameters
    ----------
    positions : int or array_like of int
        Either a length ``n`` (positions ``0 .. n - 1``) or a 1-D array of
        non-negative integer positions.
    dim : int
        Embedding width; a positive even integer.
    base : float
        The constant that sets the slowest rate; must be positive.

    Returns
    -------
    numpy.ndarray
        Float64 array of shape ``(len(positions), dim)``; even columns hold sines,
        odd columns cosines.

    Raises
    ------
    ValueError
        If ``dim`` is not a positive even integer, ``base`` is not positive, or
        ``positions`` holds negative or non-integer values.

    Examples
    --------
    >>> import posenc
    >>> posenc.sinusoidal(3, 4).round(3)
    array([[ 0.   ,  1.   ,  0.   ,  1.   ],
           [ 0.841,  0.54 ,  0.01 ,  1.   ],
           [ 0.909, -0.416,  0.02 ,  1.   ]])
    >>> posenc.sinusoidal([10, 20], 8).shape
    (2, 8)
    """
    pos = check_positions(positions).astype(np.float64)  # (seq,)
    omega = frequencies(dim, base=base)  # (dim // 2,)
    angles = pos[:, None] * omega[None, :]  # (seq, dim // 2)
    table = np.empty((pos.shape[0], dim), dtype=np.float64)  # (seq, dim)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table


def shift_operator(k, dim: int, *, base: float = 10_000.0) -> np.ndarray:
    r"""The matrix :math:`T_k` that moves every sinusoidal vector ``k`` positions on.

    :math:`T_k` is block diagonal with one :math:`2\times 2` rotation per pair,

    .. math::

        T_k^{(i)} = \begin{pmatrix} \cos\omega_i k & \sin\omega_i k \\
                                     -\sin\omega_i k & \cos\omega_i k \end{pmatrix},

    so that, for column vectors, :math:`PE(p + k) = T_k\,PE(p)` for every ``p``.
    For the row-per-position tables returned by :func:`sinusoidal` that reads
    ``sinusoidal(p + k) == sinusoidal(p) @ T_k.T``.

    Parameters
    ----------
    k : float
        The offset; any finite real number (negative offsets shift backwards).
    dim : int
        Embedding width; a positive even integer.
    base : float
        The constant that sets the slowest rate; must be positive.

    Returns
    -------
    numpy.ndarray
        Float64 array of shape ``(dim, dim)``; orthogonal, and ``T_a @ T_b == T_(a+b)``.

    Examples
    --------
    >>> import numpy as np, posenc
    >>> T = posenc.shift_operator(5, 64)
    >>> pe = posenc.sinusoidal(11, 64)
    >>> bool(np.allclose(T @ pe[5], pe[10]))
    True
    """
    k = _check_offset("k", k)
    theta = k * frequencies(dim, base=base)  # (dim // 2,)
    c, s = np.cos(theta), np.sin(theta)  # (dim // 2,) each
    T = np.zeros((dim, dim), dtype=np.float64)  # (dim, dim)
    even = np.arange(0, dim, 2)  # (dim // 2,)
    T[even, even] = c
    T[even, even + 1] = s
    T[even + 1, even] = -s
    T[even + 1, even + 1] = c
    return T


def sinusoidal_dot(offset, dim: int, *, base: float = 10_000.0):
    r"""Closed form of the dot product of two sinusoidal vectors ``offset`` apart.

    .. math::

        PE(p) \cdot PE(p + k) = \sum_{i=0}^{\text{dim}/2 - 1} \cos(\omega_i k),

    which does not depend on ``p``. At ``k = 0`` it equals ``dim / 2``.

    Parameters
    ----------
    offset : float or array_like of float
        The gap ``k`` (any real; the value is even in ``k``).
    dim : int
        Embedding width; a positive even integer.
    base : float
        The constant that sets the slowest rate; must be positive.

    Returns
    -------
    float or numpy.ndarray
        Same shape as ``offset``, float64.

    Examples
    --------
    >>> import posenc
    >>> float(posenc.sinusoidal_dot(0, 64))
    32.0
    >>> posenc.sinusoidal_dot([1, 2], 4).round(4)
    array([1.5403, 0.5837])
    """
    if np.asarray(offset).dtype.kind in "bcSU":  # not True, 1j or "1.5"; Fraction is fine
        raise ValueError(f"offset must hold real numbers, got {offset!r}")
    k = np.asarray(offset, dtype=np.float64)
    if not np.all(np.isfinite(k)):
        raise ValueError(f"offset must be finite, got {offset!r}")
    omega = frequencies(dim, base=base)  # (dim // 2,)
    out = np.cos(k[..., None] * omega).sum(axis=-1)  # offset.shape
    return out if out.ndim else out[()]


def _check_offset(name, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value
