"""Scalings that treat the pairs differently: YaRN, Llama 3.1, LongRoPE, Gemma 4's proportional.

Fast pairs (many turns over the training length) keep their rates, slow pairs are
interpolated, or each pair has its own factor. NumPy, float64; formulas and defaults as HF
transformers' ``modeling_rope_utils``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posenc._checks import check_dim, check_int, check_positive
from posenc.scaling.base import Scaling, _default_inv_freq

__all__ = ["YaRN", "Llama3", "LongRoPE", "Proportional", "yarn_mscale"]


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(factor) + 1`` (1 for ``factor <= 1``).

    Parameters
    ----------
    factor : float
        The context-extension factor.
    mscale : float
        DeepSeek's ``mscale`` or ``mscale_all_dim`` (1 in YaRN's paper).

    Returns
    -------
    float
        The factor on cos and sin (or, squared, on the softmax scale).

    Examples
    --------
    >>> from posenc.scaling import yarn_mscale
    >>> round(yarn_mscale(40.0, 1.0), 4)
    1.3689
    """
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class YaRN(Scaling):
    """YaRN (Peng et al., 2023, arXiv:2309.00071): NTK-by-parts plus attention temperature.

    Pairs that rotate more than ``beta_fast`` times over ``original_max_len`` keep their
    rate, pairs that rotate fewer than ``beta_slow`` times are interpolated by
    ``factor``, with a linear ramp in between. The attention scale is
    ``0.1 * log(factor) + 1`` unless given.

    Parameters
    ----------
    factor : float
        Must be positive.
    original_max_len : int
        Training context length.
    beta_fast, beta_slow : float
        Rotation counts bounding the ramp (defaults 32 and 1).
    attention_factor : float, optional
        Overrides the computed attention scale; must be positive.
    mscale, mscale_all_dim : float, optional
        DeepSeek-style scale: ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)``.
    truncate : bool
        Round the ramp bounds outwards to whole dimensions (HF default True).
    """

    factor: float
    original_max_len: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self):
        check_positive("factor", self.factor)
        check_int("original_max_len", self.original_max_len, minimum=1)
        check_positive("beta_fast", self.beta_fast)
        check_positive("beta_slow", self.beta_slow)
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)
        for name in ("mscale", "mscale_all_dim"):  # 0 is allowed: it switches the pair off
            value = getattr(self, name)
            if value is not None and value != 0:
                check_positive(name, value)

    def _scale(self):
        get_mscale = yarn_mscale
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:  # both truthy, as in HF
            m, m_all = self.mscale, self.mscale_all_dim
            return get_mscale(self.factor, m) / get_mscale(self.factor, m_all)
        return get_mscale(self.factor)

    def inv_freq(self, dim, base, seq_len=None):
        check_dim("dim", dim)

        def correction_dim(rotations):  # dimension index that turns `rotations` times
            turns = self.original_max_len / (rotations * 2 * math.pi)
            return dim * math.log(turns) / (2 * math.log(base))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # avoid a zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        keep = 1 - ramp  # 1: extrapolate (keep the rate), 0: interpolate (rate / factor)
        inv = _default_inv_freq(dim, base)  # (dim // 2,)
        return inv / self.factor * (1 - keep) + inv * keep, self._scale()


@dataclass(frozen=True)
class Llama3(Scaling):
    """Llama 3.1 scaling (Meta, 2024): slow pairs / ``factor``, fast pairs kept, smooth between.

    Parameters
    ----------
    factor : float
        Interpolation factor for the low frequencies (8 for Llama 3.1); must be positive.
    low_freq_factor, high_freq_factor : float
        Wavelength thresholds ``original_max_len / low_freq_factor`` and
        ``original_max_len / high_freq_factor`` (1 and 4 for Llama 3.1).
    original_max_len : int
        Training context length (8192 for Llama 3.1).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_len: int

    def __post_init__(self):
        check_positive("factor", self.factor)
        check_positive("low_freq_factor", self.low_freq_factor)
        check_positive("high_freq_factor", self.high_freq_factor)
        check_int("original_max_len", self.original_max_len, minimum=1)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor must be > low_freq_factor={self.low_freq_factor}, "
                f"got {self.high_freq_factor}"
            )

    def inv_freq(self, dim, base, seq_len=None):
        inv = _default_inv_freq(check_dim("dim", dim), base)  # (dim // 2,)
        wavelen = 2 * math.pi / inv
        low_wavelen = self.original_max_len / self.low_freq_factor
        high_wavelen = self.original_max_len / self.high_freq_factor
        out = np.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (self.original_max_len / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * out / self.factor + smooth * out
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, out), 1.0


@dataclass(frozen=True)
class LongRoPE(Scaling):
    """LongRoPE (Ding et al., 2024, arXiv:2402.13753) as used by Phi-3: searched per-pair factors.

    Rates are divided by ``short_factor`` up to ``original_max_len`` and by ``long_factor``
    beyond; the attention scale is ``sqrt(1 + log(factor) / log(original_max_len))`` (1 for
    ``factor <= 1``). No defaults: HF derives a missing ``factor`` from the config (32, scale
    1.19, for Phi-3-mini-128k); ``posenc.scaling.from_hf`` fills every argument as HF does.

    Parameters
    ----------
    short_factor, long_factor : sequence of float
        One positive factor per pair (``dim // 2`` entries).
    original_max_len : int
        Training context length.
    factor : float
        Overall extension ratio (``max_len / original_max_len``), sets the attention scale.
    attention_factor : float, optional
        Overrides the computed attention scale; must be positive.
    short_mscale, long_mscale : float, optional
        Phi-3.5-MoE's attention scales, given together: ``short_mscale`` up to
        ``original_max_len``, ``long_mscale`` beyond (they override the others).
    """

    short_factor: tuple
    long_factor: tuple
    original_max_len: int
    factor: float
    attention_factor: float | None = None
    short_mscale: float | None = None
    long_mscale: float | None = None
    length_dependent = True

    def __post_init__(self):
        for name in ("short_factor", "long_factor"):
            values = tuple(float(f) for f in getattr(self, name))
            if not values or min(values) <= 0:
                raise ValueError(f"{name} must be a non-empty list of positive numbers")
            object.__setattr__(self, name, values)
        check_int("original_max_len", self.original_max_len, minimum=1)
        check_positive("factor", self.factor)
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)
        if (self.short_mscale is None) != (self.long_mscale is None):
            raise ValueError(
                "short_mscale and long_mscale must be given together, got "
                f"{self.short_mscale} and {self.long_mscale}"
            )
        if self.short_mscale is not None:
            check_positive("short_mscale", self.short_mscale)
            check_positive("long_mscale", self.long_mscale)
        elif self.attention_factor is None and self.factor > 1 and self.original_max_len == 1:
            raise ValueError(  # the default scale divides by log(original_max_len)
                "original_max_len must be at least 2 when factor > 1 sets the attention scale, "
                "got 1"
            )

    def inv_freq(self, dim, base, seq_len=None):
        check_dim("dim", dim)
        use_long = seq_len is not None and seq_len > self.original_max_len
        ext = np.asarray(self.long_factor if use_long else self.short_factor)
        if ext.shape != (dim // 2,):
            raise ValueError(
                f"LongRoPE factors must have dim // 2 = {dim // 2} entries, got {ext.size}"
            )
        if self.short_mscale is not None:
            scale = float(self.long_mscale if use_long else self.short_mscale)
        elif self.attention_factor is not None:
            scale = float(self.attention_factor)
        elif self.factor <= 1.0:
            scale = 1.0
        else:
            scale = math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_len))
        return _default_inv_freq(dim, base) / ext, scale


@dataclass(frozen=True)
class Proportional(Scaling):
    """HF's ``"proportional"`` RoPE (Gemma 4): the first ``int(fraction * dim // 2)`` pairs get
    ``base ** (-2j / dim)`` (full width ``dim`` in the exponent, unlike ``rotary_dim``), the
    others rate 0 (not rotated); then every rate is divided by ``factor``.

    Parameters
    ----------
    fraction : float
        HF's ``partial_rotary_factor``, in ``(0, 1]``.
    factor : float
        Divides every rate (HF default 1); must be positive.
    """

    fraction: float
    factor: float = 1.0

    def __post_init__(self):
        check_positive("factor", self.factor)
        if check_positive("fraction", self.fraction) > 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")

    def inv_freq(self, dim, base, seq_len=None):
        check_dim("dim", dim)
        rotated = int(self.fraction * dim // 2)
        inv = np.zeros(dim // 2)
        inv[:rotated] = base ** (-np.arange(0, 2 * rotated, 2, dtype=np.float64) / dim)
        return inv / self.factor, 1.0
