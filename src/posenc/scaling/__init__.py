"""RoPE context-extension scalings: each a small object that rewrites the inverse frequencies.

Every scaling maps the default rates ``inv_freq_i = base ** (-2i / dim)`` (``dim`` is the
rotary width) to new rates and an attention scale that multiplies cos and sin. The
formulas and defaults follow HF transformers' ``modeling_rope_utils`` exactly; the
parity tests in ``tests/test_rope_parity.py`` check them. NumPy, float64.

* ``base``: the interface and the scalings that treat every pair alike (PI, NTK, dynamic NTK);
* ``per_pair``: those that treat pairs differently (YaRN, Llama 3.1, LongRoPE, proportional).

``from_hf`` (the settings of a ``RotaryEmbedding`` read from a Hugging Face config) lives in
the bridge :mod:`posenc.hf`, which depends on this package; the name stays reachable here,
resolved when first asked for, so this package never imports the bridge.
"""

from posenc.scaling.base import NTK, DynamicNTK, Linear, Scaling
from posenc.scaling.per_pair import Llama3, LongRoPE, Proportional, YaRN, yarn_mscale

__all__ = ["Scaling", "Linear", "NTK", "DynamicNTK", "YaRN", "Llama3", "LongRoPE", "Proportional"]
__all__ += ["yarn_mscale"]
__all__ += ["from_hf"]


def __getattr__(name):
    if name == "from_hf":  # the bridge imports the scalings: resolved on use, not at import
        from posenc.hf import from_hf

        return from_hf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
