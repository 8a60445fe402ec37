"""Torch axial RoPE and M-RoPE, pinned against the float64 NumPy reference (posenc.rope_nd):
the constructor defaults (base, max_len, interleaved) and the arguments that reach the rates
(n_axes, base), the max_len boundary, the float32 table buffer, float64 keys at their own
positions or dtype, inplace rotation, meta-device tables, the exact refusals of forward,
encode_qk and table, and what MRoPE.from_hf reads from v4 and transformers-5 configs.
"""

import numpy as np
import pytest
import torch
from expect import raises_exactly

import posenc
from posenc.torch import AxialRotaryEmbedding, MRoPE, RotaryEmbedding


def _randn(*shape, seed, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _grid(h, w, shift=0):
    """(1, h * w, 2) int64 (row, column) coordinates, every coordinate + shift."""
    return torch.from_numpy(posenc.grid_positions(h, w))[None] + shift


def _want(x, pos, inv, axis, pairing="half"):
    """The NumPy float64 reference: x (b, h, seq, d) rotated at pos (b|1, seq, n_axes)."""
    return posenc.rope_nd(x.double().numpy(), pos.numpy()[:, None], inv, axis, pairing=pairing)


def _close(got, want, atol=1e-12):
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=atol)


# -- constructor defaults and arguments -------------------------------------------------------


def test_axial_defaults():
    enc = AxialRotaryEmbedding(8)
    assert enc.extra_repr() == "head_dim=8, n_axes=2, base=10000.0, pairing='half', max_len=1024"
    pos = torch.tensor([[[0, 1023], [1023, 5], [7, 300]]])  # the last row of the table is 1023
    q = _randn(1, 2, 3, 8, seed=0)
    inv, axis = posenc.axial_frequencies(8, 2, base=10_000.0)
    _close(enc(q, q, pos)[0], _want(q, pos, inv, axis))
    with raises_exactly("q_positions must be < max_len=1024, got 1024"):
        enc(q, q, torch.tensor([[[0, 1024], [0, 0], [0, 0]]]))


def test_axial_n_axes_and_base_reach_the_rates():
    enc = AxialRotaryEmbedding(12, n_axes=3, base=100.0, max_len=8)
    pos = torch.tensor([[[1, 2, 3], [4, 0, 6], [7, 5, 0], [2, 7, 1]]])
    q = _randn(1, 1, 4, 12, seed=1)
    inv, axis = posenc.axial_frequencies(12, 3, base=100.0)
    np.testing.assert_array_equal(axis, [0, 0, 1, 1, 2, 2])
    _close(enc(q, q, pos)[0], _want(q, pos, inv, axis))


def test_mrope_defaults():
    enc = MRoPE(16, sections=(2, 3, 3))
    assert enc.extra_repr() == (
        "head_dim=16, rotary_dim=16, sections=(2, 3, 3), base=10000.0, interleaved=False, "
        "pairing='half', max_len=4096"
    )
    pos = torch.tensor([[[4095, 1, 2], [3, 4095, 0], [9, 8, 4095]]])
    q = _randn(1, 1, 3, 16, seed=2)
    inv, axis = posenc.mrope_frequencies(16, (2, 3, 3), base=10_000.0, interleaved=False)
    _close(enc(q, q, pos)[0], _want(q, pos, inv, axis))
    with raises_exactly("q_positions must be < max_len=4096, got 4096"):
        enc(q, q, pos + 1)


def test_max_len_boundary():
    enc = AxialRotaryEmbedding(4, max_len=1)  # the smallest table: coordinate 0 only
    q = _randn(1, 1, 1, 4, seed=3)
    _close(enc(q, q, torch.zeros(1, 1, 2, dtype=torch.long))[0], q.numpy(), atol=0)
    with raises_exactly("q_positions must be < max_len=1, got 1"):
        enc(q, q, torch.ones(1, 1, 2, dtype=torch.long))
    with raises_exactly("max_len must be >= 1, got 0"):
        AxialRotaryEmbedding(4, max_len=0)
    with raises_exactly("max_len must be >= 1, got 0"):
        MRoPE(6, sections=(1, 1, 1), max_len=0)
    with raises_exactly("head_dim must be even, got 7"):
        MRoPE(7, sections=(1, 1, 1))
    with raises_exactly("max_len must be an integer, got 1.5"):
        AxialRotaryEmbedding(4, max_len=1.5)


def test_table_buffer_is_float32_cos_sin():
    enc = MRoPE(8, sections=(1, 2, 1), base=100.0, max_len=5)
    inv, _ = posenc.mrope_frequencies(8, (1, 2, 1), base=100.0)
    angles = np.arange(5.0)[:, None] * inv  # float64 angles, rounded once to float32
    want = np.stack([np.cos(angles), np.sin(angles)], -1).astype(np.float32)
    assert enc.cos_sin.dtype == torch.float32
    np.testing.assert_array_equal(enc.cos_sin.numpy(), want)


# -- encode_qk ---------------------------------------------------------------------------------


def test_keys_at_own_positions_get_float64_table():
    enc = MRoPE(12, sections=(2, 2, 2), max_len=16)
    inv, axis = posenc.mrope_frequencies(12, (2, 2, 2))
    q_pos = torch.tensor([[[0, 0, 0], [1, 2, 3], [4, 4, 1]]])
    k_pos = torch.tensor([[[9, 3, 5], [2, 15, 7], [13, 1, 11], [6, 6, 6]]])
    q, k = _randn(1, 2, 3, 12, seed=4), _randn(1, 1, 4, 12, seed=5)
    qr, kr = enc.encode_qk(q, k, q_pos, k_pos)
    _close(qr, _want(q, q_pos, inv, axis))
    _close(kr, _want(k, k_pos, inv, axis))


def test_keys_of_other_dtype_get_their_own_table():
    # shared positions, float32 q and float64 k: k is rotated with the float64 table
    enc = AxialRotaryEmbedding(8, pairing="interleaved", max_len=16)
    inv, axis = posenc.axial_frequencies(8, 2)
    pos = _grid(3, 4, shift=9)
    q, k = _randn(1, 2, 12, 8, seed=6), _randn(1, 1, 12, 8, seed=7)
    qr, kr = enc.encode_qk(q.float(), k, pos, pos)
    assert (qr.dtype, kr.dtype) == (torch.float32, torch.float64)
    _close(kr, _want(k, pos, inv, axis, "interleaved"))
    _close(qr, _want(q.float(), pos, inv, axis, "interleaved"), atol=2e-6)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_inplace_writes_into_q_and_k(pairing):
    enc = AxialRotaryEmbedding(8, pairing=pairing, max_len=8)
    inv, axis = posenc.axial_frequencies(8, 2)
    pos = _grid(2, 3, shift=1)
    q, k = _randn(1, 2, 6, 8, seed=8), _randn(1, 1, 6, 8, seed=9)
    want_q, want_k = _want(q, pos, inv, axis, pairing), _want(k, pos, inv, axis, pairing)
    qr, kr = enc.encode_qk(q, k, pos, pos, inplace=True)
    assert qr is q and kr is k
    _close(q, want_q)
    _close(k, want_k)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_meta_module_rotates_meta_tensors(dtype):
    # a module built on meta computes its tables there: shapes without values
    with torch.device("meta"):
        enc = MRoPE(12, sections=(2, 2, 2), max_len=8)
    q = torch.empty(2, 2, 3, 12, dtype=dtype, device="meta")
    k = torch.empty(2, 1, 3, 12, dtype=dtype, device="meta")
    grid = torch.tensor([[[0, 1, 2], [3, 4, 5], [6, 7, 0]]])  # CPU coordinates, checked
    for qp, kp in ((range(3), range(3)), (grid, grid), (range(2, 5), grid)):
        for got, like in zip(enc.encode_qk(q, k, qp, kp), (q, k), strict=True):
            assert (got.device.type, got.dtype, got.shape) == ("meta", dtype, like.shape)
        cs = enc.table(qp, dtype)
        assert (cs.device.type, cs.shape) == ("meta", (1, 3, 6, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_module_takes_cpu_grid_positions():
    # the coordinates are moved to the table's device before the per-axis gather
    enc = MRoPE(12, sections=(2, 2, 2), max_len=8)
    pos = torch.tensor([[[0, 1, 2], [3, 4, 5], [6, 7, 0]]])
    q = _randn(1, 2, 3, 12, seed=10, dtype=torch.float32)
    want = enc(q, q, pos)
    got = enc.to("cuda")(q.cuda(), q.cuda(), pos)
    for a, b in zip(got, want, strict=True):
        assert a.device.type == "cuda"
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


# -- refusals ----------------------------------------------------------------------------------


def test_wrong_number_of_axes_refused_exactly():
    enc = MRoPE(12, sections=(2, 2, 2), max_len=8)
    q = torch.zeros(1, 1, 3, 12)
    two = torch.zeros(1, 3, 2, dtype=torch.long)
    msg = "positions must have n_axes=3 coordinates, got shape (1, 3, 2)"
    with raises_exactly(f"q_{msg}"):  # the hooks name the argument
        enc.encode_qk(q, q, two, two)
    with raises_exactly(f"k_{msg}"):
        enc.encode_qk(q, q, range(3), two)
    with raises_exactly(msg):
        enc.table(two)
    with raises_exactly(
        "positions must have shape (seq,) or (batch, seq) = (1, 3), "
        "or (batch, seq, n_axes=3) coordinates, got (1, 3, 2)"
    ):
        enc(q, q, two)


def test_hooks_of_two_axes_and_of_one_refuse_coordinates_exactly():
    # two axes given three coordinates: named (not read as a grid); one axis given a
    # (batch, seq, 2) tensor: the 1-D hook's own message, it takes no coordinates at all
    axial, q = AxialRotaryEmbedding(8, n_axes=2, max_len=16), torch.zeros(1, 2, 4, 8)
    three = torch.zeros(1, 4, 3, dtype=torch.long)
    with raises_exactly("q_positions must have n_axes=2 coordinates, got shape (1, 4, 3)"):
        axial.encode_qk(q, q, three, three)
    two = torch.zeros(1, 4, 2, dtype=torch.long)
    with raises_exactly(
        "q_positions must be a range of 4 or have shape (batch|1, seq) with batch 1 and seq 4, "
        "got (1, 4, 2)"
    ):
        RotaryEmbedding(8).encode_qk(q, q, two, two)


def test_forward_refuses_q_k_shapes_exactly():
    enc = AxialRotaryEmbedding(12, max_len=16)
    a = torch.zeros(1, 1, 3, 12)
    b = torch.zeros(1, 1, 4, 12)
    with raises_exactly(
        "q and k must be 4-D with the same seq, got (1, 1, 3, 12) and (1, 1, 4, 12)"
    ):
        enc(a, b)
    # 3-D q or k whose dim 2 happens to equal the other's seq (12 == 12)
    sq, flat = torch.zeros(1, 1, 12, 12), torch.zeros(1, 12, 12)
    with raises_exactly(
        "q and k must be 4-D with the same seq, got (1, 1, 12, 12) and (1, 12, 12)"
    ):
        enc(sq, flat)
    with raises_exactly(
        "q and k must be 4-D with the same seq, got (1, 12, 12) and (1, 1, 12, 12)"
    ):
        enc(flat, sq)


# -- MRoPE.from_hf -----------------------------------------------------------------------------


def test_from_hf_v4_rope_scaling_with_top_level_theta():
    cfg = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 1e6,
        "max_position_embeddings": 256,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    enc = MRoPE.from_hf(cfg)
    assert enc.extra_repr() == (
        "head_dim=16, rotary_dim=16, sections=(2, 3, 3), base=1000000.0, interleaved=False, "
        "pairing='half', max_len=256"
    )


def test_from_hf_v5_rope_parameters_and_head_dim():
    cfg = {
        "hidden_size": 64,
        "num_attention_heads": 2,  # 64 // 2 = 32, but head_dim says 16
        "head_dim": 16,
        "rope_theta": 7.0,  # rope_parameters' theta wins
        "rope_parameters": {
            "rope_type": "mrope",
            "rope_theta": 500.0,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
    }
    enc = MRoPE.from_hf(cfg)
    assert enc.extra_repr() == (
        "head_dim=16, rotary_dim=16, sections=(3, 3, 2), base=500.0, interleaved=True, "
        "pairing='half', max_len=4096"
    )


def test_from_hf_defaults_when_the_config_is_silent():
    cfg = {
        "hidden_size": 16,
        "num_attention_heads": 1,
        "rope_parameters": {"mrope_section": [3, 5]},
    }
    enc = MRoPE.from_hf(cfg)
    assert enc.extra_repr() == (
        "head_dim=16, rotary_dim=16, sections=(3, 5), base=10000.0, interleaved=False, "
        "pairing='half', max_len=4096"
    )


@pytest.mark.parametrize("key", ["rope_type", "type"])
def test_from_hf_refuses_scaled_rope_exactly(key):
    params = {key: "yarn", "mrope_section": [2, 3, 3], "factor": 2.0}
    cfg = {"hidden_size": 16, "num_attention_heads": 1, "rope_scaling": params}
    with raises_exactly(f"config must give an unscaled rope with mrope_section, got {params}"):
        MRoPE.from_hf(cfg)


def test_from_hf_reads_config_objects_and_refuses_others():
    class Config:  # duck-typed transformers PretrainedConfig
        def to_dict(self):
            return {"hidden_size": 8, "num_attention_heads": 1, "rope_scaling": {
                "rope_type": "default", "mrope_section": [1, 1, 2]}}  # fmt: skip

    assert MRoPE.from_hf(Config()).sections == (1, 1, 2)
    with raises_exactly("config must be a dict or a transformers config, got 42"):
        MRoPE.from_hf(42)
