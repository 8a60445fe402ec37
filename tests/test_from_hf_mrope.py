"""M-RoPE and PhiMoE from a config, checked against transformers' own rotary classes.

The oracle is the model's code, not the config's keys: Qwen3-VL's rotary class interleaves
its sections whatever ``mrope_interleaved`` says (or without it), Qwen2-VL's never does,
and both fall back on their class default ``mrope_section``; PhiMoE switches to its long
scale past ``rope_parameters``' original length, where a top-level key does not reach.
q and k are rotated by HF's rotary class and ``apply_rotary_pos_emb`` and by posenc built
from the same config, at Qwen2-VL position ids of text, an image and text.
"""

from __future__ import annotations

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
    layout = posenc.hf.defaults.MROPE_CLASS[model_type]
    assert (mrope.interleaved, mrope.sections) == layout  # the class's, not the key's
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
