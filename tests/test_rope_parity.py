"""RoPE: parity with HF transformers (frequencies, Llama apply) and GPT-J, plus properties."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.scaling import NTK, DynamicNTK, Linear, Llama3, LongRoPE, YaRN
from posenc.torch import RotaryEmbedding, apply_rope, half_to_interleaved, interleaved_to_half

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

HEAD_DIM, BASE, ORIG, MAX_POS = 64, 10_000.0, 512, 2048
rng = np.random.default_rng(0)
SHORT = tuple(1.0 + rng.random(HEAD_DIM // 2))
LONG = tuple(1.0 + 8 * rng.random(HEAD_DIM // 2))

LONGROPE_PARAMS = {
    "rope_type": "longrope",
    "short_factor": list(SHORT),
    "long_factor": list(LONG),
    "factor": 4.0,
    "original_max_position_embeddings": ORIG,
}

# (our scaling, HF rope_parameters, seq_len passed to both)
CASES = {
    "default": (None, {"rope_type": "default"}, None),
    "linear": (Linear(4.0), {"rope_type": "linear", "factor": 4.0}, None),
    "dynamic_short": (DynamicNTK(4.0, MAX_POS), {"rope_type": "dynamic", "factor": 4.0}, 100),
    "dynamic_long": (DynamicNTK(4.0, MAX_POS), {"rope_type": "dynamic", "factor": 4.0}, 5000),
    "yarn": (
        YaRN(4.0, ORIG),
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG},
        None,
    ),
    "yarn_mscale": (
        YaRN(8.0, ORIG, beta_fast=16, beta_slow=2, mscale=0.707, mscale_all_dim=1.0),
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": ORIG,
            "beta_fast": 16,
            "beta_slow": 2,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
        None,
    ),
    "llama3": (
        Llama3(8.0, 1.0, 4.0, ORIG),
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIG,
        },
        None,
    ),
    "longrope_short": (
        LongRoPE(SHORT, LONG, ORIG, 4.0),
        LONGROPE_PARAMS,
        100,
    ),
    "longrope_long": (
        LongRoPE(SHORT, LONG, ORIG, 4.0),
        LONGROPE_PARAMS,
        1000,
    ),
}


def hf_config(params):
    return LlamaConfig(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_parameters={"rope_theta": BASE, **params},
    )


@pytest.mark.parametrize("name", list(CASES))
def test_frequencies_match_hf(name):
    scaling, params, seq_len = CASES[name]
    cfg = hf_config(params)
    if params["rope_type"] == "default":
        inv_hf, scale_hf = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv_hf, scale_hf = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=seq_len)
    inv, scale = posenc.rope_frequencies(HEAD_DIM, base=BASE, scaling=scaling, seq_len=seq_len)
    np.testing.assert_allclose(inv, inv_hf.double().numpy(), rtol=1e-5)
    assert scale == pytest.approx(scale_hf, rel=1e-6)


def test_ntk_is_dynamic_at_its_equivalent_length_and_linear_property():
    # static NTK with factor f equals HF dynamic NTK at the length where its growth term is f
    f = 4.0
    seq = MAX_POS * (2 * f - 1) / f
    inv, _ = posenc.rope_frequencies(HEAD_DIM, base=BASE, scaling=NTK(f))
    inv_hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](
        hf_config({"rope_type": "dynamic", "factor": f}), None, seq_len=seq
    )
    np.testing.assert_allclose(inv, inv_hf.double().numpy(), rtol=1e-5)
    default, _ = posenc.rope_frequencies(HEAD_DIM, base=BASE)
    np.testing.assert_array_equal(
        posenc.rope_frequencies(HEAD_DIM, scaling=Linear(2.5))[0], default / 2.5
    )
    assert inv[0] == 1.0 and inv[-1] == pytest.approx(default[-1] / f)  # slowest pair / f


@pytest.mark.parametrize(
    "name", ["default", "linear", "yarn", "llama3", "dynamic_long", "longrope_long"]
)
def test_apply_rope_half_matches_hf_llama(name):
    scaling, params, _ = CASES[name]
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 3, 40, HEAD_DIM, dtype=torch.float64).unbind(0)  # (b, h, seq, hd)
    positions = torch.randint(0, 1500, (2, 40))
    emb = LlamaRotaryEmbedding(hf_config(params)).double()
    cos, sin = emb(q, positions)  # HF's dynamic types update from max(positions) + 1
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    ours = [apply_rope(t, positions, base=BASE, scaling=scaling) for t in (q, k)]
    # HF forces the angles p * inv_freq to float32 (and its float32 sin/cos vary with the CPU's
    # vector math), so an angle of up to 1500 rad is off by several float32 epsilons.
    # Rotating a pair of norm r by an angle off by d moves each coordinate by at most r * d:
    # bound d by 8 epsilons (2**-23) of the largest angle. A wrong convention errs by O(r).
    angle_err = 8 * 1500 * 2.0**-23  # ~1.4e-3 rad
    _, scale = posenc.rope_frequencies(HEAD_DIM, base=BASE, scaling=scaling, seq_len=1500)
    half = HEAD_DIM // 2
    for x, got, want in zip((q, k), ours, (q_hf, k_hf), strict=True):
        r = torch.hypot(x[..., :half], x[..., half:]).repeat(1, 1, 1, 2)  # (b, h, seq, hd)
        assert torch.all((got - want).abs() <= scale * r * angle_err)


def gptj_rotate_every_two(x, positions, base):
    """GPT-J's formulation, written out: pairs (2j, 2j+1), sin/cos repeated per pair."""
    d = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[..., None] * inv  # (seq, d/2)
    sin = torch.repeat_interleave(ang.sin(), 2, -1)
    cos = torch.repeat_interleave(ang.cos(), 2, -1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return x * cos + rot * sin


def test_interleaved_matches_gptj():
    torch.manual_seed(1)
    x = torch.randn(1, 2, 30, 32, dtype=torch.float64)
    pos = torch.arange(100, 130)
    torch.testing.assert_close(
        apply_rope(x, pos, pairing="interleaved"),
        gptj_rotate_every_two(x, pos, 10_000.0),
        rtol=0,
        atol=1e-12,
    )


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("name", ["default", "yarn", "llama3", "longrope_short"])
def test_torch_matches_numpy_reference(pairing, name):
    scaling = CASES[name][0]
    torch.manual_seed(2)
    x = torch.randn(2, 3, 17, HEAD_DIM, dtype=torch.float64)
    pos = torch.randint(0, 300, (2, 17))
    ours = apply_rope(x, pos, pairing=pairing, scaling=scaling).numpy()
    ref = posenc.rope(x.numpy(), pos.numpy()[:, None, :], pairing=pairing, scaling=scaling)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)
    rot = RotaryEmbedding(HEAD_DIM, pairing=pairing, scaling=scaling, max_len=512).double()
    qr, _ = rot.encode_qk(x, x, pos, pos)
    np.testing.assert_allclose(qr.numpy(), ref, rtol=0, atol=1e-6)  # float32 tables


# -- properties ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 5000),
    n=st.integers(0, 5000),
    shift=st.integers(0, 5000),
    half_dim=st.integers(1, 32),
    base=st.floats(10.0, 1e6),
    pairing=st.sampled_from(["half", "interleaved"]),
)
def test_score_depends_only_on_offset(m, n, shift, half_dim, base, pairing):
    r = np.random.default_rng(m + n)
    q, k = r.standard_normal((2, 1, 2 * half_dim))
    s1 = (
        posenc.rope(q, [m], base=base, pairing=pairing)
        @ posenc.rope(k, [n], base=base, pairing=pairing).T
    )
    s2 = (
        posenc.rope(q, [m + shift], base=base, pairing=pairing)
        @ posenc.rope(k, [n + shift], base=base, pairing=pairing).T
    )
    assert np.isclose(s1, s2, rtol=1e-6, atol=1e-6 * half_dim)


def test_norms_preserved_and_partial_tail_untouched():
    x = np.random.default_rng(3).standard_normal((5, 16))
    out = posenc.rope(x, np.arange(5) * 37)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))
    part = posenc.rope(x, np.arange(5) * 37, rotary_dim=8)
    np.testing.assert_array_equal(part[:, 8:], x[:, 8:])
    assert not np.allclose(part[:, :8], x[:, :8])


def test_dynamic_ntk_changes_nothing_up_to_original_length():
    x = torch.randn(1, 2, 64, 32, dtype=torch.float64)
    pos = torch.arange(64)
    torch.testing.assert_close(apply_rope(x, pos, scaling=DynamicNTK(4.0, 64)), apply_rope(x, pos))
    assert not torch.allclose(
        apply_rope(x, pos, scaling=DynamicNTK(4.0, 64), seq_len=256), apply_rope(x, pos)
    )


def test_kv_cache_offset_equals_full_sequence():
    torch.manual_seed(4)
    rot = RotaryEmbedding(32, max_len=256)
    q, k = torch.randn(2, 1, 2, 50, 32).unbind(0)
    full_q, full_k = rot.rope(q, k)
    # decode the last query alone at position 49 against the cached keys 0..49
    q_last, _ = rot.encode_qk(q[:, :, -1:], k, torch.tensor([[49]]), torch.arange(50)[None])
    torch.testing.assert_close(q_last, full_q[:, :, -1:])
    torch.testing.assert_close(
        q_last @ full_k.transpose(-1, -2), (full_q @ full_k.transpose(-1, -2))[:, :, -1:]
    )


def test_left_padding_per_row_positions():
    rot = RotaryEmbedding(16, max_len=64)
    x = torch.randn(2, 1, 6, 16)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 2]])  # row 1: 3 pads, then 0, 1, 2
    qr, _ = rot.rope(x, x, pos)
    alone, _ = rot.rope(x[1:, :, 3:], x[1:, :, 3:])  # the real tokens on their own
    torch.testing.assert_close(qr[1:, :, 3:], alone)
    first, _ = rot.rope(x[:1], x[:1])
    torch.testing.assert_close(qr[:1], first)


def test_low_precision_inputs_use_precise_angles():
    pos = torch.tensor([2**20 - 1])
    x = torch.ones(1, 1, 1, 64)
    ref = posenc.rope(np.ones((1, 64)), [2**20 - 1])
    out32 = apply_rope(x, pos).double().numpy()[0, 0]
    assert np.abs(out32 - ref).max() < 1e-5
    out_bf16 = apply_rope(x.bfloat16(), pos)
    assert out_bf16.dtype == torch.bfloat16
    assert np.abs(out_bf16.double().numpy()[0, 0] - ref).max() < 1e-2  # one bf16 rounding


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_pairing_conversion_preserves_scores(rotary_dim):
    torch.manual_seed(5)
    heads, hd, dim = 2, 16, 12
    Wq, Wk = torch.randn(2, heads * hd, dim, dtype=torch.float64).unbind(0)
    x = torch.randn(1, 9, dim, dtype=torch.float64)

    def scores(Wq, Wk, pairing):
        q = (x @ Wq.T).view(1, 9, heads, hd).transpose(1, 2)
        k = (x @ Wk.T).view(1, 9, heads, hd).transpose(1, 2)
        q, k = (apply_rope(t, pairing=pairing, rotary_dim=rotary_dim) for t in (q, k))
        return q @ k.transpose(-1, -2)

    converted = [interleaved_to_half(W, head_dim=hd, rotary_dim=rotary_dim) for W in (Wq, Wk)]
    torch.testing.assert_close(scores(*converted, "half"), scores(Wq, Wk, "interleaved"))
    back = half_to_interleaved(converted[0], head_dim=hd, rotary_dim=rotary_dim)
    torch.testing.assert_close(back, Wq)


# -- bad input ------------------------------------------------------------------------------
def test_bad_input():
    with pytest.raises(ValueError, match="head_dim must be even, got 7"):
        posenc.rope_frequencies(7)
    with pytest.raises(ValueError, match="rotary_dim must be even, got 5"):
        posenc.rope_frequencies(8, rotary_dim=5)
    with pytest.raises(ValueError, match="rotary_dim must be <= head_dim=8, got 10"):
        posenc.rope_frequencies(8, rotary_dim=10)
    with pytest.raises(
        ValueError, match=r"pairing must be one of \('half', 'interleaved'\), got 'pairs'"
    ):
        posenc.rope(np.ones((2, 4)), 2, pairing="pairs")
    with pytest.raises(ValueError, match="pairing must be one of"):
        RotaryEmbedding(8, pairing="neox")
    for cls, args in [
        (Linear, (0.0,)),
        (NTK, (-1.0,)),
        (DynamicNTK, (0, 10)),
        (YaRN, (0, 10)),
        (Llama3, (0, 1, 4, 10)),
    ]:
        with pytest.raises(ValueError, match="factor must be a positive finite number"):
            cls(*args)
    with pytest.raises(ValueError, match="high_freq_factor must be > low_freq_factor"):
        Llama3(8, 4, 1, 10)
    with pytest.raises(ValueError, match="short_factor must be a non-empty list of positive"):
        LongRoPE((), (1.0,), 10, 2.0)
    rot = RotaryEmbedding(8, max_len=10)
    with pytest.raises(ValueError, match="positions must be < max_len=10, got 12"):
        rot.rope(torch.ones(1, 1, 2, 8), torch.ones(1, 1, 2, 8), torch.tensor([0, 12]))
    with pytest.raises(ValueError, match="q and k must have the same seq"):
        rot.rope(torch.ones(1, 1, 2, 8), torch.ones(1, 1, 3, 8))
    with pytest.raises(ValueError, match=r"q must have shape \(batch, heads, seq, head_dim=8\)"):
        rot.encode_qk(
            torch.ones(1, 1, 2, 6),
            torch.ones(1, 1, 2, 6),
            torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2, dtype=torch.long),
        )
    with pytest.raises(ValueError, match="positions must have seq=3 entries"):
        posenc.rope(np.ones((3, 4)), [0, 1])


def test_rope_plugs_into_attention_core():
    from posenc.torch import MultiHeadAttention

    torch.manual_seed(6)
    mha = MultiHeadAttention(32, 4, encoding=RotaryEmbedding(8, max_len=64)).double()
    x = torch.randn(1, 10, 32, dtype=torch.float64)
    with torch.no_grad():
        y = mha(x)
        y_shift = mha(x, positions=torch.arange(20, 30))
    torch.testing.assert_close(y, y_shift)  # relative only: a global offset changes nothing
    assert math.isfinite(y.abs().max().item())


def test_out_buffers_equal_allocating_path_and_are_validated():
    torch.manual_seed(7)
    rot = RotaryEmbedding(16, max_len=64, rotary_dim=12)
    q, k = torch.randn(2, 2, 3, 20, 16).unbind(0)
    expected = rot.rope(q, k)
    out = (torch.empty_like(q), torch.empty_like(k))
    got = rot.rope(q, k, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
    y = torch.empty_like(q)
    assert apply_rope(q, out=y, rotary_dim=12) is y
    torch.testing.assert_close(y, expected[0])
    with pytest.raises(ValueError, match="^out must not share memory with the input$"):
        apply_rope(q, out=q)
    alone = "^out must be two buffers sharing memory with nothing else$"
    with pytest.raises(ValueError, match=alone):
        rot.rope(q, k, out=(k, torch.empty_like(k)))  # q's result would overwrite k
    with pytest.raises(ValueError, match="out must match x"):
        apply_rope(q, out=torch.empty(2, 3, 20, 16, dtype=torch.float64))


def test_interleaved_fast_path_and_fallback_agree_with_reference():
    torch.manual_seed(8)
    base = torch.randn(2, 3, 7, 17, dtype=torch.float64)
    odd = base[..., 1:]  # storage offset 1, odd strides: no complex view possible
    even = base[..., 1:].contiguous()  # same values, complex view possible
    ref = posenc.rope(even.numpy(), np.arange(7), pairing="interleaved")
    for x in (odd, even, even.float()):
        got = apply_rope(x, pairing="interleaved").double().numpy()
        np.testing.assert_allclose(
            got, ref, rtol=0, atol=1e-6 if x.dtype == torch.float32 else 1e-12
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_interleaved_low_precision_blocked_path(dtype):
    torch.manual_seed(9)
    x = torch.randn(2, 5, 33, 16).to(dtype)
    ref = posenc.rope(x.double().numpy(), np.arange(33), pairing="interleaved")
    rot = RotaryEmbedding(16, max_len=64, pairing="interleaved")
    for got in (apply_rope(x, pairing="interleaved"), rot.rope(x, x)[0]):
        assert got.dtype == dtype
        np.testing.assert_allclose(got.double().numpy(), ref, rtol=0, atol=2e-2)
    # rounding happens once: the result is the float32 rotation rounded to dtype
    exact = torch.from_numpy(ref).to(dtype)
    assert (got.double() - exact.double()).abs().max() <= (exact.double().abs().max() * 2**-7)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_gradients_flow_and_match_reference(pairing):
    torch.manual_seed(10)
    rot = RotaryEmbedding(8, max_len=32, pairing=pairing, rotary_dim=6).double()
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    qr, kr = rot.rope(q, k)
    (qr * kr).sum().backward()
    # analytic gradients equal finite differences
    torch.autograd.gradcheck(lambda a: rot.rope(a, a)[0], (q.detach().clone().requires_grad_(),))
    assert q.grad is not None and torch.isfinite(q.grad).all()
    # the rotated q still matches the inference path
    with torch.no_grad():
        torch.testing.assert_close(rot.rope(q, k)[0], qr.detach())
    with pytest.raises(ValueError, match="out= needs plain eager inference"):
        rot.rope(q, k, out=(torch.empty_like(q), torch.empty_like(k)))


@pytest.mark.parametrize("convert", [interleaved_to_half, half_to_interleaved])
def test_pairing_conversion_refuses_rows_not_a_multiple_of_head_dim(convert):
    with pytest.raises(ValueError, match=r"^weight rows must be a multiple of head_dim=8, got 12$"):
        convert(torch.zeros(12, 5), head_dim=8)
