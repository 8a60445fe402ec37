"""``schedule_from_hf`` on config.json dicts, rule by rule, with the values transformers
5.23.0's modeling code uses (the rules are quoted in posenc.hf.schedule; the meta-device
tests in test_schedule_from_hf.py check whole models against HF's attention layers)."""

from __future__ import annotations

import math

import pytest

from posenc.hf import schedule_from_hf


def _cfg(model_type="llama", depth=2, **kw):
    base = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": depth, "max_position_embeddings": 128,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0}}  # fmt: skip
    return base | kw


def _field(schedule, key):
    return [layer[key] for layer in schedule["layers"]]


def test_a_plain_config_every_layer_full_with_rope():
    s = schedule_from_hf(_cfg(depth=3))
    assert s["model_type"] == "llama" and s["head_dim"] == 16
    assert [r["base"] for r in _field(s, "rope")] == [10_000.0] * 3
    assert _field(s, "window") == _field(s, "chunk") == _field(s, "temperature") == [None] * 3
    assert _field(s, "slice_start") == _field(s, "softmax_factor") == [None] * 3


def test_a_multimodal_config_reads_its_text_config():
    text = _cfg(depth=3, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    s = schedule_from_hf({"model_type": "llava", "text_config": text})
    assert len(s["layers"]) == 3 and s["layers"][0]["rope"]["base"] == 500.0
    # a config with its own layers is read itself, text_config or not
    s = schedule_from_hf(_cfg(depth=2, text_config=text))
    assert len(s["layers"]) == 2 and s["layers"][0]["rope"]["base"] == 10_000.0


def test_a_config_object_with_a_text_config_attribute():
    class Obj:
        def __init__(self, **kw):
            self.__dict__.update(kw)

        def to_dict(self):
            return {k: v.to_dict() if isinstance(v, Obj) else v for k, v in vars(self).items()}

    s = schedule_from_hf(Obj(model_type="llava", text_config=Obj(**_cfg(depth=4))))
    assert len(s["layers"]) == 4

    class Aliased(Obj):  # a setting answered by attribute only, as transformers' aliases
        num_hidden_layers = property(lambda self: self.n_layer)

        def to_dict(self):
            return {k: v for k, v in super().to_dict().items() if k != "n_layer"}

    text = Aliased(**{k: v for k, v in _cfg().items() if k != "num_hidden_layers"}, n_layer=3)
    assert len(schedule_from_hf(Obj(model_type="llava", text_config=text))["layers"]) == 3


@pytest.mark.parametrize("depth", [0, -1, True, 2.0, None])
def test_the_depth_must_be_a_positive_int(depth):
    with pytest.raises(ValueError, match=f"num_hidden_layers >= 1, got {depth!r}"):
        schedule_from_hf(_cfg(depth=depth))


def test_one_layer_is_a_model():
    assert len(schedule_from_hf(_cfg(depth=1))["layers"]) == 1


def test_layer_types_give_windows_and_their_length_is_checked():
    types = ["sliding_attention", "full_attention", "local_sliding"]
    # MinistralModel's mask follows layer_types (a LlamaModel's applies no window at all)
    s = schedule_from_hf(_cfg("ministral", depth=3, sliding_window=8, layer_types=types))
    assert _field(s, "window") == [8, None, 8]
    with pytest.raises(ValueError, match="layer_types must have num_hidden_layers=2 entries, "
                                         "got 3"):  # fmt: skip
        schedule_from_hf(_cfg("ministral", depth=2, sliding_window=8, layer_types=types))
    s = schedule_from_hf(_cfg(depth=2, layer_types=["sliding_attention"] * 2))  # no window set
    assert _field(s, "window") == [None, None]


def test_qwen2s_rule_slides_from_max_window_layers_on():
    qwen = _cfg("qwen2", depth=4, sliding_window=8, use_sliding_window=True)
    assert _field(schedule_from_hf(qwen | {"max_window_layers": 1}), "window") == [None, 8, 8, 8]
    assert _field(schedule_from_hf(qwen), "window") == [None] * 4  # default: from depth on
    off = qwen | {"use_sliding_window": False, "max_window_layers": 1}
    assert _field(schedule_from_hf(off), "window") == [None] * 4


def test_mistrals_every_layer_slides_and_unknown_rules_are_refused():
    assert _field(schedule_from_hf(_cfg("mistral", sliding_window=5)), "window") == [5, 5]
    with pytest.raises(ValueError, match="sliding_window but no layer_types, and which layers "
                                         "of 'olmo3' slide"):  # fmt: skip
        schedule_from_hf(_cfg("olmo3", sliding_window=5))
    # LlamaModel never reads sliding_window (tests/test_window_readers.py): no rule to refuse
    assert _field(schedule_from_hf(_cfg(sliding_window=5)), "window") == [None, None]


def test_llama4_class_defaults_nope_every_fourth_layer_chunks_and_temperature():
    s = schedule_from_hf(_cfg("llama4_text", depth=8))
    nope = [i for i, r in enumerate(_field(s, "rope")) if r is None]
    assert nope == [3, 7]  # no_rope_layer_interval 4: layers 4 and 8 (1-based)
    assert _field(s, "chunk") == [None if i in nope else 8192 for i in range(8)]
    temperature = {"scale": 0.1, "floor": 8192.0, "shift": 1}
    assert _field(s, "temperature") == [temperature if i in nope else None for i in range(8)]
    s = schedule_from_hf(_cfg("llama4_text", depth=4, no_rope_layer_interval=2,
                              attention_chunk_size=16, attn_scale=0.5, floor_scale=4))  # fmt: skip
    assert [r is None for r in _field(s, "rope")] == [False, True, False, True]
    assert _field(s, "chunk") == [16, None, 16, None]
    assert _field(s, "temperature")[1] == {"scale": 0.5, "floor": 4.0, "shift": 1}
    off = schedule_from_hf(_cfg("llama4_text", depth=4, attn_temperature_tuning=False))
    assert _field(off, "temperature") == [None] * 4


def test_llama4_given_layers_and_smollm3():
    s = schedule_from_hf(_cfg("llama4_text", depth=3, no_rope_layers=[0, 1, 1]))
    assert [r is None for r in _field(s, "rope")] == [True, False, False]
    with pytest.raises(ValueError, match="no_rope_layers must have num_hidden_layers=3 entries, "
                                         "got 2"):  # fmt: skip
        schedule_from_hf(_cfg("llama4_text", depth=3, no_rope_layers=[0, 1]))
    s = schedule_from_hf(_cfg("smollm3", depth=4))  # NoPE layers, no chunks, no temperature
    assert [r is None for r in _field(s, "rope")] == [False, False, False, True]
    assert _field(s, "chunk") == _field(s, "temperature") == [None] * 4


def test_rope_only_on_sliding_layers_of_cohere2():
    types = ["sliding_attention", "full_attention"]
    s = schedule_from_hf(_cfg("cohere2", sliding_window=4, layer_types=types))
    assert [r is None for r in _field(s, "rope")] == [False, True]
    s = schedule_from_hf(_cfg("ministral", sliding_window=4, layer_types=types))
    assert [r is None for r in _field(s, "rope")] == [False, False]


def test_ministral3_temperature_from_llama_4_scaling_beta():
    params = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "beta_fast": 32.0,
              "beta_slow": 1.0, "original_max_position_embeddings": 32,
              "llama_4_scaling_beta": 0.1}  # fmt: skip
    s = schedule_from_hf(_cfg("ministral3", rope_parameters=params))
    assert _field(s, "temperature") == [{"scale": 0.1, "floor": 32.0, "shift": 0}] * 2
    assert _field(schedule_from_hf(_cfg("llama", rope_parameters=params)), "temperature") == [
        None,
        None,
    ]
    no_floor = {"rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.1}
    with pytest.raises(ValueError, match="ministral3's llama_4_scaling_beta needs "
                                         "rope_parameters' original_max_position_embeddings, "
                                         "got none"):  # fmt: skip
        schedule_from_hf(_cfg("ministral3", rope_parameters=no_floor))


def _mla(**params):
    rope = {"rope_type": "default", "rope_theta": 1e4} | params
    return _cfg("deepseek_v3", head_dim=8, qk_nope_head_dim=16, qk_rope_head_dim=8,
                rope_parameters=rope)  # fmt: skip


def test_latent_attention_rotates_a_slice_with_yarns_softmax_factor():
    s = schedule_from_hf(_mla())
    assert s["head_dim"] == 24  # nope 16 + rope 8
    assert _field(s, "slice_start") == [16, 16]
    assert [(r["head_dim"], r["rotary_dim"]) for r in _field(s, "rope")] == [(8, None)] * 2
    assert _field(s, "softmax_factor") == [None, None]  # default RoPE: no mscale
    yarn = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 32,
            "mscale": 1.0, "mscale_all_dim": 0.707}  # fmt: skip
    want = (0.1 * 0.707 * math.log(40.0) + 1.0) ** 2  # DeepSeek-V3's softmax_scale factor
    assert _field(schedule_from_hf(_mla(**yarn)), "softmax_factor") == [pytest.approx(want)] * 2
    legacy = {k: v for k, v in yarn.items() if k != "rope_type"} | {"type": "yarn"}
    s = schedule_from_hf(_mla(**legacy) | {"rope_parameters": {"rope_theta": 1e4, **legacy}})
    assert _field(s, "softmax_factor") == [pytest.approx(want)] * 2
    no_all_dim = {k: v for k, v in yarn.items() if k != "mscale_all_dim"}
    assert _field(schedule_from_hf(_mla(**no_all_dim)), "softmax_factor") == [None, None]


def test_latent_attention_of_another_width_is_refused():
    with pytest.raises(ValueError, match="deepseek_v3: the rotary width 16 is not "
                                         "qk_rope_head_dim=4, posenc cannot place it"):  # fmt: skip
        schedule_from_hf(_mla() | {"head_dim": 16, "qk_rope_head_dim": 4})


def test_half_a_latent_config_is_not_latent_attention():
    s = schedule_from_hf(_cfg(qk_nope_head_dim=16))
    assert s["head_dim"] == 16 and _field(s, "slice_start") == [None, None]


def test_softmax_factors_of_gemma_and_granite():
    s = schedule_from_hf(_cfg("gemma3n_text", head_dim=32))
    assert _field(s, "softmax_factor") == [math.sqrt(32)] * 2  # scale 1: q and k norms
    s = schedule_from_hf(_cfg("gemma2", head_dim=32, query_pre_attn_scalar=128))
    assert _field(s, "softmax_factor") == [math.sqrt(32 / 128)] * 2
    s = schedule_from_hf(_cfg("gemma2", head_dim=32, query_pre_attn_scalar=32))
    assert _field(s, "softmax_factor") == [None, None]  # a factor of 1
    s = schedule_from_hf(_cfg("granite", attention_multiplier=0.015625))
    assert _field(s, "softmax_factor") == [0.015625 * math.sqrt(16)] * 2  # head_dim 16
    s = schedule_from_hf(_cfg("llama", attention_multiplier=0.015625))
    assert _field(s, "softmax_factor") == [None, None]


def test_mrope_models_get_mrope_settings():
    params = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
    s = schedule_from_hf(_cfg("qwen2_vl", rope_parameters=params))
    rope = s["layers"][0]["rope"]
    assert rope["mrope"] is True and tuple(rope["sections"]) == (2, 3, 3)


def test_per_type_rope_parameters():
    types = ["sliding_attention", "full_attention", "conv"]
    params = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
              "full_attention": {"rope_type": "default", "rope_theta": 1e6, "head_dim": 32},
              "conv": None}  # fmt: skip
    s = schedule_from_hf(_cfg("gemma3_text", depth=3, head_dim=16, sliding_window=4,
                              layer_types=types, rope_parameters=params))  # fmt: skip
    assert [r and r["base"] for r in _field(s, "rope")] == [1e4, 1e6, None]
    assert s["head_dim"] == 16  # two rotary widths: the config's head_dim
    missing = {k: v for k, v in params.items() if k != "full_attention"}
    why = (
        "rope_parameters has no entry for the attention layer type 'full_attention'.*"
        ": give it, or pass the transformers config object"
    )
    with pytest.raises(ValueError, match=why):
        schedule_from_hf(_cfg("ministral", depth=3, head_dim=16, sliding_window=4,
                              layer_types=types, rope_parameters=missing))  # fmt: skip
    # Gemma3TextConfig fills the missing entry in: the default RoPE, the class's global base
    s = schedule_from_hf(_cfg("gemma3_text", depth=3, head_dim=16, sliding_window=4,
                              layer_types=types, rope_parameters=missing))  # fmt: skip
    assert [r and (r["base"], r["scaling"]) for r in _field(s, "rope")][:2] == [
        (1e4, None), (1e6, None)]  # fmt: skip


def test_schedule_modules_share_equal_settings_and_wrap_in_order():
    from posenc.torch import MRoPE, NoPE, RotaryEmbedding, Schedule, SoftmaxFactor

    types = ["sliding_attention", "full_attention", "sliding_attention"]
    s = Schedule.from_hf(_cfg("ministral", depth=3, sliding_window=4, layer_types=types))
    assert s[0].encoding is s[1].encoding is s[2].encoding  # only windows differ
    assert isinstance(s[0].encoding, RotaryEmbedding)
    assert [s[i].window for i in range(3)] == [4, None, 4]
    # Cohere 2's full layers: no RoPE, but the softmax factor all layers have
    cohere = _cfg("cohere2", depth=3, head_dim=16, sliding_window=4, layer_types=types)
    s = Schedule.from_hf(cohere | {"query_pre_attn_scalar": 64})
    full = s.encoding_of(1)
    assert isinstance(full, SoftmaxFactor) and isinstance(full.inner, NoPE)
    assert full.softmax_scale(16) == pytest.approx(1 / math.sqrt(64))
    assert s.encoding_of(0) is not full and isinstance(s.encoding_of(0).inner, RotaryEmbedding)
    params = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
    s = Schedule.from_hf(_cfg("qwen2_vl", rope_parameters=params))
    assert isinstance(s.encoding_of(0), MRoPE) and s.head_dim == 16
    assert Schedule.from_hf(_mla()).head_dim == 24


def test_the_scaling_package_resolves_from_hf_lazily():
    import posenc.hf
    import posenc.scaling

    assert posenc.scaling.from_hf is posenc.hf.from_hf
    with pytest.raises(AttributeError, match="module 'posenc.scaling' has no attribute 'nope'"):
        posenc.scaling.nope  # noqa: B018


def test_query_temperature_reference_values_and_refusals():
    from posenc import query_temperature

    # tau(p) = 1 + s ln(1 + floor((p + c) / f)), Llama 4's attn_scale and floor_scale
    got = query_temperature([0, 8191, 8192, 3 * 8192], scale=0.1, floor=8192)  # c = 0
    want = [1.0, 1.0, 1.0 + 0.1 * math.log(2), 1.0 + 0.1 * math.log(4)]
    assert got.tolist() == pytest.approx(want, rel=1e-15)
    shifted = query_temperature([8191], scale=0.1, floor=8192, shift=1)  # Llama 4: c = 1
    assert shifted.tolist() == pytest.approx([1.0 + 0.1 * math.log(2)], rel=1e-15)
    for scale in (True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"scale must be a finite number, got {scale!r}"):
            query_temperature(4, scale=scale, floor=2)
    with pytest.raises(ValueError, match="^floor"):
        query_temperature(4, scale=0.1, floor=0)
    for shift in (True, 1.0, -1):
        with pytest.raises(ValueError, match=f"shift must be an int >= 0, got {shift!r}"):
            query_temperature(4, scale=0.1, floor=2, shift=shift)


def test_latent_attention_reads_a_partial_rotary_width():
    # the rotated width is rotary_dim where the RoPE is partial
    s = schedule_from_hf(_mla() | {"head_dim": 16, "partial_rotary_factor": 0.5})
    assert [(r["head_dim"], r["rotary_dim"]) for r in _field(s, "rope")] == [(8, None)] * 2
    with pytest.raises(ValueError, match="the rotary width 8 is not qk_rope_head_dim=4"):
        schedule_from_hf(_mla() | {"head_dim": 16, "partial_rotary_factor": 0.5,
                                   "qk_rope_head_dim": 4})  # fmt: skip


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 1e4},
        {"type": "default", "rope_theta": 1e4},
        {"rope_theta": 1e4},
    ],
)
def test_latent_attention_without_yarn_has_no_softmax_factor(params):
    # mscale_all_dim only counts for a scaled RoPE (DeepSeek's yarn)
    cfg = _mla() | {"rope_parameters": params | {"factor": 4.0, "mscale_all_dim": 1.0}}
    assert _field(schedule_from_hf(cfg), "softmax_factor") == [None, None]


def test_per_type_widths_and_the_factor_of_each_layer():
    from types import SimpleNamespace

    class Gemma4Like:  # a config object with Gemma 4's per_layer_config views
        def __init__(self, widths, **kw):
            self.__dict__.update(kw)
            self.per_layer_config = {t: SimpleNamespace(head_dim=w) for t, w in widths.items()}

    types = ["sliding_attention", "full_attention"]
    per = {t: {"rope_type": "default", "rope_theta": 1e4} for t in types}
    cfg = _cfg("gemma3n_text", head_dim=16, sliding_window=4, layer_types=types,
               rope_parameters=per)  # fmt: skip
    s = schedule_from_hf(Gemma4Like({"sliding_attention": 32, "full_attention": 48}, **cfg))
    assert [r["head_dim"] for r in _field(s, "rope")] == [32, 48]
    assert s["head_dim"] == 16  # two widths: the config's own
    assert _field(s, "softmax_factor") == [math.sqrt(32), math.sqrt(48)]  # each layer's width
    s = schedule_from_hf(Gemma4Like({"sliding_attention": 32, "full_attention": 32}, **cfg))
    assert s["head_dim"] == 32  # one width


def test_per_type_parameters_without_layer_types():
    per = {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}
    s = schedule_from_hf(_cfg(rope_parameters=per))
    assert [r["base"] for r in _field(s, "rope")] == [1e6, 1e6]
    none = _cfg(layer_types=["full_attention"] * 2, rope_parameters={"full_attention": None})
    assert _field(schedule_from_hf(none), "rope") == [None, None]
    # The types a class rule derives carry transformers' names, so per-type parameters
    # keyed by them are found: Qwen2's rule and Llama 4's default chunked/full layers.
    both = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}  # fmt: skip
    qwen = _cfg("qwen2", depth=3, sliding_window=8, use_sliding_window=True,
                max_window_layers=1, rope_parameters=both)  # fmt: skip
    assert [r["base"] for r in _field(schedule_from_hf(qwen), "rope")] == [1e6, 1e4, 1e4]
    chunked = {"chunked_attention": {"rope_type": "default", "rope_theta": 5e5},
               "full_attention": {"rope_type": "default", "rope_theta": 1e6}}  # fmt: skip
    llama4 = schedule_from_hf(_cfg("llama4_text", depth=4, rope_parameters=chunked))
    assert [r and r["base"] for r in _field(llama4, "rope")] == [5e5, 5e5, 5e5, None]
    only_chunked = {"chunked_attention": chunked["chunked_attention"]}
    with pytest.raises(ValueError, match="no entry for the attention layer type 'full_attention'"):
        schedule_from_hf(_cfg("llama4_text", depth=4, rope_parameters=only_chunked))


def test_llama4_keeps_given_layer_types():
    s = schedule_from_hf(_cfg("llama4_text", depth=4, layer_types=["full_attention"] * 4))
    assert _field(s, "chunk") == [None] * 4  # not the default chunked_attention layers


def test_mrope_layout_from_the_outer_or_the_text_model_type():
    from posenc.hf import mrope_from_hf

    text = {"hidden_size": 64, "num_attention_heads": 2, "rope_parameters": {"rope_theta": 1e6}}
    # the text config names no model type: the outer one decides (Qwen3-VL interleaves)
    got = mrope_from_hf({"model_type": "qwen3_vl", "text_config": text})
    assert got["interleaved"] is True and got["sections"] == (24, 20, 20)
    # the text config's own model type wins over the outer one
    inner = text | {"model_type": "qwen2_vl_text"}
    got = mrope_from_hf({"model_type": "qwen3_vl", "text_config": inner})
    assert got["interleaved"] is False and got["sections"] == (16, 24, 24)
    with pytest.raises(ValueError, match=r"\(model_type='llava' has no class default posenc "
                                         r"knows\)"):  # fmt: skip
        mrope_from_hf({"model_type": "llava", **text, "rope_parameters": {"type": "mrope"}})


def test_schedule_layers_differing_only_in_chunk_share_an_encoding():
    from posenc.torch import Schedule

    cfg = _cfg("llama4_text", depth=2, no_rope_layers=[1, 1], attention_chunk_size=4,
               layer_types=["chunked_attention", "full_attention"])  # fmt: skip
    s = Schedule.from_hf(cfg)
    assert (s[0].chunk, s[1].chunk) == (4, None) and s[0].encoding is s[1].encoding


def test_pairing_from_the_rope_interleave_key():
    from posenc.hf.config import pairing

    assert pairing({}, "deepseek_v3") == "interleaved"  # the class default: True
    assert pairing({"rope_interleave": True}, "deepseek_v3") == "interleaved"
    assert pairing({"rope_interleave": False}, "deepseek_v3") == "half"
    assert pairing({"rope_interleave": False}, "glm4") == "interleaved"  # no key: the code's
    assert pairing({}, None) == "half" and pairing({}, "llama") == "half"
    why = "model_type 'no_such_model' is not one whose pairing posenc knows.*code rotates$"
    with pytest.raises(ValueError, match=why):
        pairing({}, "no_such_model")
