"""M-RoPE and PhiMoE from a config, checked against transformers' own rotary classes.

The oracle is the model's code, not the config's keys: Qwen3-VL's rotary class interleaves
its sections whatever ``mrope_interleaved`` says (or without it), Qwen2-VL's never does,
and both fall back on their class default ``mrope_section``; PhiMoE switches to its long
scale past ``rope_parameters``' original length, where a top-level key does not reach.
q and k are rotated by HF's rotary class and ``apply_rotary_pos_emb`` and by posenc built
from the same config, at Qwen2-VL position ids of text, an image and text. Every model type
of ``posenc.hf.mrope.MROPE_LAYOUT`` (interleaved or consecutive sections, pairing, partial
rotary, two axes, per layer type) is checked against its own class's recomposition and apply
function at float64 angles, on image and video positions whose (t, h, w) differ.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import MRoPE, RotaryEmbedding

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")

# model type -> (config class, text rotary class, module holding apply_rotary_pos_emb)
QWEN = {
    "qwen2_vl": ("Qwen2VLTextConfig", "qwen2_vl", "Qwen2VLRotaryEmbedding"),
    "qwen2_5_vl": ("Qwen2_5_VLTextConfig", "qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding"),
    "qwen3_vl": ("Qwen3VLTextConfig", "qwen3_vl", "Qwen3VLTextRotaryEmbedding"),
    "qwen3_vl_moe": ("Qwen3VLMoeTextConfig", "qwen3_vl_moe", "Qwen3VLMoeTextRotaryEmbedding"),
}


def _hf(model_type, **keys):
    cls_name, module, rotary = QWEN[model_type]
    mod = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=["x"])
    config = getattr(transformers, cls_name)(
        hidden_size=256, num_attention_heads=2, num_key_value_heads=2, head_dim=128, **keys
    )
    return config, getattr(mod, rotary)(config), mod.apply_rotary_pos_emb


def _positions():
    ids = posenc.mrope_positions([3, (1, 8, 6), 2], spatial_merge=2)  # (seq, 3)
    return torch.from_numpy(ids)


@pytest.mark.parametrize("model_type", list(QWEN))
@pytest.mark.parametrize(
    "keys", [{}, {"mrope_interleaved": True}, {"mrope_interleaved": False}], ids=str
)
def test_mrope_from_hf_rotates_as_the_models_own_class(model_type, keys):
    params = {"rope_type": "default", "rope_theta": 1e6, **keys}  # no mrope_section: default
    config, rotary, apply = _hf(model_type, rope_parameters=params)
    pos = _positions()  # (seq, 3)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, len(pos), 128, generator=gen), torch.randn(1, 2, len(pos), 128)
    cos, sin = rotary(q, pos.T[:, None, :])  # HF: position ids (3, batch, seq)
    want_q, want_k = apply(q, k, cos, sin)
    mrope = MRoPE.from_hf(config)
    assert mrope.sections == tuple(rotary.mrope_section)  # the class's default
    assert mrope.interleaved == model_type.startswith("qwen3")  # the class's, not the key's
    got_q, got_k = mrope(q, k, pos[None])
    for got, want in ((got_q, want_q), (got_k, want_k)):
        err = (got - want).abs().max().item()
        assert err < 1e-5 * max(1, len(pos)), err  # float32 angles in HF


def test_a_qwen3_vl_dict_without_the_key_is_interleaved_and_qwen2_vl_not():
    base = {"hidden_size": 256, "num_attention_heads": 2, "head_dim": 128,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                "mrope_section": [24, 20, 20]}}  # fmt: skip
    assert MRoPE.from_hf({**base, "model_type": "qwen3_vl_text"}).interleaved
    assert not MRoPE.from_hf({**base, "model_type": "qwen2_vl_text"}).interleaved
    outer = {"model_type": "qwen3_vl", "text_config": {**base, "model_type": "qwen3_vl_text"}}
    assert MRoPE.from_hf(outer).interleaved  # the text config's model type decides
    unknown = {**base, "model_type": "someone_elses_vl"}
    assert not MRoPE.from_hf(unknown).interleaved  # no rule: the key (absent: consecutive)
    unknown["rope_parameters"] = {**base["rope_parameters"], "mrope_interleaved": True}
    assert MRoPE.from_hf(unknown).interleaved
    no_section = {**base, "model_type": "someone_elses_vl"}
    no_section["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    with pytest.raises(ValueError, match="model_type='someone_elses_vl' has no class default"):
        MRoPE.from_hf(no_section)


def _phimoe(**top):
    rope = {"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32,
            "short_mscale": 1.1, "long_mscale": 1.2}  # fmt: skip
    return {"model_type": "phimoe", "hidden_size": 256, "num_attention_heads": 4,
            "rope_theta": 1e4, "max_position_embeddings": 131072, "rope_scaling": rope,
            **top}  # fmt: skip


@pytest.mark.parametrize("case", ["top-level only", "in rope_scaling", "both"])
def test_phimoe_switches_scale_where_its_rotary_class_does(case):
    from transformers import PhimoeConfig
    from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

    raw = _phimoe(
        **({} if case == "in rope_scaling" else {"original_max_position_embeddings": 2048})
    )
    if case != "top-level only":
        raw["rope_scaling"] = {**raw["rope_scaling"], "original_max_position_embeddings": 4096}
    hf = PhimoeRotaryEmbedding(PhimoeConfig.from_dict(raw))
    rope = RotaryEmbedding.from_hf(raw).double()
    x = torch.zeros(1)
    for n in (2048, 2049, 4096, 4097):
        want = float(hf(x, torch.arange(n)[None])[0][0, 0, 0])  # the scale: cos(0) * mscale
        got = float(rope.table(range(n), torch.float64)[0, 0, 0, 0])
        assert got == pytest.approx(want, rel=1e-6), (case, n)
    switch = 131072 if case == "top-level only" else 4096  # the top-level key never counts
    assert rope.scaling.original_max_len == switch
    scale = rope.table(range(min(switch + 1, rope.max_len)), torch.float64)[0, 0, 0, 0].item()
    assert np.isclose(scale, 1.1 if switch == rope.max_len else 1.2)


# Every M-RoPE model type of posenc.hf.mrope.MROPE_LAYOUT, against its own text rotary class's
# recomposition and its apply function, in float64, at image and video positions. model type
# -> (modeling module, rotary class, extra rope_parameters, layer type or None)
_PRF = {"partial_rotary_factor": 0.5}
MODELS = {
    "qwen2_vl_text": ("qwen2_vl", "Qwen2VLRotaryEmbedding", {}, None),
    "qwen2_5_vl_text": ("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding", {}, None),
    "paddleocr_vl_text": ("paddleocr_vl", "PaddleOCRRotaryEmbedding", {}, None),
    "qwen2_5_omni_text": ("qwen2_5_omni", "Qwen2_5OmniRotaryEmbedding", {}, None),
    "qwen2_5_omni_talker": ("qwen2_5_omni", "Qwen2_5OmniRotaryEmbedding", {}, None),
    "qwen3_vl_text": ("qwen3_vl", "Qwen3VLTextRotaryEmbedding", {}, None),
    "qwen3_vl_moe_text": ("qwen3_vl_moe", "Qwen3VLMoeTextRotaryEmbedding", {}, None),
    "cosmos3_edge_text": ("cosmos3_edge", "Cosmos3EdgeTextRotaryEmbedding",
                          {"mrope_section": [24, 20, 20]}, None),  # its class needs the key
    "qwen3_omni_moe_text": ("qwen3_omni_moe", "Qwen3OmniMoeThinkerTextRotaryEmbedding", {}, None),
    "qwen3_omni_moe_talker_text": ("qwen3_omni_moe", "Qwen3OmniMoeTalkerRotaryEmbedding", {},
                                   None),
    "qwen3_5_text": ("qwen3_5", "Qwen3_5TextRotaryEmbedding", {}, None),  # class prf 0.25
    "qwen3_5_moe_text": ("qwen3_5_moe", "Qwen3_5MoeTextRotaryEmbedding", {}, None),
    "qwen4_exp_text": ("qwen4_exp", "Qwen4ExpTextRotaryEmbedding", {"partial_rotary_factor": 0.25},
                       None),
    "glm4v_text": ("glm4v", "Glm4vTextRotaryEmbedding", _PRF, None),
    "glm4v_moe_text": ("glm4v_moe", "Glm4vMoeTextRotaryEmbedding", _PRF, None),
    "glm_image_text": ("glm_image", "GlmImageTextRotaryEmbedding", _PRF, None),
    "glm_ocr_text": ("glm_ocr", "GlmOcrTextRotaryEmbedding", _PRF, None),
    "cohere_compass_text": ("cohere_compass", "CohereCompassRotaryEmbedding", {},
                            "sliding_attention"),
    "neomme": ("neomme", "NeoMMERotaryEmbedding", {}, "full_attention"),
}  # fmt: skip


def _hf_config(model_type, extra, layer_type, section=None, head_dim=128):
    keys = {"rope_type": "default", "rope_theta": 1e4, **extra}
    if section:
        keys["mrope_section"] = list(section)
    kw = {"hidden_size": 2 * head_dim, "num_attention_heads": 2, "num_key_value_heads": 2,
          "head_dim": head_dim, "num_hidden_layers": 4, "rope_parameters": keys}  # fmt: skip
    if layer_type:  # per layer type: a rotary set for each, none on the full layers (Cohere)
        other = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 1.0}
        if model_type == "neomme":
            keys = {**keys, "partial_rotary_factor": 0.25}
        sets = {"sliding_attention": keys, "full_attention": keys}
        sets["full_attention" if layer_type == "sliding_attention" else "sliding_attention"] = (
            None if model_type == "cohere_compass_text" else other
        )
        kw |= {"layer_types": ["sliding_attention"] * 3 + ["full_attention"],
               "rope_parameters": sets}  # fmt: skip
    if model_type == "neomme":
        kw["vision_config"] = {"hidden_size": 32, "num_attention_heads": 2}
    return transformers.AutoConfig.for_model(model_type, **kw)


def _grid_positions():
    """Text, an image of 4 x 3 merged patches, text, a video of 3 frames of 2 x 2, text."""
    ids = posenc.mrope_positions([3, (1, 8, 6), 2, (3, 4, 4), 2], spatial_merge=2)
    return torch.from_numpy(ids)  # (seq, 3): (time, height, width)


def _hf_rotary(model_type, config):
    module_name, rotary_name = MODELS[model_type][:2]
    mod = __import__(f"transformers.models.{module_name}.modeling_{module_name}", fromlist=["x"])
    return mod, getattr(mod, rotary_name)(config)


def _hf_rotate(model_type, config, layer_type, q, k, pos):
    """q, k rotated by the model's rotary class's layout and apply function, at float64
    angles: ``position * inv_freq`` recomposed by the class, its rates checked first."""
    mod, rotary = _hf_rotary(model_type, config)
    inv = getattr(rotary, f"{layer_type}_inv_freq" if layer_type else "inv_freq").double()
    rd = 2 * len(inv)  # the rotated width; its rates as a float64 formula:
    params = config.rope_parameters[layer_type] if layer_type else config.rope_parameters
    rates = 1.0 / params["rope_theta"] ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    torch.testing.assert_close(inv, rates, rtol=1e-6, atol=0)
    ids = pos.T[:, None, :]  # HF's position ids: (n_axes, batch, seq)
    freqs = ids[..., None].double() * rates  # (n_axes, batch, seq, rd // 2)
    args = (layer_type,) if model_type == "cohere_compass_text" else ()
    cos = rotary.recomposition_frequencies(freqs.cos(), *args)
    sin = rotary.recomposition_frequencies(freqs.sin(), *args)
    return mod.apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("explicit", [False, True], ids=["class default", "mrope_section"])
@pytest.mark.parametrize("model_type", list(MODELS))
def test_every_mrope_layout_rotates_as_the_models_own_code_at_image_and_video_positions(
    model_type, explicit
):
    _, _, extra, layer_type = MODELS[model_type]
    section = None
    if explicit:  # the config names its sections (the class default), and no layout key
        if model_type == "neomme":
            pytest.skip("NeoMME's class reads no mrope_section")
        section = _hf_rotary(model_type, _hf_config(model_type, extra, layer_type))[1]
        section = section.mrope_section  # the class's default sections
        section = section[layer_type] if isinstance(section, dict) else section
    config = _hf_config(model_type, extra, layer_type, section)
    pos = _grid_positions()
    if model_type == "neomme":
        pos = pos[:, 1:]  # NeoMME's two axes: (row, column)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, len(pos), 128, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, len(pos), 128, generator=gen, dtype=torch.float64)
    want_q, want_k = _hf_rotate(model_type, config, layer_type, q, k, pos)
    mrope = MRoPE.from_hf(config, **({"layer_type": layer_type} if layer_type else {}))
    got_q, got_k = mrope(q, k, pos[None])
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-12)
    text = torch.arange(len(pos))  # and at text positions (where M-RoPE is RoPE)
    want_q, _ = _hf_rotate(model_type, config, layer_type, q, k, text[:, None].expand(pos.shape))
    torch.testing.assert_close(mrope(q, k, text)[0], want_q, rtol=0, atol=1e-12)


def test_the_layout_table_is_the_tested_one_and_outer_types_name_their_text_class():
    from posenc.hf.mrope import MROPE_LAYOUT, NO_MROPE, TEXT_OF

    assert set(MROPE_LAYOUT) == set(MODELS)  # every entry checked above against its class
    for outer, text in TEXT_OF.items():  # what a text_config without model type becomes
        assert transformers.AutoConfig.for_model(outer).text_config.model_type == text, outer
        assert text in MROPE_LAYOUT or text in NO_MROPE


@pytest.mark.parametrize("model_type", ["ernie4_5_vl_moe_text", "hunyuan_vl_text"])
def test_layouts_mrope_does_not_offer_are_refused_by_name(model_type):
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [16, 16, 32]}
    config = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 2,
              "head_dim": 128, "max_position_embeddings": 64, "rope_parameters": rope}  # fmt: skip
    with pytest.raises(ValueError, match=f"model_type {model_type!r} is not reproduced"):
        MRoPE.from_hf(config)
    outer = {"model_type": model_type.removesuffix("_text"), "text_config": config}
    with pytest.raises(ValueError, match="is not reproduced"):
        MRoPE.from_hf(outer)
    with pytest.raises(ValueError, match="MRoPE.from_hf|not one whose pairing"):
        RotaryEmbedding.from_hf(config)  # not one RoPE either


def test_a_layer_type_of_a_model_with_one_rope_set_is_that_set():
    """Qwen3-VL's one flat set serves every attention layer: asking for the full-attention
    layers builds it (as HF's rotary class rotates); a layer type whose set is None (Cohere
    Compass's full layers) is refused by name."""
    from posenc.hf import mrope_from_hf

    config = _hf_config("qwen3_vl_text", {}, None)
    pos = _grid_positions()
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, len(pos), 128, generator=gen, dtype=torch.float64)
    want_q, want_k = _hf_rotate("qwen3_vl_text", config, None, q, q.flip(-1), pos)
    got_q, got_k = MRoPE.from_hf(config, layer_type="full_attention")(q, q.flip(-1), pos[None])
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-12)
    compass = _hf_config("cohere_compass_text", {}, "sliding_attention")
    assert compass.rope_parameters["full_attention"] is None
    with pytest.raises(ValueError, match=r"^layer_type 'full_attention' has no RoPE \(its "
                                         r"rope_parameters are None\)$"):  # fmt: skip
        mrope_from_hf(compass, layer_type="full_attention")


@pytest.mark.parametrize("top", [None, 0.5], ids=["class default", "top-level key"])
def test_partial_m_rope_width_of_a_dict_is_that_of_hf_s_rotary_class(top):
    """Qwen3.5 from a dict whose rope_parameters name no partial_rotary_factor: the class's
    default (0.25), or a top-level key, sets the width HF's rotary class turns."""
    from posenc.hf import mrope_from_hf

    cfg = {"hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2,
           "head_dim": 128, "num_hidden_layers": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    if top is not None:
        cfg["partial_rotary_factor"] = top
    hf = transformers.AutoConfig.for_model("qwen3_5_text", **copy.deepcopy(cfg))  # it fills in
    width = 2 * len(_hf_rotary("qwen3_5_text", hf)[1].inv_freq)
    assert width == (64 if top else 32)  # 0.5 or 0.25 of the 128-wide head
    got = mrope_from_hf(cfg | {"model_type": "qwen3_5_text"})
    assert (got["rotary_dim"], sum(got["sections"])) == (width, width // 2)
