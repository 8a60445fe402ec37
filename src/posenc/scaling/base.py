"""The scaling interface and the scalings that treat every pair alike: PI, NTK, dynamic NTK.

Every scaling maps the default rates ``inv_freq_i = base ** (-2i / dim)`` (``dim`` is the
rotary width) to new rates and an attention scale that multiplies cos and sin. NumPy,
float64; formulas and defaults as HF transformers' ``modeling_rope_utils``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posenc._checks import check_dim, check_int, check_positive

__all__ = ["Scaling", "Linear", "NTK", "DynamicNTK"]


def _default_inv_freq(dim: int, base: float) -> np.ndarray:
    """``base ** (-2i / dim)``; ``dim`` is checked by the caller (each ``inv_freq``, once)."""
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # (dim // 2,)


class Scaling:
    """Base class of the scalings: maps a rotary width and base to new inverse frequencies.

    ``length_dependent`` is true for scalings that read the current sequence length.
    """

    length_dependent = False

    def inv_freq(self, dim, base, seq_len=None):
        """Inverse frequencies and attention scale for rotary width ``dim``.

        Parameters
        ----------
        dim : int
            Rotary width (even).
        base : float
            The RoPE base.
        seq_len : int, optional
            Current sequence length (read only by length-dependent scalings).

        Returns
        -------
        inv_freq : numpy.ndarray
            Float64, shape ``(dim // 2,)``.
        attention_scale : float
            Multiplies cos and sin.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class Linear(Scaling):
    """Position interpolation (Chen et al., 2023, arXiv:2306.15595): every rate / ``factor``.

    Parameters
    ----------
    factor : float
        How many times longer the target context is; must be positive.
    """

    factor: float

    def __post_init__(self):
        check_positive("factor", self.factor)

    def inv_freq(self, dim, base, seq_len=None):
        return _default_inv_freq(check_dim("dim", dim), base) / self.factor, 1.0


@dataclass(frozen=True)
class NTK(Scaling):
    """Static NTK-aware scaling (bloc97, 2023): ``base * factor ** (dim / (dim - 2))``.

    High-frequency pairs are almost unchanged, the slowest pair is slowed by ``factor``.

    Parameters
    ----------
    factor : float
        Context extension factor; must be positive.
    """

    factor: float

    def __post_init__(self):
        check_positive("factor", self.factor)

    def inv_freq(self, dim, base, seq_len=None):
        if check_dim("dim", dim) == 2:
            raise ValueError("dim must be >= 4 for NTK scaling (base ** (dim / (dim - 2))), got 2")
        return _default_inv_freq(dim, base * self.factor ** (dim / (dim - 2))), 1.0


@dataclass(frozen=True)
class DynamicNTK(Scaling):
    """Dynamic NTK scaling (emozilla, 2023): NTK with a factor that grows with the length.

    At ``seq_len <= original_max_len`` the rates are the defaults; beyond, the base becomes
    ``base * (factor * seq_len / original_max_len - (factor - 1)) ** (dim / (dim - 2))``.

    Parameters
    ----------
    factor : float
        Must be positive.
    original_max_len : int
        Training context length.
    """

    factor: float
    original_max_len: int
    length_dependent = True

    def __post_init__(self):
        check_positive("factor", self.factor)
        check_int("original_max_len", self.original_max_len, minimum=1)

    def inv_freq(self, dim, base, seq_len=None):
        n = max(seq_len or self.original_max_len, self.original_max_len)
        grow = self.factor * n / self.original_max_len - (self.factor - 1)  # >= 1
        return NTK(grow).inv_freq(dim, base)  # static NTK at the current factor
