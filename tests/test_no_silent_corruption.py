"""Moves, casts, meta-device init, checkpoints and low precision leave the numbers right.

Each test compares against an independent value (the NumPy reference or a module that
was never moved) and fails on the main branch before the "core fit for real models" work.
"""

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    LearnedEncoding,
    MultiHeadAttention,
    NoPE,
    PoPE,
    RotaryEmbedding,
    SinusoidalEncoding,
    T5RelativeBias,
    TransformerLM,
    XPos,
    apply_rope,
)

safetensors_torch = pytest.importorskip("safetensors.torch")

MOVES = {
    "to(float32)": lambda m: m.to(torch.float32),
    "to(cpu, float32)": lambda m: m.to("cpu", torch.float32),
    "to(float64)": lambda m: m.to(torch.float64),
    "half()": lambda m: m.half(),
    "bfloat16()": lambda m: m.bfloat16(),
    "double()": lambda m: m.double(),
    "float()": lambda m: m.half().float(),
}


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("move", list(MOVES))
def test_rope_tables_survive_dtype_moves(pairing, move):
    rot = MOVES[move](RotaryEmbedding(16, pairing=pairing, max_len=64))
    assert rot.cos_sin.dtype == torch.float32  # derived state keeps its own dtype
    x = torch.randn(2, 3, 40, 16, generator=torch.Generator().manual_seed(0))
    ref = posenc.rope(x.double().numpy(), np.arange(40), pairing=pairing)
    with torch.no_grad():
        for got in (*rot(x, x), *rot.rope(x, x), rot.encode_qk(x, x, range(40), range(40))[0]):
            np.testing.assert_allclose(got.double().numpy(), ref, rtol=0, atol=2e-6)


@pytest.mark.parametrize("move", list(MOVES))
def test_sinusoidal_table_survives_dtype_moves(move):
    pe = MOVES[move](SinusoidalEncoding(8, max_len=300))
    assert pe.table.dtype == torch.float64
    got = pe(torch.zeros(1, 300, 8, dtype=torch.float64))[0].numpy()
    np.testing.assert_array_equal(got, posenc.sinusoidal(300, 8))


ENCODINGS = {
    "nope": NoPE,
    "sinusoidal": lambda: SinusoidalEncoding(16, max_len=32),
    "learned": lambda: LearnedEncoding(32, 16),
    "rope_half": lambda: RotaryEmbedding(4, max_len=32),
    "rope_interleaved": lambda: RotaryEmbedding(4, pairing="interleaved", max_len=32),
    "xpos": lambda: XPos(4, max_len=32),
    "alibi": lambda: ALiBi(4),
    "t5": lambda: T5RelativeBias(4, num_buckets=8, max_distance=16),
    "kerple": lambda: KERPLE(4, variant="power"),
    "fire": lambda: FIRE(4, hidden=8),
    "pope": lambda: PoPE(4, 4, delta_init="uniform"),
}


def _lm(name):
    return TransformerLM(11, 16, 2, 4, kv_heads=2, encoding=ENCODINGS[name]())


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_meta_device_init_then_to_empty_and_load_state_dict(name):
    torch.manual_seed(0)
    trained = _lm(name).eval()
    with torch.device("meta"):
        lm = _lm(name)
    assert all(p.is_meta for p in lm.parameters())
    lm = lm.to_empty(device="cpu")
    lm.load_state_dict(trained.state_dict())  # no other call: derived tables must be right
    lm.eval()
    idx = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(lm(idx), trained(idx), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_state_dict_keys_unique_no_derived_tables_and_safetensors_round_trip(name, tmp_path):
    torch.manual_seed(1)
    lm = _lm(name).eval()
    sd = lm.state_dict()
    ptrs = [t.data_ptr() for t in sd.values()]
    assert len(set(ptrs)) == len(ptrs)  # no tensor saved twice (a shared encoding once)
    derived = ("cos_sin", "encoding.table", "slopes", "bucket", "log_zeta")
    assert not [k for k in sd if k.endswith(derived)]  # derived: never saved
    assert not [k for k in sd if ".attn.encoding" in k]  # the model owns its encoding
    assert lm.blocks[0].attn.encoding is lm.encoding and lm.blocks[1].attn.encoding is lm.encoding
    path = tmp_path / "lm.safetensors"
    safetensors_torch.save_file(sd, str(path))
    torch.manual_seed(2)
    fresh = _lm(name).eval()
    fresh.load_state_dict(safetensors_torch.load_file(str(path)))
    idx = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        torch.testing.assert_close(fresh(idx), lm(idx), rtol=0, atol=0)


def test_a_table_in_a_checkpoint_is_refused_not_loaded():
    lm = TransformerLM(11, 16, 1, 4, encoding=SinusoidalEncoding(16, max_len=32))
    sd = lm.state_dict() | {"encoding.table": torch.zeros(32, 16, dtype=torch.float64)}
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "encoding.table"'):
        lm.load_state_dict(sd)


def _pair_radius(x, pairing):
    """|(x_a, x_b)| of the pair each element belongs to, same shape as ``x``."""
    h = x.shape[-1] // 2
    if pairing == "half":
        r = np.hypot(x[..., :h], x[..., h:])
        return np.concatenate([r, r], -1)
    return np.repeat(np.hypot(x[..., 0::2], x[..., 1::2]), 2, -1)


def _check_rounded_once(got, exact, pairing):
    """``got`` is ``exact`` (float64) rounded once, up to float32 arithmetic.

    Rounding once errs by at most half a spacing of the low-precision format at |exact|;
    float32 arithmetic adds a few float32 epsilons of the pair's radius. Rounding cos/sin
    to bfloat16 first (the old behaviour) errs by ~2**-8 of the radius.
    """
    dtype = got.dtype
    got, exact64 = got.double().numpy(), exact
    mag = np.maximum(np.abs(exact64), torch.finfo(dtype).tiny)
    spacing = torch.finfo(dtype).eps * 2.0 ** np.floor(np.log2(mag))
    bound = 0.5 * spacing + 8 * 2.0**-24 * _pair_radius(exact64, pairing)
    assert (np.abs(got - exact64) <= bound).all()
    rounded = torch.from_numpy(exact64).to(dtype).double().numpy()
    assert (got != rounded).mean() < 2e-3  # almost every element is the rounded exact value


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("size", ["small", "large"])  # large: the blocked kernel
def test_low_precision_is_rotated_in_float32_and_rounded_once(dtype, pairing, size):
    seq = 64 if size == "small" else 1024
    x = torch.randn(2, 8, seq, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    pos = 1000 + torch.arange(seq)  # large angles: float32 cos/sin, float64 angles
    exact = posenc.rope(x.double().numpy(), pos.numpy(), pairing=pairing)  # float64
    rot = RotaryEmbedding(64, pairing=pairing, max_len=1000 + seq).to(dtype)
    q, k = x.clone(), x.clone()
    with torch.no_grad():
        candidates = {
            "apply_rope": apply_rope(x, pos, pairing=pairing),
            "module": rot(x, x, pos)[0],
            "in place": rot.encode_qk(q, k, pos[None], pos[None], inplace=True)[0],
            "out=": rot.rope(x, x, pos, out=(torch.empty_like(x), torch.empty_like(x)))[0],
        }
    candidates["autograd"] = apply_rope(x.requires_grad_(), pos, pairing=pairing).detach()
    assert candidates["in place"].data_ptr() == q.data_ptr()
    for got in candidates.values():
        assert got.dtype == dtype
        _check_rounded_once(got, exact, pairing)


def test_every_module_is_callable():
    x = torch.randn(1, 5, 8)
    torch.testing.assert_close(NoPE()(x), x)
    pe = SinusoidalEncoding(8, max_len=16)
    torch.testing.assert_close(pe(x), x + pe.table[:5].float())
    rot = RotaryEmbedding(8, max_len=16)
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    qr, kr = rot(q, k)
    ref = [posenc.rope(t.double().numpy(), 5) for t in (q, k)]
    np.testing.assert_allclose(qr.double().numpy(), ref[0], atol=2e-6)
    np.testing.assert_allclose(kr.double().numpy(), ref[1], atol=2e-6)
    assert MultiHeadAttention(8, 2)(x).shape == (1, 5, 8)
