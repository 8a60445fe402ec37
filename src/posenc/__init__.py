"""posenc: transformer positional encodings, NumPy reference and torch modules.

``import posenc`` gives the NumPy reference (float64, cache-free) and imports neither
torch nor matplotlib; the torch modules live in :mod:`posenc.torch`.

The reference is grouped by *where* an encoding acts in attention:

* the input -- :mod:`posenc.absolute` (:func:`sinusoidal` and its algebra);
* the queries and keys -- rotary encodings (later parts of the series);
* the scores -- additive biases, passed to :func:`attention` as ``bias``.
"""

from posenc.absolute import (
    frequencies,
    shift_operator,
    sinusoidal,
    sinusoidal_dot,
    wavelengths,
)
from posenc.attention import attention, causal_mask, permutation_matrix

__all__ = [
    "attention",
    "causal_mask",
    "frequencies",
    "permutation_matrix",
    "shift_operator",
    "sinusoidal",
    "sinusoidal_dot",
    "wavelengths",
]
__version__ = "0.1.0"
