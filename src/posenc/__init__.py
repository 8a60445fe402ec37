"""posenc: transformer positional encodings, NumPy reference and torch modules.

``import posenc`` gives the NumPy reference (float64, cache-free) and imports neither
torch nor matplotlib; the torch modules live in :mod:`posenc.torch`.

The reference is grouped, as the torch modules are, by *where* an encoding acts in
attention (:mod:`posenc.encodings`); a formula and its torch module share a name
(``posenc.encodings.qk.rope`` and ``posenc.torch.encodings.qk.rope``):

* the input -- ``encodings.input``: :func:`sinusoidal` and its algebra, MAE's
  :func:`sinusoidal_2d`;
* the queries and keys -- ``encodings.qk``: :func:`rope` (with the context-extension
  scalings of :mod:`posenc.scaling`), :func:`xpos`, :func:`rope_nd` (axial RoPE, M-RoPE)
  and PoPE (:func:`pope_scores`);
* the scores -- ``encodings.scores``: ALiBi, T5 buckets, KERPLE, FIRE, additive biases
  passed to :func:`attention` as ``bias``.

Positions on grids (:func:`grid_positions`, :func:`mrope_positions`) are in
:mod:`posenc.positions`; the Hugging Face config bridge is :mod:`posenc.hf`.
"""

from posenc import scaling
from posenc.attention import attention, causal_mask, permutation_matrix
from posenc.encodings.input.absolute import (
    frequencies,
    shift_operator,
    sinusoidal,
    sinusoidal_dot,
    wavelengths,
)
from posenc.encodings.input.sinusoidal_2d import sinusoidal_2d
from posenc.encodings.qk.pope import pope_frequencies, pope_scores
from posenc.encodings.qk.rope import rope, rope_frequencies
from posenc.encodings.qk.rope_nd import axial_frequencies, mrope_frequencies, rope_nd
from posenc.encodings.qk.temperature import query_temperature
from posenc.encodings.qk.xpos import xpos, xpos_decay
from posenc.encodings.scores.bias import alibi_bias, alibi_slopes, t5_buckets
from posenc.encodings.scores.learned_bias import fire_bias, kerple_bias
from posenc.positions import grid_positions, mrope_positions

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
    "query_temperature",
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
