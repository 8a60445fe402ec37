"""Score biases whose shape is learned: KERPLE and FIRE.

NumPy reference, float64 and cache-free, with the learned parameters passed in; shapes as in
:mod:`posenc.encodings.scores.bias`. KERPLE depends on ``i - j`` only; FIRE too while the
query ``i`` stays below its threshold ``L``.
"""

from __future__ import annotations

import numpy as np

from posenc._checks import check_positive
from posenc.encodings.scores.bias import _positions, relative_positions

__all__ = ["kerple_bias", "fire_bias"]


def kerple_bias(q_positions, k_positions, r1, r2, *, variant="log") -> np.ndarray:
    r"""KERPLE (Chi et al., 2022): a learned, conditionally positive definite distance kernel.

    ``"log"``: :math:`B_{h,i,j} = -r_1^{(h)} \log(1 + r_2^{(h)} |i - j|)`;
    ``"power"``: :math:`B_{h,i,j} = -r_1^{(h)} |i - j|^{r_2^{(h)}}` with
    :math:`0 < r_2 \le 2`. With ``"power"`` and :math:`r_2 = 1` it is symmetric ALiBi.

    Parameters
    ----------
    q_positions, k_positions : int or array_like of int
        ``(seq,)`` or ``(batch, seq)``.
    r1, r2 : array_like
        Positive per-head parameters ``(heads,)``.
    variant : {"log", "power"}
        The kernel.

    Returns
    -------
    numpy.ndarray
        Float64 ``(heads, seq_q, seq_k)`` or ``(batch, heads, seq_q, seq_k)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.kerple_bias(3, 3, [1.0], [1.0], variant="power")[0, 2]
    array([-2., -1., -0.])
    """
    r1, r2 = (np.asarray(a, dtype=np.float64) for a in (r1, r2))
    if r1.ndim != 1 or r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must have shape (heads,), got {r1.shape} and {r2.shape}")
    if (r1 <= 0).any() or (r2 <= 0).any():
        raise ValueError("r1 and r2 must be positive")
    dist = np.abs(relative_positions(q_positions, k_positions)).astype(np.float64)[..., None, :, :]
    if variant == "log":
        return -r1[:, None, None] * np.log1p(r2[:, None, None] * dist)
    if variant == "power":
        if (r2 > 2).any():
            raise ValueError(f"r2 must be <= 2 for the power variant, got {r2.max()}")
        return -r1[:, None, None] * dist ** r2[:, None, None]
    raise ValueError(f"variant must be one of ('log', 'power'), got {variant!r}")


def fire_bias(q_positions, k_positions, *, c, threshold, w1, b1, w2, b2, eps=1e-6) -> np.ndarray:
    r"""FIRE (Li et al., 2023): an MLP of the progressively interpolated distance.

    .. math::

        B_{h,i,j} = f_\theta\!\left(\frac{\psi(|i - j|)}{\psi(\max(L, i))}\right),
        \qquad \psi(x) = \log(c\,x + 1),

    where :math:`f_\theta` is a one-hidden-layer ReLU MLP from 1 input to ``heads``
    outputs. Dividing by :math:`\psi(\max(L, i))` maps every distance a query can see into
    :math:`[0, 1]`, whatever its position; below the threshold :math:`L` the bias depends
    on :math:`|i - j|` only. ``eps`` is added to the denominator.

    Parameters
    ----------
    q_positions, k_positions : int or array_like of int
        ``(seq,)`` or ``(batch, seq)``.
    c : float
        Positive scale of :math:`\psi`.
    threshold : float
        :math:`L`, positive.
    w1, b1 : array_like
        First layer: ``(hidden,)`` weights and ``(hidden,)`` biases.
    w2, b2 : array_like
        Second layer: ``(heads, hidden)`` weights and ``(heads,)`` biases.
    eps : float
        Added to :math:`\psi(\max(L, i))`.

    Returns
    -------
    numpy.ndarray
        Float64 ``(heads, seq_q, seq_k)`` or ``(batch, heads, seq_q, seq_k)``.
    """
    c, threshold = check_positive("c", c), check_positive("threshold", threshold)
    w1, b1, w2, b2 = (np.asarray(a, dtype=np.float64) for a in (w1, b1, w2, b2))
    if w1.ndim != 1 or b1.shape != w1.shape or w2.shape[1:] != w1.shape or b2.shape != w2.shape[:1]:
        raise ValueError(
            "FIRE weights must be w1 (hidden,), b1 (hidden,), w2 (heads, hidden), b2 (heads,), "
            f"got {w1.shape}, {b1.shape}, {w2.shape}, {b2.shape}"
        )
    rel = relative_positions(q_positions, k_positions).astype(np.float64)  # (..., sq, sk)
    i = rel + _positions("k_positions", k_positions)[..., None, :]  # query position per entry
    x = np.log1p(c * np.abs(rel)) / (np.log1p(c * np.maximum(threshold, i)) + eps)
    hidden = np.maximum(x[..., None] * w1 + b1, 0.0)  # (..., sq, sk, hidden)
    out = hidden @ w2.T + b2  # (..., sq, sk, heads)
    return np.moveaxis(out, -1, -3)  # (..., heads, sq, sk)
