"""Reloading a model saved after :func:`posenc.hf.use <posenc.torch.hf.use>`: :func:`from_pretrained`.

The saved config says what the model runs (:func:`posenc.torch.hf.export.mark`): HF's own
``rope_parameters`` where HF builds the scheme itself, else its own with ``"rope_type":
"posenc"``, which transformers refuses to build. :func:`from_pretrained`
restores the model's own parameters, builds it, puts the scheme back with ``use`` and loads
the encodings' trained parameters.
"""

from __future__ import annotations

import json

from posenc.torch.hf.export import unmark

__all__ = ["from_pretrained"]

# from_pretrained's keyword arguments that say where the files are
HUB = ("subfolder", "revision", "token", "cache_dir", "local_files_only", "force_download")

PREFIX = "posenc_encodings."  # where use keeps the encodings, under the base model


def from_pretrained(model_class, path, scheme, **kwargs):
    """Load a model saved after :func:`posenc.hf.use <posenc.torch.hf.use>`, with its scheme put back.

    Parameters
    ----------
    model_class : type
        A transformers model class (``LlamaForCausalLM``, ``AutoModelForCausalLM``, ...).
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
    from transformers import CONFIG_MAPPING
    from transformers.utils import cached_file

    from posenc.torch.hf.bind import use

    hub = {k: kwargs[k] for k in HUB if k in kwargs}  # where the files are: config, weights
    with open(cached_file(str(path), "config.json", **hub)) as f:
        d = _unmarked(json.load(f))
    config_class = getattr(model_class, "config_class", None) or CONFIG_MAPPING[d["model_type"]]
    config = config_class.from_dict(d)
    model = model_class.from_pretrained(path, config=config, **kwargs)
    use(model, scheme)
    want = {k for k in model.state_dict() if PREFIX in k}
    if want:
        got = _saved_tensors(path, want, hub)
        if set(got) != want:
            raise ValueError(f"the saved weights lack {sorted(want - set(got))}: the scheme "
                             "is not the one the model was saved with")  # fmt: skip
        model.load_state_dict(got, strict=False)
    return model


def _unmarked(d):
    """A config dict with every ``rope_parameters`` in it (a composite config's
    ``text_config`` too) as it was before posenc marked it."""
    if not isinstance(d, dict):
        return d
    return {k: unmark(v) if k == "rope_parameters" else _unmarked(v) for k, v in d.items()}


def _saved_tensors(path, names, hub):
    """The tensors ``names`` from a saved model's safetensors file(s)."""
    from safetensors.torch import load_file
    from transformers.utils import cached_file

    index = cached_file(str(path), "model.safetensors.index.json",
                        _raise_exceptions_for_missing_entries=False, **hub)  # fmt: skip
    if index is None:
        files = {cached_file(str(path), "model.safetensors", **hub)}
    else:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = {cached_file(str(path), weight_map[n], **hub) for n in names if n in weight_map}
    found = {}
    for file in files:
        found |= {k: v for k, v in load_file(file).items() if k in names}
    return found
