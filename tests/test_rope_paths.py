"""Every RoPE code path against the NumPy reference, and the limits of the tables.

The torch RoPE has several kernels chosen by dtype, pairing, strides, size and whether
autograd records; a bug in one of them (a sign, a swapped table) hides if only the
common path is compared. Each case below names the path it forces.
"""

import numpy as np
import pytest
import torch

import posenc
from posenc.scaling import DynamicNTK, LongRoPE, YaRN
from posenc.torch import RotaryEmbedding, apply_rope
from posenc.torch.kernels import rope_eager as kernels

HD = 16


def _inputs(dtype, strided, seq=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    if strided:  # a view with an odd storage offset: no complex view possible
        return torch.randn(2, 3, seq, HD + 1, generator=g, dtype=torch.float64)[..., 1:].to(dtype)
    return torch.randn(2, 3, seq, HD, generator=g, dtype=torch.float64).to(dtype)


PATHS = ["expression", "eager out", "eager in place", "blocked", "blocked in place"]


def _run(rot, x, pos, path, monkeypatch):
    if path.startswith("blocked"):
        monkeypatch.setattr(kernels, "_BLOCK", 64)  # force the blocked loop on small tensors
    if path == "expression":
        return rot.encode_qk(x.clone().requires_grad_(), x, pos, pos)[0].detach()
    if path in ("eager in place", "blocked in place"):
        q = x.clone()
        with torch.no_grad():
            out = rot.encode_qk(q, x.clone(), pos, pos, inplace=True)[0]
        assert out.data_ptr() == q.data_ptr()
        return out
    with torch.no_grad():
        return rot.encode_qk(x, x, pos, pos)[0]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 10])
@pytest.mark.parametrize("per_row", [False, True])
def test_every_path_matches_numpy(path, pairing, dtype, strided, rotary_dim, per_row, monkeypatch):
    x = _inputs(dtype, strided)
    rot = RotaryEmbedding(HD, pairing=pairing, rotary_dim=rotary_dim, max_len=64).to(dtype)
    if per_row:
        pos = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13], [0, 0, 0, 0, 1, 2, 3, 4, 5]])
        np_pos = pos.numpy()[:, None, :]
    else:
        pos, np_pos = range(40, 49), np.arange(40, 49)
    got = _run(rot, x, pos, path, monkeypatch)
    ref = posenc.rope(x.double().numpy(), np_pos, pairing=pairing, rotary_dim=rotary_dim)
    atol = 1e-12 if dtype == torch.float64 else 2e-6
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=0, atol=atol)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_queries_and_keys_use_their_own_positions(pairing):
    rot = RotaryEmbedding(HD, pairing=pairing, max_len=64)
    q, k = torch.randn(2, 1, 2, 5, HD).unbind(0)
    qp, kp = torch.tensor([[30, 31, 32, 33, 34]]), torch.tensor([[0, 7, 14, 21, 28]])
    with torch.no_grad():
        qr, kr = rot.encode_qk(q, k, qp, kp)
    for got, x, p in ((qr, q, qp), (kr, k, kp)):
        ref = posenc.rope(x.double().numpy(), p.numpy()[0], pairing=pairing)
        np.testing.assert_allclose(got.double().numpy(), ref, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_max_len_is_the_first_position_refused(dtype):
    rot = RotaryEmbedding(HD, max_len=10).to(dtype)
    x = torch.ones(1, 1, 10, HD, dtype=dtype)
    rot(x, x)  # positions 0 .. 9: fine
    rot(x[:, :, :1], x[:, :, :1], torch.tensor([9]))
    for positions in (torch.tensor([10]), range(10, 11)):
        with pytest.raises(ValueError, match="positions must be < max_len=10, got 10"):
            rot(x[:, :, :1], x[:, :, :1], positions)
    with pytest.raises(ValueError, match="positions must be < max_len=10, got 10"):
        rot(torch.ones(1, 1, 11, HD, dtype=dtype), torch.ones(1, 1, 11, HD, dtype=dtype))


def test_length_dependent_scalings_read_the_largest_position_not_the_count():
    x = torch.randn(1, 2, 4, HD, dtype=torch.float64)
    pos = torch.tensor([100, 101, 102, 103])  # 4 tokens, but the sequence is 104 long
    for scaling in (DynamicNTK(4.0, 16), LongRoPE((1.0,) * 8, (3.0,) * 8, 50, 4.0)):
        ref = posenc.rope(x.numpy(), pos.numpy(), scaling=scaling)  # seq_len = 104
        got = apply_rope(x, pos, scaling=scaling)
        np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-12)
        rot = RotaryEmbedding(HD, scaling=scaling, max_len=128).double()
        np.testing.assert_allclose(rot(x, x, pos)[0].numpy(), ref, rtol=0, atol=1e-12)
        short = posenc.rope(x.numpy(), pos.numpy(), scaling=scaling, seq_len=4)
        assert np.abs(ref - short).max() > 1e-3  # the length matters here


def test_longrope_switches_only_past_the_original_length():
    # HF (Phi-3): long factors when seq_len > original_max_position_embeddings
    lr = LongRoPE((1.0,) * 8, (3.0,) * 8, 50, 4.0)
    short, _ = posenc.rope_frequencies(HD, scaling=lr, seq_len=50)
    long, _ = posenc.rope_frequencies(HD, scaling=lr, seq_len=51)
    default, _ = posenc.rope_frequencies(HD)
    np.testing.assert_allclose(short, default)
    np.testing.assert_allclose(long, default / 3)


def test_scaled_tables_carry_the_attention_scale():
    yarn = YaRN(4.0, 32)
    _, scale = posenc.rope_frequencies(HD, scaling=yarn)
    assert scale == pytest.approx(0.1 * np.log(4.0) + 1)
    rot = RotaryEmbedding(HD, scaling=yarn, max_len=64)
    x = torch.randn(1, 1, 5, HD)
    with torch.no_grad():
        norms = rot(x, x)[0].norm(dim=-1) / x.norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, scale))
