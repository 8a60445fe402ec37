"""The layer rules of posenc.hf (layers, settled, windows) against transformers 5.23.0's own
config classes, case by case where the mutation run found them unchecked: the layer types a
class derives where a config.json gives none, the windows it keeps, the widths it gives its
layers, and the values posenc refuses, by name. Each oracle is an HF config class built on a
tiny config (no model weights); the dict posenc reads is what ``save_pretrained`` would write
(``to_dict()``), plus the keys a class pops from its keywords (a Hub config.json holds them)."""

from __future__ import annotations

import pytest

from posenc.hf import layers, settled

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402


def _hf(model_type, **kw):
    return CONFIG_MAPPING[model_type](**kw)


def _dict(config, **popped):
    """``config.to_dict()`` without its derived ``layer_types``, with the popped keys."""
    d = config.to_dict() | popped
    d.pop("layer_types", None)
    return d


def _hf_types(config):
    types = getattr(config, "layer_types", None)
    return list(types if types is not None else config.layers_block_type)


def _posenc_types(d, model_type, depth):
    return layers.layer_types(settled.settle(d, model_type, depth), model_type, depth)


# model type -> the class keywords (a config.json's keys), the keys the class pops from them
CLASS_RULES = [
    ("qwen2", {"num_hidden_layers": 4, "sliding_window": 4, "max_window_layers": 2}, ()),
    ("qwen2", {"num_hidden_layers": 4, "sliding_window": 4, "max_window_layers": 2,
               "use_sliding_window": True}, ()),
    ("qwen2_moe", {"num_hidden_layers": 6, "sliding_window": 4, "max_window_layers": 4,
                   "use_sliding_window": True}, ()),
    ("qwen2_moe", {"num_hidden_layers": 6, "sliding_window": 4, "max_window_layers": 4}, ()),
    ("gemma3_text", {"num_hidden_layers": 7, "sliding_window": 4, "sliding_window_pattern": 3},
     ()),
    ("cohere2", {"num_hidden_layers": 7, "sliding_window": 4, "sliding_window_pattern": 3},
     ("sliding_window_pattern",)),
    ("cohere2", {"num_hidden_layers": 9, "sliding_window": 4}, ()),
    ("cohere2_moe", {"num_hidden_layers": 7, "sliding_window": 4, "first_k_dense_replace": 3,
                     "prefix_dense_sliding_window_pattern": 2, "sliding_window_pattern": 3},
     ("first_k_dense_replace",)),
    ("cohere2_moe", {"num_hidden_layers": 9, "sliding_window": 4, "first_k_dense_replace": 2},
     ("first_k_dense_replace",)),
    ("bamba", {"num_hidden_layers": 4, "attn_layer_indices": [1, 3]}, ()),
    ("recurrent_gemma", {"num_hidden_layers": 5, "block_types": ["recurrent", "attention"],
                         "attention_window_size": 5}, ()),
    ("recurrent_gemma", {"num_hidden_layers": 4}, ()),
]  # fmt: skip


@pytest.mark.parametrize("model_type, kw, popped", CLASS_RULES)
def test_layer_types_a_class_derives_are_read_from_its_dict(model_type, kw, popped):
    config = _hf(model_type, **kw)
    d = _dict(config, **{k: kw[k] for k in popped})
    depth = kw["num_hidden_layers"]
    assert _posenc_types(d, model_type, depth) == _hf_types(config)


def test_legacy_layer_type_names_are_hfs():
    from transformers.configuration_utils import remap_legacy_layer_types

    given = ["mamba", "attention", "sliding_attention", "linear_attention"]
    got = layers.prepare({"layer_types": given}, "my_custom_model")["layer_types"]
    assert got == remap_legacy_layer_types(list(given))


@pytest.mark.parametrize("model_type", ["qwen2", "qwen2_moe"])
@pytest.mark.parametrize("use", [None, False, True])
def test_a_qwen_window_is_kept_only_with_use_sliding_window(model_type, use):
    kw = {} if use is None else {"use_sliding_window": use}
    config = _hf(model_type, num_hidden_layers=2, sliding_window=4, **kw)
    got = layers.prepare({"sliding_window": 4} | kw, model_type)["sliding_window"]
    assert got == (config.sliding_window or None)  # no window: HF's Qwen2-MoE keeps 0


@pytest.mark.parametrize("kw", [{}, {"attention_window_size": 5}, {"sliding_window": 7}])
def test_recurrent_gemmas_window_is_its_attention_window_size(kw):
    config = _hf("recurrent_gemma", num_hidden_layers=3, **kw)
    assert layers.prepare(kw, "recurrent_gemma")["sliding_window"] == config.attention_window_size


def test_rules_a_dict_cannot_settle_are_refused_with_what_to_do():
    # Gemma3TextConfig derives layer_types from its default window (4096): a dict without
    # sliding_window and layer_types does not say which layers slide
    config = _hf("gemma3_text", num_hidden_layers=3)
    assert config.sliding_window == 4096 and "sliding_attention" in config.layer_types
    with pytest.raises(ValueError) as err:
        layers.layer_types({}, "gemma3_text", 3)
    assert str(err.value) == (
        "config gives neither layer_types nor sliding_window, and the config class of "
        "model_type='gemma3_text' has a default window: add sliding_window, or pass the "
        "transformers config object"
    )
    # Gemma2Config slides every other layer by its own rule, which posenc does not guess
    config = _hf("gemma2", num_hidden_layers=3, sliding_window=4)
    assert config.layer_types[:2] == ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError) as err:
        layers.layer_types({"sliding_window": 4}, "gemma2", 3)
    assert str(err.value) == (
        "config gives sliding_window but no layer_types, and which layers of 'gemma2' slide "
        "is its config class's rule: pass the transformers config object"
    )
    with pytest.raises(ValueError, match=r"^layer_types must have num_hidden_layers=3 entries"
                       r", got 2$"):  # fmt: skip
        layers.layer_types({"layer_types": ["full_attention"] * 2}, "llama", 3)


# a minimal config.json (older Hub configs): the keys at their class defaults left out, so
# posenc's defaults of those keys are read: model type -> keywords, popped keys, absent keys
ABSENT_RULES = [
    ("cohere2_moe", {"num_hidden_layers": 9, "sliding_window": 4}, (),
     ("prefix_dense_sliding_window_pattern", "sliding_window_pattern")),
    ("cohere2_moe", {"num_hidden_layers": 9, "sliding_window": 4, "first_k_dense_replace": 2},
     ("first_k_dense_replace",), ("prefix_dense_sliding_window_pattern",
                                  "sliding_window_pattern")),
    ("qwen2", {"num_hidden_layers": 30, "sliding_window": 4, "use_sliding_window": True}, (),
     ("max_window_layers",)),
    ("qwen2_moe", {"num_hidden_layers": 4, "sliding_window": 4, "use_sliding_window": True},
     (), ("max_window_layers",)),
]  # fmt: skip


@pytest.mark.parametrize("model_type, kw, popped, absent", ABSENT_RULES)
def test_layer_types_of_a_minimal_config_use_the_class_defaults(model_type, kw, popped, absent):
    config = _hf(model_type, **kw)
    d = _dict(config, **{k: kw[k] for k in popped})
    for key in absent:
        del d[key]
    depth = kw["num_hidden_layers"]
    assert _posenc_types(d, model_type, depth) == _hf_types(config)
