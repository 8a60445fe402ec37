"""Saving and reloading a model that :func:`posenc.hf.use` changed, without a silent change.

Where the scheme is RoPE that HF builds itself (``use``'s ``"rotary"`` path), the model's
config gets :func:`~posenc.hf.to_hf`'s ``rope_parameters``: a saved model reloads with plain
``from_pretrained`` as the same model. Otherwise the config's ``rope_parameters`` become
``{"rope_type": "posenc", "saved": <the model's own>}``: transformers refuses to build the
model from it (its rotary class has no such type), so nobody runs a RoPE model by mistake,
and :func:`from_pretrained` restores the model's own parameters, builds it, puts the scheme
back with ``use`` and loads the encodings' trained parameters.
"""

from __future__ import annotations

import json

from posenc.hf.export import _settings, to_hf

__all__ = ["mark", "from_pretrained"]

MARK = "posenc"
PREFIX = "posenc_encodings."  # where use keeps the encodings, under the base model


def mark(config, schedule, path):
    """Make ``config`` say what the model now runs (see the module docstring)."""
    old = config.rope_parameters
    if isinstance(old, dict) and old.get("rope_type") == MARK:
        old = old["saved"]
    if path == "rotary":
        try:
            config.rope_parameters = to_hf(schedule, config)["rope_parameters"]
            if _reads_as(config, schedule):  # the object's other keys agree too
                return
        except ValueError:
            pass  # HF cannot express it after all: the marked form below
    config.rope_parameters = {"rope_type": MARK, "saved": old}


def _reads_as(config, schedule):
    """Whether posenc reads ``config`` (HF's rules) as ``schedule``'s RoPE in every layer."""
    from posenc.torch import Schedule

    back = Schedule.from_hf(config)
    return all(_settings(a.encoding) == _settings(b.encoding) for a, b in zip(back, schedule))


def from_pretrained(model_class, path, scheme, **kwargs):
    """Load a model saved after :func:`posenc.hf.use`, with its scheme put back.

    Parameters
    ----------
    model_class : type
        A transformers model class (``LlamaForCausalLM``, ...).
    path : str or os.PathLike
        What ``model_class.from_pretrained`` takes (a directory or a Hub id).
    scheme : PositionalEncoding, Schedule or dict
        The scheme the model was saved with (as given to ``use``); its learned parameters
        (T5's buckets, FIRE's network, ...) are loaded from the saved weights.
    **kwargs
        Passed on to ``model_class.from_pretrained``.

    Returns
    -------
    transformers.PreTrainedModel
        The model with ``use(model, scheme)`` applied and the encodings' saved weights.

    Raises
    ------
    ValueError
        Where the saved weights lack a parameter of the scheme's encodings (another
        scheme than the one saved).
    """
    from transformers.utils import cached_file

    from posenc.hf.bind import use

    with open(cached_file(str(path), "config.json")) as f:
        d = json.load(f)
    params = d.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_type") == MARK:
        d["rope_parameters"] = params["saved"]
    config = model_class.config_class.from_dict(d)
    model = model_class.from_pretrained(path, config=config, **kwargs)
    use(model, scheme)
    want = {k for k in model.state_dict() if PREFIX in k}
    if want:
        got = _saved_tensors(path, want)
        if set(got) != want:
            raise ValueError(f"the saved weights lack {sorted(want - set(got))}: the scheme "
                             "is not the one the model was saved with")  # fmt: skip
        model.load_state_dict(got, strict=False)
    return model


def _saved_tensors(path, names):
    """The tensors ``names`` from a saved model's safetensors file(s)."""
    from safetensors.torch import load_file
    from transformers.utils import cached_file

    index = cached_file(str(path), "model.safetensors.index.json",
                        _raise_exceptions_for_missing_entries=False)  # fmt: skip
    if index is None:
        files = {cached_file(str(path), "model.safetensors")}
    else:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = {cached_file(str(path), weight_map[n]) for n in names if n in weight_map}
    found = {}
    for file in files:
        found |= {k: v for k, v in load_file(file).items() if k in names}
    return found
