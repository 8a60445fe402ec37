"""posenc.scaling.from_hf's own rules on plain config dicts: which configs count as
multimodal (each language-model key on its own says "not multimodal"), the exact refusals
(missing or bad max_position_embeddings, partial_rotary_factor, rotary width, a missing key
of each rope type), their boundaries, Proportional's default factor (checked against
transformers' rope init when it is installed) and the table length each scaling reaches.
"""

import re

import pytest
from expect import raises_exactly
from test_from_hf import small

from posenc.scaling import DynamicNTK, Linear, Llama3, LongRoPE, Proportional, YaRN, from_hf

MULTIMODAL = (
    "config is multimodal: its language model's settings are in text_config; "
    "pass config['text_config'] (or config.text_config)"
)


def tiny(rope_scaling, **top):
    """head_dim 32 / 4 = 8 (4 pairs), 3000 positions."""
    return small(rope_scaling, hidden_size=32, **top)


# -- multimodal detection -------------------------------------------------------------------


def test_text_config_without_text_keys_is_refused_with_the_hint():
    gemma3 = {"model_type": "gemma3", "text_config": small(), "vision_config": {}}
    with raises_exactly(MULTIMODAL):
        from_hf(gemma3)
    # keys outside the language model's five do not make it a text config
    other = {**gemma3, "max_position_embeddings": 3000, "num_attention_heads": 4}
    with raises_exactly(MULTIMODAL):
        from_hf(other | {"rotary_emb_base": 10000, "partial_rotary_factor": 0.5})
    assert from_hf(gemma3["text_config"])["head_dim"] == 64


GEMMA = {"model_type": "gemma", "max_position_embeddings": 8192}  # GemmaConfig head_dim 256
NEOX = {"model_type": "gpt_neox", "max_position_embeddings": 2048}  # base 1e4, rotary_pct 1/4
ONE_TEXT_KEY = {  # each holds exactly one of the five keys that mark a language-model config
    "hidden_size": NEOX | {"hidden_size": 256, "num_attention_heads": 4},
    "head_dim": NEOX | {"head_dim": 64},
    "rope_theta": GEMMA | {"rope_theta": 500.0},
    "rope_parameters": GEMMA | {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    "rope_scaling": GEMMA | {"rope_scaling": {"rope_type": "default", "rope_theta": 500.0}},
}
WANT = {  # head_dim, base, rotary_dim, max_len
    "hidden_size": (64, 10000.0, 16, 2048),  # 256 / 4; 0.25 * 64
    "head_dim": (64, 10000.0, 16, 2048),
    "rope_theta": (256, 500.0, None, 8192),
    "rope_parameters": (256, 500.0, None, 8192),
    "rope_scaling": (256, 500.0, None, 8192),
}


@pytest.mark.parametrize("key", list(ONE_TEXT_KEY))
def test_one_text_key_at_the_top_level_is_not_multimodal(key):
    cfg = ONE_TEXT_KEY[key]
    kwargs = from_hf({**cfg, "text_config": small()})  # the text_config is then ignored
    assert kwargs == from_hf(cfg)
    head_dim, base, rotary_dim, max_len = WANT[key]
    want = {"head_dim": head_dim, "base": base, "scaling": None, "rotary_dim": rotary_dim}
    assert kwargs == want | {"max_len": max_len, "pairing": "half"}


# -- max_position_embeddings and partial_rotary_factor --------------------------------------


def test_max_position_embeddings_missing_or_below_1_is_refused():
    cfg = small()
    del cfg["max_position_embeddings"]
    with raises_exactly("config has no max_position_embeddings"):
        from_hf(cfg)
    with raises_exactly("config has no max_position_embeddings"):
        from_hf(small(max_position_embeddings=None))
    with raises_exactly("max_position_embeddings must be >= 1, got 0"):
        from_hf(small(max_position_embeddings=0))
    with raises_exactly("max_position_embeddings must be an integer, got 8.5"):
        from_hf(small(max_position_embeddings=8.5))
    assert from_hf(small(max_position_embeddings=1))["max_len"] == 1  # the smallest accepted
    assert from_hf(small(max_position_embeddings=2))["max_len"] == 2


def test_partial_rotary_factor_must_be_positive():
    with raises_exactly("partial_rotary_factor must be a positive finite number, got 0.0"):
        from_hf(small(partial_rotary_factor=0))
    with raises_exactly("partial_rotary_factor must be a positive finite number, got -0.5"):
        from_hf(small({"rope_type": "default", "partial_rotary_factor": -0.5}))
    with raises_exactly("partial_rotary_factor must be a positive real number, got '0.5'"):
        from_hf(small(partial_rotary_factor="0.5"))


def width_message(fraction, rotary):
    return (
        f"partial_rotary_factor={fraction} gives a rotary width of {rotary} for head_dim=64: "
        "posenc needs an even width in [2, head_dim] (HF rounds an odd width up)"
    )


def test_rotary_width_boundaries():
    # head_dim 64: width int(64 * fraction); 2 is the narrowest accepted, 64 the whole head.
    # StableLM's rotary class reads the factor (Llama's default RoPE ignores it: whole head)
    def partial(fraction):
        return small(partial_rotary_factor=fraction, model_type="stablelm")

    assert from_hf(partial(2 / 64))["rotary_dim"] == 2
    assert from_hf(partial(4 / 64))["rotary_dim"] == 4
    assert from_hf(partial(62 / 64))["rotary_dim"] == 62
    assert from_hf(partial(1.0))["rotary_dim"] is None
    assert from_hf(small(partial_rotary_factor=4 / 64))["rotary_dim"] is None  # Llama's
    for fraction, rotary in [(1 / 64, 1), (0.01, 0), (0.328125, 21), (66 / 64, 66)]:
        with raises_exactly(width_message(float(fraction), rotary)):
            from_hf(partial(fraction))


def test_original_length_is_read_only_by_the_types_that_use_it():
    # default, linear and dynamic ignore original_max_position_embeddings, even a bad one
    for params in (None, {"rope_type": "linear", "factor": 2.0}):
        kwargs = from_hf(small(params, original_max_position_embeddings=0))
        assert kwargs == from_hf(small(params))
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": "x"}
    assert from_hf(small(dynamic))["scaling"] == DynamicNTK(2.0, 3000)
    with raises_exactly("original_max_position_embeddings must be >= 1, got 0"):
        from_hf(small({"rope_type": "yarn", "factor": 2.0}, original_max_position_embeddings=0))


# -- a key each rope type needs ---------------------------------------------------------------


LONG = {"rope_type": "longrope", "short_factor": [1.0, 1.0, 1.5, 2.0]}
MISSING = [  # (rope_scaling, model_type, missing key)
    ({"rope_type": "linear"}, "llama", "factor"),
    ({"rope_type": "dynamic"}, "llama", "factor"),
    ({"type": "dynamic"}, "llama", "factor"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 512}, "llama", "factor"),
    ({"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}, "llama", "factor"),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "llama", "low_freq_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "llama", "high_freq_factor"),
    ({"rope_type": "longrope", "long_factor": [1.0] * 4}, "llama", "short_factor"),
    (LONG, "llama", "long_factor"),
    (LONG | {"long_mscale": 1.2}, "phimoe", "short_mscale"),
    (LONG | {"short_mscale": 1.1}, "phimoe", "long_mscale"),
]


@pytest.mark.parametrize("params, model_type, key", MISSING)
def test_a_missing_key_is_named_with_the_rope_type(params, model_type, key):
    rope_type = params.get("rope_type", params.get("type"))
    message = f"rope_scaling of type {rope_type!r} needs {key!r}, got {params!r}"
    with raises_exactly(message):
        from_hf(tiny(params, model_type=model_type))


def test_the_missing_key_message_reads_literally():
    with raises_exactly("rope_scaling of type 'dynamic' needs 'factor', got {'type': 'dynamic'}"):
        from_hf(small({"type": "dynamic"}))


# -- proportional's default factor ---------------------------------------------------------


def test_proportional_factor_defaults_to_1():
    params = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    kwargs = from_hf(small(params))
    assert kwargs["scaling"] == Proportional(0.25, 1.0) and kwargs["scaling"].factor == 1.0
    assert kwargs == from_hf(small(params | {"factor": 1.0}))
    assert kwargs["rotary_dim"] is None and kwargs["max_len"] == 3000


def test_proportional_without_factor_matches_hf():
    import numpy as np

    import posenc

    pytest.importorskip("transformers")
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    cfg = {k: v for k, v in small().items() if k != "rope_theta"} | {"rope_parameters": params}
    kwargs = from_hf(cfg)
    inv_hf, scale_hf = ROPE_INIT_FUNCTIONS["proportional"](AutoConfig.for_model(**cfg), None)
    kw = {k: v for k, v in kwargs.items() if k not in ("max_len", "pairing")}
    inv, scale = posenc.rope_frequencies(**kw)
    np.testing.assert_allclose(inv, inv_hf.double().numpy(), rtol=1e-6)
    assert inv[0] == 1.0 and scale == scale_hf == 1.0


# -- the context each scaling reaches --------------------------------------------------------


def test_max_len_is_the_context_the_scaling_reaches():
    # linear and dynamic: factor x max_position_embeddings; the others: factor x original
    linear = from_hf(tiny({"rope_type": "linear", "factor": 4.0}))
    assert linear["scaling"] == Linear(4.0) and linear["max_len"] == 12000  # 4 x 3000
    dynamic = from_hf(tiny({"rope_type": "dynamic", "factor": 2.5}))
    assert dynamic["max_len"] == 7500  # 2.5 x 3000
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}
    llama3 |= {"high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    kwargs = from_hf(tiny(llama3))
    assert kwargs["scaling"] == Llama3(8.0, 1.0, 4.0, 512) and kwargs["max_len"] == 4096
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512}
    kwargs = from_hf(tiny(yarn))
    assert isinstance(kwargs["scaling"], YaRN) and kwargs["max_len"] == 4096  # 8 x 512
    longrope = LONG | {"long_factor": [1.0, 2.0, 8.0, 32.0], "factor": 8.0}
    kwargs = from_hf(tiny(longrope, original_max_position_embeddings=512))
    assert isinstance(kwargs["scaling"], LongRoPE) and kwargs["scaling"].factor == 8.0
    assert kwargs["max_len"] == 4096  # 8 x 512 > 3000
    # a reach below max_position_embeddings leaves it
    assert from_hf(tiny(yarn | {"factor": 2.0}))["max_len"] == 3000  # 2 x 512 < 3000
    # a fractional reach is rounded up: 1.5 x 1001 = 1501.5
    kwargs = from_hf(tiny({"rope_type": "linear", "factor": 1.5}, max_position_embeddings=1001))
    assert kwargs["max_len"] == 1502


def test_phimoe_original_length_from_rope_parameters_or_the_maximum():
    import copy

    from test_from_hf import PHI35_MOE

    from posenc.hf import from_hf

    got = from_hf(PHI35_MOE)["scaling"]
    assert got.original_max_len == 4096
    cfg = copy.deepcopy(PHI35_MOE)
    del cfg["rope_scaling"]["original_max_position_embeddings"]  # only at the top level:
    assert from_hf(cfg)["scaling"].original_max_len == 131072  # HF overwrites it: the maximum
    cfg["rope_scaling"]["original_max_position_embeddings"] = 1
    assert from_hf(cfg)["scaling"].original_max_len == 1
    cfg["rope_scaling"]["original_max_position_embeddings"] = 0
    with pytest.raises(ValueError, match="^original_max_position_embeddings must be >= 1, got 0"):
        from_hf(cfg)


def test_unsupported_and_class_length_model_types():
    from posenc.hf import from_hf
    from posenc.hf.defaults import CLASS_MAX_LEN, UNSUPPORTED

    base = {"hidden_size": 32, "num_attention_heads": 4, "rope_theta": 1e4}
    with pytest.raises(ValueError, match="^model_type 'nanochat' is not reproduced: "
                                         + re.escape(UNSUPPORTED["nanochat"])):  # fmt: skip
        from_hf(base | {"model_type": "nanochat"})
    got = from_hf(base | {"model_type": "recurrent_gemma", "partial_rotary_factor": 0.5})
    assert got["max_len"] == CLASS_MAX_LEN["recurrent_gemma"] == 65536
    got = from_hf(base | {"model_type": "recurrent_gemma", "partial_rotary_factor": 0.5,
                          "max_position_embeddings": 100})  # fmt: skip
    assert got["max_len"] == 100


# a Gemma-3-like dict whose RoPE parameters are given per layer type
PER_TYPE = {"model_type": "gemma3_text", "hidden_size": 32, "num_attention_heads": 2,
            "head_dim": 16, "max_position_embeddings": 64,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {t: {"rope_type": "default", "rope_theta": b}
                                for t, b in (("sliding_attention", 1e4),
                                             ("full_attention", 1e6))}}  # fmt: skip


def test_a_layer_type_the_parameters_do_not_have_is_refused():
    from posenc.hf import from_hf

    assert from_hf(PER_TYPE, layer_type="full_attention")["base"] == 1e6
    why = "layer_type must be one of ['sliding_attention', 'full_attention'], got 'conv'"
    with pytest.raises(ValueError, match=re.escape(why)):
        from_hf(PER_TYPE, layer_type="conv")


def test_the_module_reads_the_parameters_of_its_layer_type():
    from posenc.torch import RotaryEmbedding

    assert RotaryEmbedding.from_hf(PER_TYPE, layer_type="full_attention").base == 1e6
    assert RotaryEmbedding.from_hf(PER_TYPE, layer_type="sliding_attention").base == 1e4
