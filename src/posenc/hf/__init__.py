"""The Hugging Face bridge: a transformers config read as transformers reads it, as posenc settings.

Pure Python/NumPy: transformers is never imported (a config object is read through its
``to_dict()``). The rules mirror transformers 5.23.0 -- ``modeling_rope_utils``
(``standardize_rope_params`` and each ``ROPE_INIT_FUNCTIONS`` entry) and the model classes
that read RoPE keys their own way -- and are tested against it in ``tests/test_from_hf*.py``.

* ``defaults``: what transformers' config classes assume where a config is silent;
* ``config``: reading one setting at a time, refusing by name what cannot be read;
* ``rope`` / ``mrope``: the keyword arguments of ``RotaryEmbedding`` and ``MRoPE``;
* ``schedule``: every layer of a model (RoPE or none, window, chunk, temperature, slice);
* ``use``, ``to_hf``, ``from_pretrained``: posenc's schemes in transformers models, from
  :mod:`posenc.torch.hf` (torch; resolved when first asked for, never at import).

Depends on :mod:`posenc.scaling`, never the reverse.
"""

from posenc.hf.axial import axial_from_hf
from posenc.hf.defaults import HF_VERSION, ROPE_TYPES
from posenc.hf.mrope import mrope_from_hf
from posenc.hf.rope import from_hf
from posenc.hf.schedule import schedule_from_hf

__all__ = [
    "from_hf",
    "mrope_from_hf",
    "axial_from_hf",
    "schedule_from_hf",
    "to_hf",
    "use",
    "from_pretrained",
    "HF_VERSION",
    "ROPE_TYPES",
]


def __getattr__(name):
    if name in ("use", "to_hf", "from_pretrained"):  # the torch side, resolved on first use
        import posenc.torch.hf

        return getattr(posenc.torch.hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
