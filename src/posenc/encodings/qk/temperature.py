r"""Query temperature: queries scaled by a slowly growing function of their position.

Llama 4 scales the queries of its layers without RoPE, and Ministral 3 those of every
layer, by

.. math:: \tau(p) = 1 + s \, \ln\!\left(1 + \left\lfloor \frac{p + c}{f} \right\rfloor\right),

constant over each run of ``f`` positions (``s``: ``scale``; ``f``: ``floor``; ``c``:
``shift``). It is 1 for the first ``f - c`` positions, so a model trained within them
never sees it; beyond, it sharpens the softmax as the context grows (Nakanishi, 2025,
arXiv:2501.19399). Llama 4: ``s = attn_scale``, ``f = floor_scale``, ``c = 1``; Ministral 3:
``s = llama_4_scaling_beta``, ``f = original_max_position_embeddings``, ``c = 0``.

NumPy reference, float64 and cache-free.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_positions, check_positive

__all__ = ["query_temperature"]


def query_temperature(positions, *, scale, floor, shift=0):
    """The factor :math:`\\tau(p)` on the query at each position.

    Parameters
    ----------
    positions : int or array_like of int
        1-D positions (an int ``n`` means ``0 .. n - 1``).
    scale : float
        :math:`s`, finite (0 switches the temperature off).
    floor : float
        :math:`f`, positive: the run of positions sharing one factor.
    shift : int
        :math:`c`, non-negative.

    Returns
    -------
    numpy.ndarray
        Float64 ``(len(positions),)``.

    Examples
    --------
    >>> from posenc import query_temperature
    >>> query_temperature([0, 8190, 8191, 16383], scale=0.1, floor=8192, shift=1).round(4)
    array([1.    , 1.    , 1.0693, 1.1099])
    """
    p = check_positions(positions)
    if isinstance(scale, bool) or not np.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    f = check_positive("floor", floor)
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)) or shift < 0:
        raise ValueError(f"shift must be an int >= 0, got {shift!r}")
    return 1.0 + float(scale) * np.log1p(np.floor((p + shift) / f))
