"""The layer rules of particular model types (posenc.hf.layers) against transformers' own
modules, built on the meta device: which layers rotate (EXAONE 4, Kolibri 1, Cohere 2 and
its MoE's dense prefix), which keep a window (Qwen2's use_sliding_window and
max_window_layers), which have no attention at all (Qwen3-Next's Gated DeltaNet layers), and
which windows look both ways and are refused by name (ModernBERT, EmbeddingGemma, ...); then
the same rules on config.json dicts, case by case."""

import pytest
import torch
from test_schedule_from_hf import _attention_layers, _has_rope
from test_schedule_from_hf_dicts import _cfg, _field

from posenc.hf import layers, schedule_from_hf, settled
from posenc.torch import Schedule

transformers = pytest.importorskip("transformers")


def _rotates_like_hf(schedule, attentions, rule):
    """Each layer's RoPE and window are those of HF's attention module (``rule``: whether
    the module rotates, as its forward decides)."""
    for i, attn in enumerate(attentions):
        assert _has_rope(schedule.encoding_of(i)) == rule(attn), i
        assert schedule[i].window == attn.sliding_window or not rule(attn), i


@pytest.mark.parametrize(
    "module_name, attn_cls, cfg_cls, window",
    [("exaone4", "Exaone4Attention", "Exaone4Config", None),
     ("exaone4", "Exaone4Attention", "Exaone4Config", 8),
     ("exaone_moe", "ExaoneMoeAttention", "ExaoneMoeConfig", 8),  # its class needs a window
     ("kolibri1", "Kolibri1Attention", "Kolibri1Config", None),
     ("kolibri1", "Kolibri1Attention", "Kolibri1Config", 8)],
)  # fmt: skip
def test_exaone4_rule_every_layer_rotates_without_a_window(module_name, attn_cls, cfg_cls, window):
    # HF: ``if self.sliding_window is None or self.is_sliding``: apply_rotary_pos_emb
    kind = ["full_attention"] * 4 if window is None else ["sliding_attention"] * 3 + [
        "full_attention"]  # fmt: skip
    kw = {"num_hidden_layers": 4, "sliding_window": window, "layer_types": kind}
    cfg = getattr(transformers, cfg_cls)(**kw)
    attentions = _attention_layers(module_name, attn_cls, cfg)
    rule = lambda attn: attn.sliding_window is None or attn.is_sliding  # noqa: E731
    for config in (cfg, cfg.to_dict()):
        s = Schedule.from_hf(config)
        for i, attn in enumerate(attentions):
            assert _has_rope(s.encoding_of(i)) == rule(attn), i
            assert s[i].window == (attn.sliding_window if attn.is_sliding else None), i
    assert sum(rule(a) for a in attentions) == (4 if window is None else 3)


@pytest.mark.parametrize("dense", [0, 2])
def test_cohere2_moe_dense_prefix_rotates_with_force_rope(dense):
    from transformers import Cohere2MoeConfig

    kw = {"num_hidden_layers": 6, "first_k_dense_replace": dense}
    cfg = Cohere2MoeConfig(**kw)
    attentions = _attention_layers("cohere2_moe", "Cohere2MoeAttention", cfg)
    rule = lambda attn: attn.sliding_window is not None or attn.force_rope  # noqa: E731
    assert sum(a.force_rope for a in attentions) == dense  # the dense prefix, full attention
    keys = {
        "model_type": "cohere2_moe",
        "hidden_size": cfg.hidden_size,
        "head_dim": cfg.head_dim,
        "num_attention_heads": cfg.num_attention_heads,
        "sliding_window": cfg.sliding_window,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": cfg.rope_parameters,
    } | kw  # a config.json without layer_types
    for config in (cfg, cfg.to_dict(), keys):
        _rotates_like_hf(Schedule.from_hf(config), attentions, rule)


def test_cohere2_without_a_window_rotates_no_layer():
    from transformers import Cohere2Config

    cfg = Cohere2Config(num_hidden_layers=4, sliding_window=None)
    attentions = _attention_layers("cohere2", "Cohere2Attention", cfg)
    assert all(a.sliding_window is None for a in attentions)  # HF: ``if sliding_window`` rotates
    s = Schedule.from_hf(cfg.to_dict())
    assert [_has_rope(s.encoding_of(i)) for i in range(4)] == [False] * 4


@pytest.mark.parametrize(
    "module_name, cfg_cls, kw",
    [("qwen2", "Qwen2Config", {"num_hidden_layers": 30, "use_sliding_window": True}),
     ("qwen2", "Qwen2Config", {"num_hidden_layers": 3, "use_sliding_window": False,
                               "layer_types": ["sliding_attention"] * 3}),
     ("qwen2", "Qwen2Config", {"num_hidden_layers": 3}),
     ("qwen3", "Qwen3Config", {"num_hidden_layers": 4, "use_sliding_window": True,
                               "max_window_layers": 2}),
     ("qwen2_moe", "Qwen2MoeConfig", {"num_hidden_layers": 4, "use_sliding_window": True,
                                      "max_window_layers": 3}),
     ("qwen3_moe", "Qwen3MoeConfig", {"num_hidden_layers": 3, "use_sliding_window": True})],
)  # fmt: skip
def test_qwen_windows_follow_use_sliding_window_and_max_window_layers(module_name, cfg_cls, kw):
    cls = getattr(transformers, cfg_cls)
    cfg = cls(sliding_window=16, **kw)
    attn_cls = cfg_cls.replace("Config", "Attention")
    attentions = _attention_layers(module_name, attn_cls, cfg)
    # a config.json as written: the class's defaults (max_window_layers 28, use_sliding_window
    # False) and derived layer types left out unless given
    keys = {
        "model_type": cls.model_type,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "max_position_embeddings": 128,
        "rope_theta": 1e4,
        "sliding_window": 16,
    } | kw
    for config in (cfg, keys):
        s = Schedule.from_hf(config)
        want = [getattr(a, "sliding_window", None) or None for a in attentions]
        assert [layer.window for layer in s] == want


def test_qwen3_next_linear_attention_layers_have_no_attention_and_no_position():
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    from posenc.torch import Layer

    cfg = Qwen3NextConfig(num_hidden_layers=8, hidden_size=64, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=32, num_experts=2,
                          num_experts_per_tok=1, linear_num_value_heads=2,
                          linear_num_key_heads=1)  # fmt: skip
    with torch.device("meta"):
        blocks = [Qwen3NextDecoderLayer(cfg, i) for i in range(8)]
    attends = [hasattr(b, "self_attn") for b in blocks]  # the others hold a Gated DeltaNet
    assert attends == [t == "full_attention" for t in cfg.layer_types] and sum(attends) == 2
    for config in (cfg, cfg.to_dict()):
        layers = schedule_from_hf(config)["layers"]
        assert [layer["attention"] for layer in layers] == attends
        assert [layer["rope"] is not None for layer in layers] == attends
        s = Schedule.from_hf(config)
        assert [layer.attention for layer in s] == attends
        assert all(s[i].encoding is None for i in range(8) if not attends[i])
        rope = s.encoding_of(3)
        assert (rope.head_dim, rope.rotary_dim) == (32, 8)  # partial_rotary_factor 0.25
    assert "NoAttention" in repr(s)
    with pytest.raises(ValueError, match="a layer without attention has no encoding, window"):
        Layer(window=4, attention=False)
    with pytest.raises(ValueError, match="attention must be True or False, got 1"):
        Layer(attention=1)


def _uses_bidirectional_windows(module_name, model_cls):
    import inspect

    module = __import__(f"transformers.models.{module_name}.modeling_{module_name}",
                        fromlist=[model_cls])  # fmt: skip
    source = inspect.getsource(getattr(module, model_cls))
    return "create_bidirectional_sliding_window_mask(" in source


@pytest.mark.parametrize(
    "module_name, model_cls, cfg_cls",
    [("modernbert", "ModernBertModel", "ModernBertConfig"),
     ("ultrabert", "UltrabertModel", "UltrabertConfig"),
     ("muse_glimmer_assistant", "MuseGlimmerAssistantModel", "MuseGlimmerAssistantConfig"),
     ("embedding_gemma2", "EmbeddingGemma2TextModel", "EmbeddingGemma2TextConfig"),
     ("neomme", "NeoMMEModel", "NeoMMEConfig")],
)  # fmt: skip
def test_bidirectional_windows_are_refused_by_name(module_name, model_cls, cfg_cls):
    assert _uses_bidirectional_windows(module_name, model_cls)  # HF: |i - j| <= w, both ways
    cfg = getattr(transformers, cfg_cls)(num_hidden_layers=6)
    assert "sliding_attention" in cfg.layer_types
    why = f"model_type '{cfg.model_type}' is not reproduced: its sliding windows are bidirectional"
    for config in (cfg, cfg.to_dict()):
        with pytest.raises(ValueError, match=why):
            Schedule.from_hf(config)


def test_a_bidirectional_encoder_without_windows_is_built():
    from transformers import ModernBertConfig

    cfg = ModernBertConfig(num_hidden_layers=3, global_attn_every_n_layers=1)
    assert set(cfg.layer_types) == {"full_attention"}
    s = Schedule.from_hf(cfg)
    assert [layer.window for layer in s] == [None] * 3
    with pytest.raises(ValueError, match="its sliding windows are bidirectional"):
        Schedule.from_hf({k: v for k, v in cfg.to_dict().items() if k != "layer_types"})


def test_gemma3_with_use_bidirectional_attention_is_refused_by_name():
    import inspect

    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextModel

    source = inspect.getsource(Gemma3TextModel.forward)
    assert "_bidirectional_window_overlay(self.config.sliding_window)" in source
    cfg = Gemma3TextConfig(num_hidden_layers=6, use_bidirectional_attention=True)
    why = "'gemma3_text' is not reproduced: its sliding windows are bidirectional \\(use_bidir"
    for config in (cfg, cfg.to_dict()):
        with pytest.raises(ValueError, match=why):
            Schedule.from_hf(config)
    Schedule.from_hf(Gemma3TextConfig(num_hidden_layers=6))  # causal: built


def test_layer_rules_of_config_dicts():
    # the class rules of posenc.hf.layers, each by the value HF's class derives (the meta-device
    # tests in test_schedule_from_hf_layers.py compare whole models)
    rope = lambda s: [r is not None for r in _field(s, "rope")]  # noqa: E731
    gemma = _cfg("gemma3_text", depth=7, head_dim=16, sliding_window=4)
    assert _field(schedule_from_hf(gemma), "window") == [4] * 5 + [None, 4]  # pattern 6
    s = schedule_from_hf(gemma | {"sliding_window_pattern": 2})
    assert _field(s, "window") == [4, None] * 3 + [4]
    with pytest.raises(
        ValueError,
        match="config gives neither layer_types nor sliding_window, "
        "and the config class of "
        "model_type='gemma3_text' has a default window",
    ):
        schedule_from_hf(_cfg("gemma3_text", head_dim=16))
    cohere = _cfg("cohere2", depth=5, sliding_window=4)
    assert _field(schedule_from_hf(cohere), "window") == [4, 4, 4, None, 4]  # pattern 4
    assert rope(schedule_from_hf(cohere)) == [True, True, True, False, True]
    moe = _cfg("qwen2_moe", depth=4, sliding_window=4, use_sliding_window=True)
    assert _field(schedule_from_hf(moe), "window") == [4, None, 4, None]  # below 28
    assert _field(schedule_from_hf(moe | {"max_window_layers": 1}), "window") == [4] + [None] * 3
    off = moe | {"use_sliding_window": False}
    assert _field(schedule_from_hf(off), "window") == [None] * 4
    dense = _cfg("cohere2_moe", depth=6, sliding_window=4, first_k_dense_replace=2)
    assert _field(schedule_from_hf(dense), "window") == [None, None, 4, 4, 4, None]
    assert rope(schedule_from_hf(dense)) == [True, True, True, True, True, False]
    patterned = dense | {"prefix_dense_sliding_window_pattern": 2, "sliding_window_pattern": 2}
    assert _field(schedule_from_hf(patterned), "window") == [4, None, 4, None, 4, None]
    assert rope(schedule_from_hf(patterned)) == [True, False, True, False, True, False]
    for model_type in ("exaone4", "kolibri1"):
        # sliding_window None (a missing key is the class default window, 4096)
        full = _cfg(model_type, depth=2, layer_types=["full_attention"] * 2, sliding_window=None)
        assert rope(schedule_from_hf(full)) == [True, True]  # no window: every layer
        mixed = full | {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
        assert rope(schedule_from_hf(mixed)) == [True, False]
    legacy = _cfg(depth=3, layer_types=["attention", "mamba", "recurrent"])
    assert _field(schedule_from_hf(legacy), "attention") == [True, False, False]


@pytest.mark.parametrize("kind", ["linear_attention", "mamba", "recurrent", "conv", "moe", "mlp",
                                  "sparse", "dense"])  # fmt: skip
def test_layers_without_attention_carry_no_position(kind):
    s = schedule_from_hf(_cfg(depth=2, sliding_window=4, layer_types=["full_attention", kind]))
    assert s["layers"][1] == {
        "attention": False,
        "rope": None,
        "window": None,
        "chunk": None,
        "temperature": None,
        "slice_start": None,
        "softmax_factor": None,
        "sinks": None,
    }
    assert s["layers"][0]["attention"] is True and s["layers"][0]["rope"]["base"] == 1e4


def test_bidirectional_flags_and_types_are_refused_only_with_windows():
    flag = {"use_bidirectional_attention": True}
    for model_type in ("gemma3_text", "step3p5"):
        with pytest.raises(
            ValueError,
            match=f"'{model_type}' is not reproduced: its sliding "
            "windows are bidirectional \\(use_bidirectional_",
        ):
            schedule_from_hf(_cfg(model_type, head_dim=16, sliding_window=4, **flag,
                                  layer_types=["sliding_attention", "full_attention"]))  # fmt: skip
        full = _cfg(model_type, head_dim=16, layer_types=["full_attention"] * 2, **flag)
        assert _field(schedule_from_hf(full), "window") == [None, None]  # no window to refuse
    with pytest.raises(ValueError, match="'modernbert' is not reproduced: its sliding windows"):
        schedule_from_hf(_cfg("modernbert"))  # no layer_types: the class's rule has windows
    assert schedule_from_hf(_cfg("gemma2", head_dim=16, **flag))["layers"][0]["window"] is None


def _windows_of_hf(cfg):
    """HF's window per layer: config.sliding_window on the sliding layers (the attention
    modules of these models read it so), after the class has dropped or kept it."""
    types = getattr(cfg, "layer_types", None) or ["sliding_attention"] * cfg.num_hidden_layers
    return [cfg.sliding_window or None if t == "sliding_attention" else None for t in types]


@pytest.mark.parametrize("model_type", sorted(layers.WINDOW_IF_USED))
@pytest.mark.parametrize("used", [False, True])
def test_window_tables_are_those_of_the_config_classes(model_type, used):
    from transformers import CONFIG_MAPPING

    depth = layers.SLIDE_FROM.get(model_type, 4) + 2  # the class's default, crossed
    keys = {"num_hidden_layers": depth, "sliding_window": 16, "use_sliding_window": used}
    cfg = CONFIG_MAPPING[model_type](**keys)
    config = settled.settle(keys, model_type, depth)  # a config.json without max_window_layers
    types = layers.layer_types(config, model_type, depth)
    # DeepseekOcr2VisionEncoder keeps the window but builds create_causal_mask only (flash
    # attention alone reads sliding_window): no layer of its model slides in eager or SDPA
    # attention (tests/test_window_readers.py runs it)
    keeps = _windows_of_hf(cfg)
    got = [layers.window(config, t) for t in types]
    assert got == ([None] * depth if model_type == "deepseek_ocr2_encoder" else keeps)
    assert any(keeps) == used


@pytest.mark.parametrize("module_name, cfg_cls", [("cohere2", "Cohere2Config"),
                                                  ("flint", "FlintConfig")])  # fmt: skip
def test_rope_only_where_a_window_is(module_name, cfg_cls):
    cfg = getattr(transformers, cfg_cls)(num_hidden_layers=6)
    attn_cls = cfg_cls.replace("Config", "Attention")
    attentions = _attention_layers(module_name, attn_cls, cfg)
    s = Schedule.from_hf(cfg.to_dict())
    rule = lambda attn: attn.sliding_window is not None  # noqa: E731
    assert {rule(a) for a in attentions} == {True, False}
    _rotates_like_hf(s, attentions, rule)
