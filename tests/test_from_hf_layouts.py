"""One reading of a config in either layout, the one transformers' config classes make.

For every model type whose transformers 5.23.0 config class overrides
``convert_rope_params_to_dict`` (and so reads a 4.x ``config.json``'s flat keys its own way),
a tiny config is built twice: from the class defaults (the v5 layout, as an object and as its
``to_dict()``) and from a v4 flat dict written from it (``rope_theta``, ``rope_scaling``,
``rope_local_base_freq``, ...). posenc's per-layer RoPE must give the inverse frequencies and
attention factor of HF's own rotary embedding class, for that layer's type, built from the
config object HF derives from the same dict; or posenc refuses the dict by name.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import numpy as np
import pytest

import posenc
from posenc.hf import from_hf, schedule_from_hf
from posenc.hf.convert import NEEDS_V5, NESTED_ONLY, PER_TYPE

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
from transformers import CONFIG_MAPPING  # noqa: E402

TINY = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "intermediate_size": 64, "max_position_embeddings": 256, "vocab_size": 64}  # fmt: skip
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LONG = {"short_factor": [1.0] * 16, "long_factor": [1.0 + i / 4 for i in range(16)]}
# model type -> (the modeling module, its rotary class, extra tiny settings, the v4 flat keys)
CASES = {
    "gemma3_text": ("gemma3", "Gemma3RotaryEmbedding", {"num_hidden_layers": 6},
                    {"rope_theta": 1e6, "rope_local_base_freq": 1e4,
                     "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    "gemma3n_text": ("gemma3n", "Gemma3nRotaryEmbedding", {"num_hidden_layers": 5},
                     {"rope_theta": 1e6, "rope_local_base_freq": 1e4}),
    "t5gemma2_text": ("t5gemma2", "T5Gemma2RotaryEmbedding", {"num_hidden_layers": 6},
                      {"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "t5gemma2_decoder": ("t5gemma2", "T5Gemma2RotaryEmbedding", {"num_hidden_layers": 6},
                         {"rope_theta": 1e6, "rope_local_base_freq": 123.0}),
    # OLMo 3 with a flat YaRN: the full-attention layers only; the sliding ones keep 5e5
    "olmo3": ("olmo3", "Olmo3RotaryEmbedding", {"num_hidden_layers": 4, "sliding_window": 16},
              {"rope_theta": 123.0, "rope_scaling": dict(YARN)}),
    "modernbert": ("modernbert", "ModernBertRotaryEmbedding", {"num_hidden_layers": 3},
                   {"global_rope_theta": 2e5,
                    "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "modernbert-decoder": ("modernbert_decoder", "ModernBertDecoderRotaryEmbedding",
                           {"num_hidden_layers": 3}, {"local_rope_theta": 500.0}),
    "gpt_neox": ("gpt_neox", "GPTNeoXRotaryEmbedding", {"num_hidden_layers": 2},
                 {"rotary_emb_base": 5e3, "rotary_pct": 0.5,
                  "rope_scaling": {"type": "linear", "factor": 2.0}}),
    "gpt_neox_japanese": ("gpt_neox_japanese", "GPTNeoXJapaneseRotaryEmbedding",
                          {"num_hidden_layers": 2}, {"rotary_emb_base": 5e3}),
    "phi3": ("phi3", "Phi3RotaryEmbedding", {"num_hidden_layers": 2},
             {"rope_theta": 5e3, "original_max_position_embeddings": 64,
              "rope_scaling": {"type": "yarn", **LONG}}),
    "phi4_multimodal": ("phi4_multimodal", "Phi4MultimodalRotaryEmbedding",
                        {"num_hidden_layers": 2},
                        {"rope_theta": 5e3, "original_max_position_embeddings": 64,
                         "rope_scaling": {"type": "yarn", **LONG}}),
    "minimax_m2": ("minimax_m2", "MiniMaxM2RotaryEmbedding", {"num_hidden_layers": 2},
                   {"rope_theta": 5e6, "rotary_dim": 16}),
    "hunyuan_vl_text": ("hunyuan_vl", "HunYuanVLRotaryEmbedding", {"num_hidden_layers": 2},
                        {"rope_theta": 5e3, "rope_scaling": {"type": "xdrope", "factor": 2.0}}),
}  # fmt: skip
PAIRING = {"hunyuan_vl_text": "half"}  # a model type outside posenc's pairing tables


def _class(model_type):
    return CONFIG_MAPPING[model_type]


def _build(model_type, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _class(model_type)(**copy.deepcopy(kw))


def _v4(hf, flat):
    """The object's dict with its rope_parameters written back as the given flat keys."""
    out = {k: v for k, v in hf.to_dict().items() if k != "rope_parameters"}
    return out | copy.deepcopy(flat)


def _hf_rates(module, rotary, hf, layer_type):
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    rot = getattr(mod, rotary)(hf)
    inv = getattr(rot, f"{layer_type}_inv_freq", None)
    if inv is None:
        return rot.inv_freq.double().numpy(), rot.attention_scaling
    return inv.double().numpy(), getattr(rot, f"{layer_type}_attention_scaling")


def _posenc_rates(kw):
    return posenc.rope_frequencies(kw["head_dim"], base=kw["base"], scaling=kw["scaling"],
                                   rotary_dim=kw["rotary_dim"])  # fmt: skip


def _per_layer(model_type, config, hf):
    """posenc's RoPE of each layer: the schedule's, else (a schedule refused for another
    reason, a model type without a pairing posenc knows) from_hf of that layer's type."""
    types = getattr(hf, "layer_types", None) or [None] * hf.num_hidden_layers
    try:
        return [layer["rope"] for layer in schedule_from_hf(config)["layers"]], types
    except ValueError:
        pairing = PAIRING.get(model_type)
        return [from_hf(config, layer_type=t, pairing=pairing) for t in types], types


def _assert_matches(model_type, config, hf):
    module, rotary = CASES[model_type][:2]
    ropes, types = _per_layer(model_type, config, hf)
    for i, (rope, kind) in enumerate(zip(ropes, types, strict=True)):
        want = hf.rope_parameters[kind] if kind in hf.rope_parameters else hf.rope_parameters
        assert rope["base"] == want["rope_theta"], (i, kind)
        inv, scale = _posenc_rates(rope)
        hf_inv, hf_scale = _hf_rates(module, rotary, hf, kind)
        np.testing.assert_allclose(inv, hf_inv, rtol=1e-6, err_msg=f"layer {i} ({kind})")
        assert scale == pytest.approx(hf_scale, rel=1e-6), (i, kind)


@pytest.mark.parametrize("model_type", list(CASES))
def test_both_layouts_give_the_rates_of_hf_s_rotary_class(model_type):
    _, _, extra, flat = CASES[model_type]
    hf = _build(model_type, TINY | extra)
    _assert_matches(model_type, hf, hf)  # v5: the class defaults, as an object
    _assert_matches(model_type, hf.to_dict(), hf)  # ... and as its config.json
    v4 = _v4(hf, flat)
    hf4 = _build(model_type, v4)
    _assert_matches(model_type, v4, hf4)  # v4: the flat keys, as the class converts them
    if model_type in PER_TYPE:  # v5 with one flat set, where the class expects one per type
        one = hf4.rope_parameters["full_attention"]
        v5 = {k: v for k, v in v4.items() if k != "rope_scaling"} | {"rope_parameters": one}
        if model_type in NESTED_ONLY:  # its class refuses it, and so does posenc
            with pytest.raises(Exception, match="rope_parameters"):
                _build(model_type, v5)
            with pytest.raises(ValueError, match="rope_parameters must be given per layer type"):
                from_hf(v5, layer_type="full_attention")
            return
        _assert_matches(model_type, v5, _build(model_type, v5))  # the flat keys are ignored


def test_gemma3_v4_sliding_layers_keep_the_local_base_without_scaling():
    _, _, extra, flat = CASES["gemma3_text"]
    v4 = _v4(_build("gemma3_text", TINY | extra), flat)
    layers = schedule_from_hf(v4)["layers"]
    assert [(r["rope"]["base"], type(r["rope"]["scaling"]).__name__) for r in layers] == [
        (1e4, "NoneType")] * 5 + [(1e6, "Linear")]  # fmt: skip
    from posenc.torch import RotaryEmbedding

    rot = RotaryEmbedding.from_hf(v4, layer_type="sliding_attention")
    assert (rot.base, rot.scaling) == (1e4, None)
    with pytest.raises(ValueError, match="rope parameters are given per layer type"):
        from_hf(v4)  # one RoPE for a model with two is refused, not the full layers' one
    _, _, extra, flat = CASES["gemma3n_text"]  # Gemma 3n: the sliding layers' base is 1e4
    v4 = _v4(_build("gemma3n_text", TINY | extra), flat | {"rope_theta": 5e5})
    layers = schedule_from_hf(v4)["layers"]
    assert [r["rope"]["base"] for r in layers] == [1e4] * 4 + [5e5]


def test_olmo3_flat_yarn_lands_on_full_attention_layers_only():
    _, _, extra, flat = CASES["olmo3"]
    v4 = _v4(_build("olmo3", TINY | extra), flat)
    layers = schedule_from_hf(v4)["layers"]
    assert [type(r["rope"]["scaling"]).__name__ for r in layers] == ["NoneType"] * 3 + ["YaRN"]
    # the class pops rope_theta once, for the full layers: the sliding ones keep the default
    assert [r["rope"]["base"] for r in layers] == [5e5] * 3 + [123.0]


@pytest.mark.parametrize("model_type", sorted(NEEDS_V5))
def test_classes_that_ignore_the_flat_layout_are_read_from_rope_parameters(model_type):
    hf = _build(model_type, TINY | {"num_hidden_layers": 6, "num_key_value_heads": 2})
    flat = {"rope_theta": 123.0}
    v4 = {k: v for k, v in hf.to_dict().items() if k != "rope_parameters"} | flat
    hf4 = _build(model_type, v4)
    bases = [p["rope_theta"] for p in hf4.rope_parameters.values() if p] or [None]
    ignored = "ignores the flat keys" in NEEDS_V5[model_type]
    assert (123.0 not in bases) == ignored  # HF ignores the flat key, or derives its own
    why = f"config has no rope_parameters, and for model_type='{model_type}' its config class"
    with pytest.raises(ValueError, match=why):
        from_hf(v4, layer_type=hf.layer_types[0], pairing="half")


def test_the_conversion_tables_name_the_overriding_classes():
    """Every class that overrides convert_rope_params_to_dict is converted, refused, or read
    by the base rule on purpose (the M-RoPE ones: posenc.hf.mrope)."""
    base = transformers.modeling_rope_utils.RotaryEmbeddingConfigMixin.convert_rope_params_to_dict
    overriding = {
        t for t, cls in CONFIG_MAPPING.items()
        if getattr(cls, "convert_rope_params_to_dict", base) is not base
    }  # fmt: skip
    handled = set(PER_TYPE) | set(NEEDS_V5) | set(CASES) | {"qwen2_vl_text", "qwen2_5_vl_text"}
    assert overriding <= handled, sorted(overriding - handled)


def test_rope_conversion_refusals_name_the_key():
    from posenc.hf.convert import rope_parameters

    with pytest.raises(ValueError, match="rope_scaling/rope_parameters must be a dict, got 3"):
        rope_parameters({"rope_scaling": 3})
    gemma = {"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    with pytest.raises(
        ValueError,
        match=r"gemma3_text's config class merges rope_scaling into "
        r"rope_parameters\['full_attention'\], which is None",
    ):
        rope_parameters(gemma | {"rope_parameters": {"full_attention": None}})
    with pytest.raises(ValueError, match=r"rope_parameters\['full_attention'\], which is None"):
        rope_parameters(gemma | {"rope_parameters": {}})  # HF: a KeyError
    given = {"sliding_attention": {"rope_type": "default", "rope_theta": 5.0},
             "full_attention": {"rope_type": "default"}}  # fmt: skip
    out = rope_parameters(gemma | {"rope_parameters": given, "max_position_embeddings": 64})
    assert out == {
        "sliding_attention": {"rope_type": "default", "rope_theta": 5.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
    }
    assert given["full_attention"] == {"rope_type": "default"}  # the input is not modified
    yarn = {"model_type": "olmo3", "max_position_embeddings": 64,
            "rope_scaling": {"type": "yarn", "factor": 2.0}}  # fmt: skip
    # Olmo3Config merges it into {"rope_type": "default"}: the legacy "type" does not count
    assert rope_parameters(yarn)["full_attention"] == {
        "rope_type": "default", "type": "yarn", "factor": 2.0, "rope_theta": 5e5}  # fmt: skip
    yarn["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0}
    assert rope_parameters(yarn)["full_attention"] == {
        "rope_type": "yarn", "factor": 2.0, "rope_theta": 5e5,
        "original_max_position_embeddings": 64}  # fmt: skip


# per-layer-type dicts as found in config.json files: v5 sets missing keys the class fills
# (rope_type, or only a legacy "type"; rope_theta), v4 flat keys, or none
SHAPES = {
    "v5 legacy type": {"rope_parameters": {
        "full_attention": {"type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_theta": 1e4}}},
    "v5 no base": {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                       "sliding_attention": {"type": "default"}}},
    "v4 flat": {"rope_theta": 3e5, "rope_local_base_freq": 77.0, "global_rope_theta": 9e4,
                "local_rope_theta": 55.0, "rope_scaling": {"type": "yarn", "factor": 2.0}},
    "v4 base only": {"rope_theta": 3e5},
    "nothing": {},
}  # fmt: skip


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("model_type", sorted(PER_TYPE))
def test_per_type_conversion_is_the_config_class_s_rope_parameters(model_type, shape):
    from posenc.hf.convert import rope_parameters

    cfg = TINY | {"num_hidden_layers": 6} | copy.deepcopy(SHAPES[shape])
    hf = _build(model_type, cfg)
    assert rope_parameters(cfg | {"model_type": model_type}) == hf.rope_parameters


def test_per_type_conversion_names_the_bad_value_and_shares_nothing_with_its_input():
    from posenc.hf.convert import rope_parameters

    gemma = {"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    with pytest.raises(ValueError, match=r"rope_parameters\['full_attention'\], which is 3"):
        rope_parameters(gemma | {"rope_parameters": {"full_attention": 3}})
    with pytest.raises(ValueError, match=r"for model_type='laguna' its config class ignores the "
                       r"flat keys .*: give rope_parameters per layer type, or pass the "
                       r"transformers config object$"):  # fmt: skip
        rope_parameters({"model_type": "laguna", "rope_theta": 1e4})
    phi3 = TINY | {"model_type": "phi3", "rope_scaling": {"type": "yarn", **copy.deepcopy(LONG)}}
    rope_parameters(phi3)["short_factor"].append(0.0)  # the base rule's copy, likewise
    assert phi3["rope_scaling"]["short_factor"] == LONG["short_factor"]
    long = {"rope_type": "longrope", "rope_theta": 1e4, **copy.deepcopy(LONG)}
    given = {"full_attention": long, "sliding_attention": {"rope_type": "default"}}
    out = rope_parameters({"model_type": "gemma3_text", "rope_parameters": given})
    out["full_attention"]["short_factor"].append(0.0)  # a caller editing its result
    assert given["full_attention"]["short_factor"] == LONG["short_factor"]


@pytest.mark.parametrize("key", ["type", "rope_type"])
@pytest.mark.parametrize("model_type, name", [("phi3", "yarn"), ("phi4_multimodal", "yarn"),
                                              ("hunyuan_vl_text", "xdrope")])  # fmt: skip
def test_renamed_rope_types_are_the_config_class_s_rope_parameters(model_type, name, key):
    from posenc.hf.convert import rope_parameters

    cfg = TINY | {"num_hidden_layers": 2, "rope_theta": 5e3, "original_max_position_embeddings": 64,
                  "rope_scaling": {key: name, "factor": 2.0, **copy.deepcopy(LONG)}}  # fmt: skip
    hf = _build(model_type, cfg)
    assert hf.rope_parameters["rope_type"] != name  # the class renames it
    out = rope_parameters(cfg | {"model_type": model_type})  # rope_theta etc. read elsewhere
    out.pop("type", None)  # the legacy key, read only where rope_type is missing
    assert out == {k: hf.rope_parameters[k] for k in out}
