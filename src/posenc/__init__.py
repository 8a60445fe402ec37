"""posenc: transformer positional encodings, NumPy reference and torch modules.

``import posenc`` gives the NumPy reference (float64, cache-free) and imports neither
torch nor matplotlib; the torch modules live in :mod:`posenc.torch`.

The reference is grouped by *where* an encoding acts in attention:

* the input -- :mod:`posenc.absolute` (:func:`sinusoidal` and its algebra);
* the queries and keys -- :mod:`posenc.rotary` (:func:`rope`, :func:`xpos`), with the
  context extension scalings of :mod:`posenc.scaling`, and :mod:`posenc.pope` (PoPE);
* the scores -- :mod:`posenc.bias` (ALiBi, T5 buckets, KERPLE, FIRE), additive biases
  passed to :func:`attention` as ``bias``;
* grids of positions (images, video) -- :mod:`posenc.grid` (:func:`sinusoidal_2d`, the
  M-RoPE position ids) and :mod:`posenc.rotary_nd` (axial RoPE, M-RoPE).
"""

from posenc import scaling
from posenc.absolute import (
    frequencies,
    shift_operator,
    sinusoidal,
    sinusoidal_dot,
    wavelengths,
)
from posenc.attention import attention, causal_mask, permutation_matrix
from posenc.bias import alibi_bias, alibi_slopes, fire_bias, kerple_bias, t5_buckets
from posenc.grid import grid_positions, mrope_positions, sinusoidal_2d
from posenc.pope import pope_frequencies, pope_scores
from posenc.rotary import rope, rope_frequencies, xpos, xpos_decay
from posenc.rotary_nd import axial_frequencies, mrope_frequencies, rope_nd

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "attention",
    "axial_frequencies",
    "causal_mask",
    "fire_bias",
    "frequencies",
    "grid_positions",
    "kerple_bias",
    "mrope_frequencies",
    "mrope_positions",
    "permutation_matrix",
    "pope_frequencies",
    "pope_scores",
    "rope",
    "rope_frequencies",
    "rope_nd",
    "scaling",
    "shift_operator",
    "sinusoidal",
    "sinusoidal_2d",
    "sinusoidal_dot",
    "t5_buckets",
    "wavelengths",
    "xpos",
    "xpos_decay",
]
__version__ = "0.1.0"
