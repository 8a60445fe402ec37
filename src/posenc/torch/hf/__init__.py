"""posenc inside Hugging Face models: ``use`` (a scheme put into a loaded model), ``to_hf``
(a RoPE scheme as the config HF builds it from) and ``from_pretrained`` (a saved ``use``d
model reloaded). The config readers are the pure-Python bridge :mod:`posenc.hf`, which
offers these three names too (resolved when first asked for).

* ``bind``: :func:`use`; ``hooks``: the rotary modules and the registered attention;
* ``export``: :func:`to_hf`; ``saved``: the config a saved model carries, :func:`from_pretrained`.
"""

from posenc.torch.hf.bind import use
from posenc.torch.hf.export import to_hf
from posenc.torch.hf.saved import from_pretrained

__all__ = ["use", "to_hf", "from_pretrained"]
