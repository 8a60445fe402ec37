"""``axial_from_hf`` and ``AxialRotaryEmbedding.from_hf`` against transformers' own vision
rotary classes and apply functions (class-default configs, no weights), and the config
keys read one by one.

HF's vision rotary takes (row, column) patch coordinates and returns ``cos``/``sin``; its
apply function rotates q and k. posenc's module must rotate the same q and k the same way:
Qwen's halves (``rotate_half``) and SAM's adjacent pairs (``rotate_pairwise``).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from posenc.hf import axial_from_hf
from posenc.torch import AxialRotaryEmbedding

transformers = pytest.importorskip("transformers")

H, W, HEADS = 5, 7, 2

# directory, rotary class, config class (module path, name), apply function, HF layout
CASES = {
    "qwen2_vl": ("Qwen2VLVisionRotaryEmbedding", "configuration_qwen2_vl.Qwen2VLVisionConfig",
                 "apply_rotary_pos_emb_vision", "half"),
    "mlcd": ("MLCDRotaryEmbedding", "configuration_mlcd.MLCDVisionConfig",
             "apply_rotary_pos_emb_vision", "half"),
    "sam2_video": ("Sam2VideoVisionRotaryEmbedding", "configuration_sam2_video.Sam2VideoConfig",
                   "apply_rotary_pos_emb_2d", "interleaved"),
    "sam3": ("Sam3ViTRotaryEmbedding", "configuration_sam3.Sam3ViTConfig",
             "apply_rotary_pos_emb_2d", "interleaved"),
}  # fmt: skip


def _hf(name):
    rot_name, cfg_path, apply_name, pairing = CASES[name]
    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    cfg_module, cfg_name = cfg_path.rsplit(".", 1)
    cfg_module = importlib.import_module(f"transformers.models.{name}.{cfg_module}")
    config = getattr(cfg_module, cfg_name)()
    return config, getattr(modeling, rot_name)(config), getattr(modeling, apply_name), pairing


@pytest.mark.parametrize("name", list(CASES))
def test_rotates_q_and_k_as_hf_vision_encoders_do(name):
    config, rot, apply, pairing = _hf(name)
    rows, cols = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    pos = torch.stack([rows, cols], -1).reshape(H * W, 2)  # (n, 2): (row, column)
    cos, sin = rot(torch.zeros(1), pos)  # (n, head_dim) or (1, n, head_dim)
    head_dim = cos.shape[-1]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, H * W, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, HEADS, H * W, head_dim, generator=g, dtype=torch.float64)
    if cos.dim() == 2:  # Qwen's layout: (n, heads, head_dim)
        want_q, want_k = apply(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)
        want_q, want_k = want_q.transpose(0, 1)[None], want_k.transpose(0, 1)[None]
    else:  # SAM's: (..., n, head_dim)
        want_q, want_k = apply(q, k, cos, sin)

    kwargs = axial_from_hf(config)
    assert kwargs["pairing"] == pairing and kwargs["head_dim"] == head_dim
    enc = AxialRotaryEmbedding.from_hf(config).double()
    got_q, got_k = enc.encode_qk(q, k, pos[None], pos[None])  # (1, heads, n, head_dim)
    # HF computes its angles in float32: agreement to float32 rounding of angles <= 7
    torch.testing.assert_close(got_q, want_q.double(), rtol=0, atol=2e-6)
    torch.testing.assert_close(got_k, want_k.double(), rtol=0, atol=2e-6)


def _cfg(**kw):
    return {"rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}, **kw}


def test_head_dim_from_each_key_hf_reads():
    want = {"head_dim": 24, "n_axes": 2, "base": 100.0, "pairing": "half", "max_len": 4096}
    assert axial_from_hf(_cfg(head_dim=24, embed_dim=64, num_heads=2)) == want
    assert axial_from_hf(_cfg(embed_dim=96, num_heads=4)) == want
    assert axial_from_hf(_cfg(hidden_size=48, num_attention_heads=2)) == want
    # HF's order: embed_dim before hidden_size, num_heads before num_attention_heads
    assert axial_from_hf(_cfg(embed_dim=96, hidden_size=8, num_heads=4,
                              num_attention_heads=1)) == want  # fmt: skip
    # the legacy key "type", and rope_theta's default
    legacy = {"rope_parameters": {"type": "axial"}, "head_dim": 24}
    assert axial_from_hf(legacy) == want | {"base": 10_000.0}


def test_sam_memory_attention_heads_are_downsampled():
    sam = {"memory_attention_hidden_size": 256, "memory_attention_downsample_rate": 2,
           "memory_attention_num_attention_heads": 4, "head_dim": 64}  # fmt: skip
    for model_type in ("sam2_video", "sam3_tracker_video", "edgetam_video"):
        got = axial_from_hf(_cfg(model_type=model_type, **sam))
        assert got["head_dim"] == 256 // (2 * 4) and got["pairing"] == "interleaved"
    got = axial_from_hf(_cfg(model_type="sam3_vit_model", **sam))  # not the memory attention
    assert got["head_dim"] == 64 and got["pairing"] == "interleaved"
    assert axial_from_hf(_cfg(model_type="qwen2_vl_vision", **sam))["pairing"] == "half"


@pytest.mark.parametrize(
    "config, match",
    [
        ({"rope_parameters": {"rope_type": "default"}, "head_dim": 8}, "rope_type 'axial'"),
        ({"head_dim": 8}, "rope_type 'axial'"),
        (_cfg(), "^config must give head_dim, or embed_dim/hidden_size and num_heads$"),
        (_cfg(embed_dim=64), "^config must give head_dim, or embed_dim/hidden_size and num_heads$"),
        (_cfg(num_heads=4), "^config must give head_dim, or embed_dim/hidden_size and num_heads$"),
        (_cfg(embed_dim=64.0, num_heads=4), "^embed_dim must be an integer"),
        (_cfg(embed_dim=-64, num_heads=4), "^embed_dim must be >= 1, got -64"),
        (_cfg(embed_dim=1, num_heads=1), "^head_dim must be >= 4, got 1"),
        (_cfg(embed_dim=64, num_heads=4.0), "^num_heads must be an integer"),
        (_cfg(embed_dim=64, num_heads=-4), "^num_heads must be >= 1, got -4"),
        (_cfg(head_dim=2), "^head_dim must be >= 4, got 2"),
        (_cfg(head_dim=-4), "^head_dim must be >= 4, got -4"),
        (_cfg(head_dim=10), "multiple of 4 for 2-D RoPE, got 10"),
        ({"rope_parameters": {"rope_type": "axial", "rope_theta": -1.0}, "head_dim": 8},
         "^rope_theta"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_by_name(config, match):
    with pytest.raises(ValueError, match=match):
        axial_from_hf(config)


def test_the_smallest_widths_are_accepted():
    assert axial_from_hf(_cfg(head_dim=4))["head_dim"] == 4
    assert axial_from_hf(_cfg(embed_dim=32, num_heads=1))["head_dim"] == 32
    assert axial_from_hf(_cfg(embed_dim=4, num_heads=1))["head_dim"] == 4


def test_the_module_takes_overrides():
    enc = AxialRotaryEmbedding.from_hf(_cfg(head_dim=8), max_len=16)
    assert enc.max_len == 16 and enc.head_dim == 8
