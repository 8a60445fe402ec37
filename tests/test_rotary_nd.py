"""Positions beyond a line, NumPy reference: 2-D sin-cos, axial RoPE, M-RoPE and its ids.

Parity: MAE's ``get_2d_sincos_pos_embed`` formula (golden values written out below),
rotary-embedding-torch 0.9.1's ``get_axial_freqs`` + ``apply_rotary_emb``, and HF
transformers' Qwen2-VL (``Qwen2VLModel.get_rope_index``, ``Qwen2VLRotaryEmbedding`` with
``mrope_section``) and Qwen3-VL (interleaved sections). The HF and rotary-embedding-torch
references compute angles in float32, hence the 1e-5 bounds against our float64.
"""

import math

import numpy as np
import pytest
import torch

import posenc

RNG = np.random.default_rng(0)


# -- 2-D sin-cos (MAE) ------------------------------------------------------------------------


def test_sinusoidal_2d_golden_values():
    # MAE util/pos_embed.py: get_2d_sincos_pos_embed(embed_dim=8, grid_size) with
    # omega_i = 1 / 10000**(i / 2), i < 2, so omega = (1, 0.01); the first half encodes
    # grid[0] of meshgrid(grid_w, grid_h), i.e. the column. Row 1, column 2 of a 2x3 grid
    # is token 5: [sin 2, sin .02, cos 2, cos .02, sin 1, sin .01, cos 1, cos .01].
    golden_5 = [
        0.9092974268256817, 0.01999866669333308, -0.4161468365471424, 0.9998000066665778,
        0.8414709848078965, 0.009999833334166664, 0.5403023058681398, 0.9999500004166653,
    ]  # fmt: skip
    # row 0, column 1 (token 1): the column half at 1, the row half at 0
    golden_1 = [0.8414709848078965, 0.009999833334166664, 0.5403023058681398,
                0.9999500004166653, 0.0, 0.0, 1.0, 1.0]  # fmt: skip
    table = posenc.sinusoidal_2d(2, 3, 8)
    assert table.shape == (6, 8)
    np.testing.assert_allclose(table[5], golden_5, rtol=0, atol=1e-15)
    np.testing.assert_allclose(table[1], golden_1, rtol=0, atol=1e-15)


def test_sinusoidal_2d_halves_are_1d_tables_of_column_and_row():
    h, w, dim = 5, 7, 32
    table = posenc.sinusoidal_2d(h, w, dim)
    coords = posenc.grid_positions(h, w)
    one_d = posenc.sinusoidal(max(h, w), dim // 2)  # interleaved (sin, cos) pairs
    as_mae = np.concatenate([one_d[:, 0::2], one_d[:, 1::2]], -1)  # [sin block, cos block]
    np.testing.assert_allclose(table[:, : dim // 2], as_mae[coords[:, 1]], atol=1e-15)
    np.testing.assert_allclose(table[:, dim // 2 :], as_mae[coords[:, 0]], atol=1e-15)


@pytest.mark.parametrize("dim", [6, 2, 0, 4.0])
def test_sinusoidal_2d_bad_dim(dim):
    with pytest.raises(ValueError, match="dim"):
        posenc.sinusoidal_2d(2, 2, dim)


def test_grid_positions_row_major():
    c = posenc.grid_positions(2, 3, 4)
    assert c.shape == (24, 3) and c.dtype == np.int64
    np.testing.assert_array_equal(c[23], [1, 2, 3])
    np.testing.assert_array_equal(c[1 * 12 + 2 * 4 + 1], [1, 2, 1])
    with pytest.raises(ValueError, match="shape"):
        posenc.grid_positions(2, 0)


# -- axial RoPE vs rotary-embedding-torch -----------------------------------------------------


@pytest.mark.parametrize("freqs_for", ["lang", "pixel"])
def test_axial_rope_matches_rotary_embedding_torch(freqs_for):
    ret = pytest.importorskip("rotary_embedding_torch")
    per_axis, h, w = 16, 5, 7
    ref_rope = ret.RotaryEmbedding(per_axis, freqs_for=freqs_for, max_freq=10)
    freqs = ref_rope.get_axial_freqs(h, w)  # (h, w, 2 * per_axis), angles repeated per pair
    x = RNG.standard_normal((h, w, 2 * per_axis))
    want = ret.apply_rotary_emb(freqs, torch.from_numpy(x)).numpy().reshape(h * w, -1)
    coords = posenc.grid_positions(h, w).astype(np.float64)  # (seq, 2) integer (row, col)
    if freqs_for == "pixel":  # rotary-embedding-torch's pixel coordinates: linspace(-1, 1)
        coords = coords / [h - 1, w - 1] * 2 - 1
    inv, axis = posenc.axial_frequencies(2 * per_axis, 2, freqs_for=freqs_for, max_freq=10)
    np.testing.assert_allclose(
        coords[:, axis] * inv, freqs.reshape(h * w, -1)[:, 0::2].numpy(), rtol=1e-6, atol=1e-6
    )
    got = posenc.rope_nd(x.reshape(h * w, -1), coords, inv, axis, pairing="interleaved")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_axial_scores_depend_on_2d_offset_only():
    inv, axis = posenc.axial_frequencies(16, 2)
    q, k = RNG.standard_normal((2, 16))
    pts = np.array([[0, 0], [3, 5], [2, 1], [5, 6]])  # (4, 2)
    qr = posenc.rope_nd(np.repeat(q[None], 4, 0), pts, inv, axis)
    kr = posenc.rope_nd(np.repeat(k[None], 4, 0), pts, inv, axis)
    # (3, 5) - (0, 0) == (5, 6) - (2, 1): the same score
    assert qr[1] @ kr[0] == pytest.approx(qr[3] @ kr[2], abs=1e-12)
    # row and column are not interchangeable: (5, 3) - (0, 0) scores differently
    qs = posenc.rope_nd(q[None], [[5, 3]], inv, axis)[0]
    assert abs(qs @ kr[0] - qr[1] @ kr[0]) > 1e-3


def test_axial_frequencies_checks():
    with pytest.raises(ValueError, match="head_dim"):
        posenc.axial_frequencies(10, 2)
    with pytest.raises(ValueError, match="freqs_for"):
        posenc.axial_frequencies(8, 2, freqs_for="audio")
    with pytest.raises(ValueError, match="axis"):
        posenc.rope_nd(np.ones((1, 8)), [[0, 1]], *posenc.axial_frequencies(8, 4))


# -- M-RoPE vs HF Qwen2-VL / Qwen3-VL ----------------------------------------------------------

IMAGE, VIDEO, START = 60, 61, 62
# text, <vision_start>, a 4x6 image (merge 2: 2x3 tokens), text, <vision_start>, a 3-frame 4x4
# video (3x2x2 tokens, more frames than rows: the case where HF 5.x and Qwen2-VL's original
# resume rule differ), text
SEGMENTS = [3, (1, 4, 6), 3, (3, 4, 4), 2]


def _hf_qwen2vl(sections=(4, 6, 6), head_dim=32):
    transformers = pytest.importorskip("transformers")
    text = dict(
        hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=16, num_hidden_layers=1, vocab_size=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                         "mrope_section": list(sections)},
    )  # fmt: skip
    vision = dict(depth=1, embed_dim=16, hidden_size=2 * head_dim, num_heads=2,
                  spatial_merge_size=2)  # fmt: skip
    cfg = transformers.Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
        vision_start_token_id=START, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return cfg


def _hf_sequence():
    """input_ids and mm_token_type_ids of SEGMENTS (each text run ends with vision_start)."""
    ids, types, grids = [], [], {IMAGE: [], VIDEO: []}
    for seg in SEGMENTS:
        if isinstance(seg, int):
            ids += [1] * (seg - 1) + [START]
            types += [0] * seg
        else:
            tok = IMAGE if seg[0] == 1 else VIDEO
            n = seg[0] * seg[1] * seg[2] // 4
            ids += [tok] * n
            types += [1 if tok == IMAGE else 2] * n
            grids[tok].append(seg)
    ids[-1] = 2  # the last text token is plain text
    return torch.tensor([ids]), torch.tensor([types]), grids


def test_mrope_positions_match_qwen2vl_get_rope_index():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    cfg = _hf_qwen2vl()
    torch.manual_seed(0)
    model = Qwen2VLModel(cfg).eval()
    ids, types, grids = _hf_sequence()
    want, delta = model.get_rope_index(
        ids, types, image_grid_thw=torch.tensor(grids[IMAGE]),
        video_grid_thw=torch.tensor(grids[VIDEO]),
    )  # fmt: skip
    got = posenc.mrope_positions(SEGMENTS, spatial_merge=2)  # (seq, 3)
    np.testing.assert_array_equal(got, want[:, 0].T.numpy())
    # the image (rows 3..8 at t=3) sits in a 2x3 grid, then text resumes at 3 + max(2, 3) = 6
    np.testing.assert_array_equal(got[3:9].T, [[3] * 6, [3, 3, 3, 4, 4, 4], [3, 4, 5] * 2])
    np.testing.assert_array_equal(got[9], [6, 6, 6])
    # decoding continues from the largest position + 1 (HF's rope_deltas)
    assert got.max() + 1 == len(got) + int(delta)


def test_mrope_rotation_matches_qwen2vl_rotary_embedding():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    sections, head_dim = (4, 6, 6), 32
    cfg = _hf_qwen2vl(sections, head_dim)
    pos = posenc.mrope_positions(SEGMENTS, spatial_merge=2)  # (seq, 3)
    seq = len(pos)
    q = torch.randn(1, 2, seq, head_dim, generator=torch.Generator().manual_seed(1))
    k = torch.randn(1, 1, seq, head_dim, generator=torch.Generator().manual_seed(2))
    hf_rope = Qwen2VLRotaryEmbedding(cfg.text_config)
    cos, sin = hf_rope(q, torch.from_numpy(pos).T[:, None])  # position ids (3, batch, seq)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    inv, axis = posenc.mrope_frequencies(head_dim, sections, base=1e6)
    np.testing.assert_allclose(inv, hf_rope.inv_freq.double().numpy(), rtol=1e-6)
    got_q = posenc.rope_nd(q.double().numpy(), pos, inv, axis)
    got_k = posenc.rope_nd(k.double().numpy(), pos, inv, axis)
    np.testing.assert_allclose(got_q, want_q.double().numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(got_k, want_k.double().numpy(), rtol=0, atol=1e-5)


def test_interleaved_mrope_matches_qwen3vl():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    sections, head_dim = (7, 4, 5), 32  # pair 13 is past h's 4 pairs: it goes to t
    cfg = transformers.Qwen3VLTextConfig(
        hidden_size=64, num_attention_heads=2, head_dim=head_dim, vocab_size=64,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                         "mrope_section": list(sections), "mrope_interleaved": True},
    )  # fmt: skip
    pos = posenc.mrope_positions(SEGMENTS, spatial_merge=2)
    x = torch.randn(1, 1, len(pos), head_dim, generator=torch.Generator().manual_seed(3))
    cos, sin = Qwen3VLTextRotaryEmbedding(cfg)(x, torch.from_numpy(pos).T[:, None])
    inv, axis = posenc.mrope_frequencies(head_dim, sections, base=5e6, interleaved=True)
    angles = pos[:, axis] * inv  # (seq, 16)
    np.testing.assert_allclose(np.cos(angles), cos[0, :, :16].double().numpy(), atol=1e-5)
    np.testing.assert_allclose(np.sin(angles), sin[0, :, 16:].double().numpy(), atol=1e-5)


def test_mrope_on_text_is_1d_rope():
    x = RNG.standard_normal((2, 9, 24))
    p = np.arange(4, 13)
    inv, axis = posenc.mrope_frequencies(24, (4, 4, 4), base=1e6)
    diag = np.repeat(p[:, None], 3, 1)  # (seq, 3): text tokens at (p, p, p)
    want = posenc.rope(x, p, base=1e6)
    np.testing.assert_allclose(posenc.rope_nd(x, diag, inv, axis), want, atol=1e-13)
    np.testing.assert_array_equal(posenc.mrope_positions([9], start=4), diag)


def test_mrope_sections_checks():
    with pytest.raises(ValueError, match="sections"):
        posenc.mrope_frequencies(32, (4, 6, 5))
    with pytest.raises(ValueError, match="sections"):
        posenc.mrope_frequencies(32, (4, 6, 6), interleaved=True)  # w has more pairs than t
    with pytest.raises(ValueError, match="spatial_merge"):
        posenc.mrope_positions([(1, 3, 4)], spatial_merge=2)
    with pytest.raises(ValueError, match="segments"):
        posenc.mrope_positions([2, (1, 2)])
    assert math.isclose(posenc.mrope_frequencies(8, (2, 1, 1))[0][1], 1e4**-0.25)
