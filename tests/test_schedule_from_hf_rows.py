"""Per-layer rules the atlas's end-to-end check found wrong (issue 40), against transformers'
own modules on the meta device, its config classes and, for the window and the widths, its
attention in float64 (tools/atlas_e2e.py): which layers rotate (AFMoE, MuseGlimmer/MuseSpark's
layer_rope_theta, Mistral Large 4's no_rope_layers, GraniteMoeHybrid's position_embedding_type,
Zamba2's use_mem_rope), the per-layer RoPE bases of Granite SWA, the layer types a config dict
holds only in a property (Bamba, RecurrentGemma), Moshi's unused window, and the per-layer
widths of Gemma 4's full layers and Dots3's sliding layers (per_layer_config)."""

import importlib
import sys
from pathlib import Path

import pytest
import torch
from test_schedule_from_hf import _attention_layers, _has_rope

from posenc.hf import schedule_from_hf
from posenc.torch import ChannelSlice, RotaryEmbedding, Schedule

transformers = pytest.importorskip("transformers")


def _rope(enc):
    return next((m for m in enc.modules() if isinstance(m, RotaryEmbedding)), None)


def _both(cfg):
    """The config object and its config.json dict (posenc reads both)."""
    return [cfg, cfg.to_dict()]


def test_afmoe_rotates_its_sliding_layers_only():
    # AfmoeAttention: ``if self.is_local_attention``: apply_rotary_pos_emb
    kinds = ["sliding_attention"] * 3 + ["full_attention"]
    cfg = transformers.AfmoeConfig(num_hidden_layers=4, sliding_window=8, layer_types=kinds)
    attentions = _attention_layers("afmoe", "AfmoeAttention", cfg)
    for config in _both(cfg):
        s = Schedule.from_hf(config)
        for i, attn in enumerate(attentions):
            assert _has_rope(s.encoding_of(i)) == attn.is_local_attention, i
            assert s[i].window == attn.sliding_window, i


@pytest.mark.parametrize("name", ["MuseGlimmerTextConfig", "MuseSparkTextConfig"])
def test_muse_nope_layers_follow_layer_rope_theta(name):
    # Muse*TextModel: position_embeddings if config.layer_rope_theta[i] else None; one rotary
    # embedding at rope_theta (the class derives 0 every 4th layer counted from the last)
    cls = getattr(transformers, name)
    cases = [(5, {}), (6, {}), (5, {"layer_rope_theta": [0, 5e5, 0, 1e4, 7.0]})]
    for depth, kw in cases:  # depth 6: counted from the last layer, not the first
        cfg = cls(num_hidden_layers=depth, **kw)
        base = cfg.rope_parameters["rope_theta"]
        assert 0 in cfg.layer_rope_theta and any(cfg.layer_rope_theta)
        d = cfg.to_dict()
        if not kw:
            d.pop("layer_rope_theta")  # a config.json without it: the class's default
        for config in (cfg, d):
            s = Schedule.from_hf(config)
            for i, theta in enumerate(cfg.layer_rope_theta):
                rope = _rope(s.encoding_of(i))
                assert (rope is not None) == bool(theta), (kw, i)
                assert rope is None or rope.base == base


@pytest.mark.parametrize("name", ["GraniteSWAConfig", "GraniteMoeSWAConfig"])
def test_granite_swa_bases_per_layer(name):
    # GraniteSWAModel: one rotary embedding per nonzero layer_rope_theta, none where 0
    cls = getattr(transformers, name)
    cfg = cls(num_hidden_layers=3, layer_rope_theta=[1e4, 0, 5e5])
    for config in _both(cfg):
        s = Schedule.from_hf(config)
        assert [_rope(s.encoding_of(i)) and _rope(s.encoding_of(i)).base for i in range(3)] == [
            1e4, None, 5e5]  # fmt: skip


def test_mistral_large4_no_rope_layers():
    # MistralLarge4TextAttention: use_rope = config.no_rope_layers[i]; a NoPE layer's whole
    # head (qk_nope_head_dim + qk_rope_head_dim) carries no position
    cfg = transformers.MistralLarge4TextConfig(num_hidden_layers=4)
    attentions = _attention_layers("mistral_large4", "MistralLarge4TextAttention", cfg)
    assert [a.use_rope for a in attentions] == [1, 1, 1, 0]
    for config in _both(cfg):
        s = Schedule.from_hf(config)
        for i, attn in enumerate(attentions):
            enc = s.encoding_of(i)
            assert _has_rope(enc) == bool(attn.use_rope), i
            if attn.use_rope:
                sliced = next(m for m in enc.modules() if isinstance(m, ChannelSlice))
                assert sliced.start == attn.qk_nope_head_dim, i


def test_granitemoehybrid_rotates_only_with_position_embedding_type_rope():
    # GraniteMoeHybridModel: rotary_emb = ... if position_embedding_type == "rope" else None
    for kind in (None, "nope", "rope"):
        cfg = transformers.GraniteMoeHybridConfig(
            num_hidden_layers=2, layer_types=["attention", "mamba"], hidden_size=64,
            num_attention_heads=4, position_embedding_type=kind)  # fmt: skip
        with torch.device("meta"):
            model = transformers.GraniteMoeHybridModel(cfg)
        for config in _both(cfg):
            s = Schedule.from_hf(config)
            assert _has_rope(s.encoding_of(0)) == (model.rotary_emb is not None), kind
            assert not s[1].attention


def test_olmo_hybrid_without_rope_theta_has_no_rope():
    # OlmoHybridModel: rotary_emb = None unless rope_parameters' rope_theta is set (the
    # released checkpoints set it to None)
    d = transformers.OlmoHybridConfig(num_hidden_layers=4).to_dict()
    for change in ({}, {"rope_parameters": None, "rope_theta": None},
                   {"rope_parameters": {"rope_type": "default", "rope_theta": None}}):  # fmt: skip
        cfg = transformers.OlmoHybridConfig.from_dict(d | change)
        with torch.device("meta"):
            model = transformers.OlmoHybridModel(cfg)
        for config in (cfg, d | change):
            s = Schedule.from_hf(config)
            assert [x.attention for x in s] == [t != "linear_attention" for t in cfg.layer_types]
            assert _has_rope(s.encoding_of(3)) == (model.rotary_emb is not None), change


def test_zamba2_rotates_only_with_use_mem_rope():
    # Zamba2Model: position_embeddings = self.rotary_emb(...) if config.use_mem_rope else None
    src = Path(importlib.import_module("transformers.models.zamba2.modeling_zamba2").__file__)
    assert "if self.config.use_mem_rope:" in src.read_text()
    for use in (False, True):
        cfg = transformers.Zamba2Config(num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
                                        use_mem_rope=use)  # fmt: skip
        for config in _both(cfg):  # the dict holds layers_block_type, attention_head_dim
            s = Schedule.from_hf(config)
            assert not s[0].attention and _has_rope(s.encoding_of(1)) == use
            assert not use or _rope(s.encoding_of(1)).head_dim == cfg.attention_head_dim


def test_nemotron_h_attention_has_no_position():
    # NemotronHAttention.forward applies no rotation; its dict holds layers_block_type and
    # no num_hidden_layers (a property)
    cfg = transformers.NemotronHConfig(num_hidden_layers=4)
    with torch.device("meta"):
        model = transformers.NemotronHModel(cfg)
    assert not any("Rotary" in type(m).__name__ for m in model.modules())
    for config in _both(cfg):
        s = Schedule.from_hf(config)
        assert [x.attention for x in s] == [t not in ("linear_attention", "moe", "mlp")
                                            for t in cfg.layer_types]  # fmt: skip
        assert all(x.encoding is None for x in s)


def test_layer_types_a_dict_holds_only_in_a_property():
    # BambaConfig.layers_block_type, RecurrentGemmaConfig.layers_block_type: properties that
    # to_dict() leaves out, read here from attn_layer_indices / block_types
    cfg = transformers.BambaConfig(num_hidden_layers=4, attn_layer_indices=[1, 3])
    rg = transformers.RecurrentGemmaConfig(num_hidden_layers=5, attention_window_size=16)
    for c in (cfg, rg):
        d = c.to_dict()
        assert "layer_types" not in d and "layers_block_type" not in d
        got = schedule_from_hf(d)["layers"]
        assert [x["attention"] for x in got] == [t != "linear_attention" for t in c.layer_types]
        windows = [x["window"] for x in got if x["attention"]]
        assert windows == [getattr(c, "sliding_window", None)] * len(windows)
        assert all(x["rope"] for x in got if x["attention"])


def test_bamba_rotates_half_its_head_whatever_the_top_level_factor_says():
    # BambaConfig.__post_init__: kwargs["partial_rotary_factor"] = 0.5 ("hardcode for BC")
    cfg = transformers.BambaConfig(num_hidden_layers=2, attn_layer_indices=[0])
    d = cfg.to_dict()
    d.pop("rope_parameters")
    d |= {"rope_theta": 1e4, "partial_rotary_factor": 1.0}  # a 4.x config.json
    want = transformers.BambaConfig.from_dict(d).rope_parameters["partial_rotary_factor"]
    head = cfg.hidden_size // cfg.num_attention_heads
    rope = _rope(Schedule.from_hf(d).encoding_of(0))
    assert rope.rotary_dim == int(head * want) < head


def test_gemma4_full_layers_are_global_head_dim_wide():
    # Gemma4TextAttention: head_dim = config.per_layer_config[i].head_dim (global_head_dim on
    # the full layers); a 4.x-era config.json carries global_head_dim, a 5.x one per_layer_config
    for name, module, attn_cls in [("Gemma4TextConfig", "gemma4", "Gemma4TextAttention"),
                                   ("Gemma4UnifiedTextConfig", "gemma4_unified",
                                    "Gemma4UnifiedTextAttention")]:  # fmt: skip
        cfg = getattr(transformers, name)(num_hidden_layers=6, global_head_dim=384)
        attentions = _attention_layers(module, attn_cls, cfg)
        hub = cfg.to_dict() | {"global_head_dim": 384}
        hub.pop("per_layer_config")
        for config in (*_both(cfg), hub):
            s = Schedule.from_hf(config)
            assert [_rope(s.encoding_of(i)).head_dim for i in range(6)] == [
                a.head_dim for a in attentions]  # fmt: skip
            assert s.encoding_of(5).softmax_scale(384) == pytest.approx(attentions[5].scaling)
            full = RotaryEmbedding.from_hf(config, layer_type="full_attention")
            assert full.head_dim == attentions[5].head_dim


def test_dots3_sliding_layers_rotate_their_own_slice():
    # Dots3NoteTextAttention: per_layer_config[i]'s qk_nope_head_dim (192 on the sliding layers,
    # 128 on the others) is where the rotated channels start; swa_rope_theta their base
    cfg = transformers.Dots3NoteTextConfig(num_hidden_layers=3)
    attentions = _attention_layers("dots3_note", "Dots3NoteTextAttention", cfg)
    assert len({a.qk_nope_head_dim for a in attentions}) == 2
    for config in _both(cfg):
        s = Schedule.from_hf(config)
        for i, attn in enumerate(attentions):
            enc = s.encoding_of(i)
            sliced = next(m for m in enc.modules() if isinstance(m, ChannelSlice))
            assert (sliced.start, sliced.width) == (attn.qk_nope_head_dim, attn.qk_rope_head_dim)
            kind = cfg.layer_types[i]
            assert _rope(enc).base == cfg.rope_parameters[kind]["rope_theta"], i


@pytest.fixture
def atlas_e2e():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import atlas_e2e

    atlas_e2e._DONE.clear()
    yield atlas_e2e
    atlas_e2e._DONE.clear()


@pytest.mark.parametrize(
    "name, config, kw",
    [("moshi", "MoshiConfig", {}),
     ("bamba", "BambaConfig", {"num_hidden_layers": 2, "attn_layer_indices": [1]}),
     ("granitemoehybrid", "GraniteMoeHybridConfig",
      {"num_hidden_layers": 2, "layer_types": ["mamba", "attention"]})],
)  # fmt: skip
def test_attention_output_matches_hf(atlas_e2e, name, config, kw):
    """HF's attention in float64, from the config dict: Moshi's layers attend causally
    (create_causal_mask, no window passed on; the tiny config's window is shrunk below the
    sequence); Bamba's attention layer rotates half its head and its Mamba layers have no
    attention; GraniteMoeHybrid's attention without position_embedding_type has no RoPE."""
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    result = atlas_e2e.run_e2e(module, getattr(transformers, config)(**kw))
    assert result["default"]["status"] == "exact", result["default"]


def test_bad_per_layer_settings_are_refused_by_name():
    cfg = transformers.GraniteSWAConfig(num_hidden_layers=3).to_dict()
    with pytest.raises(ValueError, match="layer_rope_theta must have num_hidden_layers=3"):
        schedule_from_hf(cfg | {"layer_rope_theta": [1e4, 0]})
    gemma = transformers.Gemma4TextConfig(num_hidden_layers=6).to_dict()
    with pytest.raises(ValueError, match="per_layer_config must map layer indices"):
        schedule_from_hf(gemma | {"per_layer_config": [{"head_dim": 512}]})
    uneven = {"0": {"head_dim": 128}, "5": {"head_dim": 512}}  # layer 0 slides, as 1-4
    with pytest.raises(ValueError, match="layers of type 'sliding_attention' different widths"):
        schedule_from_hf(gemma | {"per_layer_config": uneven})
