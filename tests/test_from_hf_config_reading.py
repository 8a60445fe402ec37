"""from_hf's config readers: how a config object becomes a dict, and the exact refusals.

Pins down, through ``posenc.scaling.from_hf`` and ``RotaryEmbedding.from_hf``: a transformers
config object is read through its ``to_dict()`` (which carries the class's ``model_type``,
absent from ``vars()``), another object through its attributes; GPT-NeoX's base default is
that of HF's class; and the whole message of each refusal of the flat rope dict, the missing
``rope_theta``, the ``head_dim`` derivation and ``original_max_position_embeddings``, at the
boundaries of the accepted values.
"""

import copy
import types

import pytest
from expect import raises_exactly
from test_from_hf import PHI35_MOE

from posenc.scaling import LongRoPE, from_hf

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402

transformers.logging.set_verbosity_error()


def small(**top):
    """A Llama-style config.json: head_dim 256 // 4 = 64."""
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4}
    return cfg | {"max_position_embeddings": 3000, "rope_theta": 10000.0, **top}


# -- _as_dict ---------------------------------------------------------------------------------


def test_hf_config_object_reads_as_its_to_dict():
    # PhimoeConfig's model_type is a class attribute: in to_dict(), not in vars(); it decides
    # that the mscales apply and that the long factors are the short ones (HF's Phimoe rope)
    hf = AutoConfig.for_model(**copy.deepcopy(PHI35_MOE))
    assert "model_type" not in vars(hf) and hf.to_dict()["model_type"] == "phimoe"
    kwargs = from_hf(hf)
    assert kwargs == from_hf(hf.to_dict()) == from_hf(PHI35_MOE)
    scaling = kwargs["scaling"]
    assert isinstance(scaling, LongRoPE)
    assert scaling.long_factor == scaling.short_factor == (1.0, 1.05, 1.9, 2.8)
    assert (scaling.short_mscale, scaling.long_mscale) == (1.243163121016122, 1.2)


def test_rotary_embedding_from_hf_object_takes_the_class_scale():
    from posenc.torch import RotaryEmbedding

    rot = RotaryEmbedding.from_hf(AutoConfig.for_model(**copy.deepcopy(PHI35_MOE)))
    assert rot.scale == 1.243163121016122  # Phimoe: short_mscale without a length
    assert rot.scaling.short_mscale == 1.243163121016122


def test_any_object_with_to_dict_is_read_through_it():
    class Config:  # an object whose attributes are not the config: only to_dict() says it
        def __init__(self):
            self.junk = 1

        def to_dict(self):
            return small(head_dim=32)

    assert from_hf(Config()) == from_hf(small(head_dim=32))
    assert from_hf(Config())["head_dim"] == 32


def test_plain_object_is_read_through_its_attributes():
    ns = types.SimpleNamespace(**small(head_dim=16))
    assert from_hf(ns) == from_hf(small(head_dim=16))
    assert from_hf(ns)["head_dim"] == 16


def test_an_object_without_head_dim_takes_hidden_size_over_heads_rounded_down():
    # an object passed its class's checks; its modeling code takes hidden // heads (GLM-4-MoE:
    # 4096 // 96 = 42); a dict is read as written and refused for the remainder
    ns = types.SimpleNamespace(**small(hidden_size=4096, num_attention_heads=96))
    assert from_hf(ns)["head_dim"] == 42
    with raises_exactly("hidden_size must be divisible by num_attention_heads=96 when the "
                        "config has no head_dim, got hidden_size=4096"):  # fmt: skip
        from_hf(small(hidden_size=4096, num_attention_heads=96))
    # a class with its own head_dim default keeps it (Qwen3: 128, not 512 // 8 = 64)
    qwen3 = types.SimpleNamespace(**small(model_type="qwen3", hidden_size=512,
                                          num_attention_heads=8))  # fmt: skip
    assert from_hf(qwen3)["head_dim"] == 128
    # no heads, or 0 heads: the dict's refusals, not a division error
    for heads, message in [(None, "config has no head_dim and no num_attention_heads"),
                           (0, "num_attention_heads must be >= 1, got 0")]:  # fmt: skip
        with raises_exactly(message):
            from_hf(types.SimpleNamespace(**small(num_attention_heads=heads)))


def test_object_without_attributes_is_refused():
    with raises_exactly("config must be a dict or a transformers config, got 3"):
        from_hf(3)


# -- _rope_params -----------------------------------------------------------------------------


def test_rope_parameters_that_are_not_a_dict_are_refused():
    with raises_exactly("rope_scaling/rope_parameters must be a dict, got 'linear'"):
        from_hf(small(rope_scaling="linear"))
    with raises_exactly("rope_scaling/rope_parameters must be a dict, got ['default']"):
        from_hf(small(rope_parameters=["default"]))


def test_per_layer_rope_parameters_are_refused_by_label_and_by_nesting():
    # "full_attention" is a layer label (its value need not be a dict), "local" is nested
    cfg = small(layer_types=["full_attention", "sliding_attention"])
    cfg["rope_parameters"] = {"full_attention": None, "local": {"rope_type": "default"}}
    with raises_exactly(
        "rope parameters are given per layer type ['full_attention', 'local']: pass "
        "layer_type= (one of them), or build the whole model's schedule with Schedule.from_hf"
    ):
        from_hf(cfg)
    assert from_hf(cfg, layer_type="local")["base"] == 10_000.0  # that type's set


def test_a_key_is_a_layer_label_only_when_layer_types_names_it():
    cfg = small(rope_parameters={"rope_type": "default", "full_attention": None})
    assert from_hf(cfg)["scaling"] is None  # no layer_types: a stray flat key, ignored


# -- _base ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["gpt_neox", "gpt_neox_japanese"])
def test_gpt_neox_base_default_is_that_of_hf_class(model_type):
    cfg = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 4}
    cfg["max_position_embeddings"] = 2048
    want = AutoConfig.for_model(model_type).rope_parameters["rope_theta"]
    assert want == 10000.0
    assert from_hf(cfg)["base"] == want
    # the classes ignore a top-level rope_theta: only rotary_emb_base sets their base
    top = AutoConfig.for_model(model_type, rope_theta=500.0).rope_parameters["rope_theta"]
    assert from_hf({**cfg, "rope_theta": 500.0})["base"] == top == 10000.0
    assert from_hf({**cfg, "rotary_emb_base": 700.0})["base"] == 700.0


def test_missing_rope_theta_message():
    cfg = small()
    del cfg["rope_theta"]
    with raises_exactly(
        "config has no rope_theta; HF's default depends on the model class (10000 for most, "
        "1e6 for e.g. Mixtral, 5e5 for Llama 4): add rope_theta or pass the transformers "
        "config object"
    ):
        from_hf(cfg)


# -- _head_dim --------------------------------------------------------------------------------


def test_missing_heads_message_without_and_with_text_config():
    cfg = {"hidden_size": 64, "rope_theta": 1.0}
    with raises_exactly("config has no head_dim and no num_attention_heads"):
        from_hf(cfg)
    with raises_exactly("config has no head_dim and no hidden_size"):
        from_hf({"num_attention_heads": 4, "rope_theta": 1.0})
    with raises_exactly(
        "config has no head_dim and no num_attention_heads; a multimodal config holds them "
        "in text_config"
    ):
        from_hf({**cfg, "text_config": {}})


def test_hidden_size_and_heads_must_be_integers():
    with raises_exactly("hidden_size must be an integer, got '256'"):
        from_hf(small(hidden_size="256"))
    with raises_exactly("num_attention_heads must be an integer, got 4.0"):
        from_hf(small(num_attention_heads=4.0))


@pytest.mark.parametrize("value", [0, -4])
def test_hidden_size_below_one_is_refused(value):
    with raises_exactly(f"hidden_size must be >= 1, got {value}"):
        from_hf(small(hidden_size=value))


@pytest.mark.parametrize("value", [0, -4])
def test_num_attention_heads_below_one_is_refused(value):
    with raises_exactly(f"num_attention_heads must be >= 1, got {value}"):
        from_hf(small(num_attention_heads=value))


def test_hidden_size_one_passes_its_check():
    # accepted as hidden_size (minimum 1); head_dim 1 is then refused for its rotary width
    with raises_exactly(
        "partial_rotary_factor=1.0 gives a rotary width of 1 for head_dim=1: posenc needs an "
        "even width in [2, head_dim] (HF rounds an odd width up)"
    ):
        from_hf(small(hidden_size=1, num_attention_heads=1))


def test_one_attention_head_is_the_whole_hidden_size():
    cfg = small(hidden_size=64, num_attention_heads=1)
    assert from_hf(cfg)["head_dim"] == 64 == AutoConfig.for_model(**cfg).head_dim


# -- _original --------------------------------------------------------------------------------

YARN = {"rope_type": "yarn", "factor": 8.0}


def test_original_length_below_one_is_refused():
    with raises_exactly("original_max_position_embeddings must be >= 1, got 0"):
        from_hf(small(rope_scaling={**YARN, "original_max_position_embeddings": 0}))


def test_original_length_one_is_accepted():
    kwargs = from_hf(small(rope_scaling={**YARN, "original_max_position_embeddings": 1}))
    assert kwargs["scaling"].original_max_len == 1
    assert kwargs["max_len"] == 3000  # max(3000, ceil(8 * 1))
