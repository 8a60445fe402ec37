"""Score biases (ALiBi, T5, KERPLE, FIRE) and xPos: parity with their sources, properties.

Sources: the ALiBi authors' ``get_slopes`` (written out below) and HF Bloom's
``build_alibi_tensor``; HF T5's ``_relative_position_bucket``; rotary-embedding-torch's
xPos (``use_xpos=True``, ``rotate_queries_and_keys``).
"""

import math

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import FIRE, KERPLE, ALiBi, PoPE, T5RelativeBias, XPos, attend


def authors_get_slopes(n):
    """ALiBi's reference implementation (Press et al., 2022), transcribed."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest) + authors_get_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_equal_the_authors_for_1_to_128_heads():
    for n in range(1, 129):
        np.testing.assert_allclose(posenc.alibi_slopes(n), authors_get_slopes(n), rtol=1e-15)
    np.testing.assert_array_equal(
        posenc.alibi_slopes(6), [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    )


@pytest.mark.parametrize("heads", [1, 6, 8, 12, 16, 40])
def test_alibi_slopes_equal_hf_bloom(heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), heads, torch.float32)
    hf = alibi[:, 0, 1].double().numpy()  # slope * position 1, position 1 of the mask
    # HF raises a float32 base to powers up to ``heads``: relative error <= heads * 2**-24
    np.testing.assert_allclose(posenc.alibi_slopes(heads), hf, rtol=(heads + 2) * 2.0**-24)


def test_torch_alibi_is_float32_whatever_the_module_dtype():
    alibi = ALiBi(12).to(torch.bfloat16)
    assert alibi.slopes.dtype == torch.float64 and "slopes" not in alibi.state_dict()
    assert alibi.work_dtype == torch.float32 and alibi.double().work_dtype == torch.float64
    alibi = alibi.bfloat16()
    pos = torch.arange(4096)
    bias = alibi.score_bias(pos[None, -64:], pos[None])  # the last 64 queries, 4096 keys
    ref = posenc.alibi_bias(posenc.alibi_slopes(12), pos[-64:].numpy(), pos.numpy())
    assert bias.dtype == torch.float32
    np.testing.assert_allclose(bias[0].numpy(), ref, rtol=2e-7, atol=0)  # float32 rounding


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20), (64, 256)])
def test_t5_buckets_equal_hf(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-20000, 20001)
    hf = T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    ours = posenc.t5_buckets(
        rel.numpy(), bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    np.testing.assert_array_equal(ours, hf.numpy())


def test_t5_module_reads_its_table_by_bucket():
    torch.manual_seed(0)
    t5 = T5RelativeBias(3, num_buckets=16, max_distance=40, bidirectional=True)
    qp, kp = torch.tensor([[0, 5, 300]]), torch.arange(0, 600, 7)[None]
    buckets = posenc.t5_buckets(
        (kp[0][None] - qp[0][:, None]).numpy(), num_buckets=16, max_distance=40
    )
    ref = t5.weight.detach().numpy()[buckets].transpose(2, 0, 1)  # (heads, sq, sk)
    np.testing.assert_array_equal(t5.score_bias(qp, kp)[0].detach().numpy(), ref)


def _kerple_ref(module, qp, kp):
    r1, r2 = module.r1.detach().double().numpy(), module.r2.detach().double().numpy()
    return posenc.kerple_bias(qp, kp, r1, r2, variant=module.variant)


def _fire_ref(module, qp, kp):
    first, last = module.mlp[0], module.mlp[2]
    return posenc.fire_bias(
        qp,
        kp,
        c=module.log_c.exp().item(),
        threshold=module.log_threshold.exp().item(),
        w1=first.weight[:, 0].detach().double().numpy(),
        b1=first.bias.detach().double().numpy(),
        w2=last.weight.detach().double().numpy(),
        b2=last.bias.detach().double().numpy(),
    )


SCORE = {  # name -> (module factory, NumPy reference of its bias)
    "alibi": (lambda: ALiBi(4), lambda m, q, k: posenc.alibi_bias(posenc.alibi_slopes(4), q, k)),
    "alibi_symmetric": (
        lambda: ALiBi(4, symmetric=True),
        lambda m, q, k: posenc.alibi_bias(posenc.alibi_slopes(4), q, k, symmetric=True),
    ),
    "t5": (
        lambda: T5RelativeBias(4, num_buckets=16, max_distance=64),
        lambda m, q, k: (
            m.weight.detach()
            .double()
            .numpy()[
                posenc.t5_buckets(
                    np.asarray(k)[None] - np.asarray(q)[:, None],
                    bidirectional=False,
                    num_buckets=16,
                    max_distance=64,
                )
            ]
            .transpose(2, 0, 1)
        ),
    ),
    "kerple_log": (lambda: KERPLE(4), _kerple_ref),
    "kerple_power": (lambda: KERPLE(4, variant="power"), _kerple_ref),
    "fire": (lambda: FIRE(4, hidden=8, threshold=100.0), _fire_ref),
}


@pytest.mark.parametrize("name", list(SCORE))
def test_each_torch_bias_equals_numpy_and_depends_on_the_offset_only(name):
    torch.manual_seed(1)
    module, ref_fn = SCORE[name][0](), SCORE[name][1]
    with torch.no_grad():
        for p in module.parameters():  # move away from the initial values
            p.add_(0.1 * torch.randn_like(p))
        qp, kp = np.arange(40, 60), np.arange(0, 60)
        bias = module(torch.from_numpy(qp), torch.from_numpy(kp))[0].double().numpy()
        np.testing.assert_allclose(bias, ref_fn(module, qp, kp), rtol=1e-5, atol=1e-6)
        shifted = module(torch.from_numpy(qp + 30), torch.from_numpy(kp + 30))[0].double().numpy()
    np.testing.assert_allclose(shifted, bias, rtol=1e-5, atol=1e-6)  # FIRE: below its L=100
    if name in ("alibi_symmetric", "kerple_log", "kerple_power", "fire"):  # symmetric forms
        sq = module(torch.arange(30), torch.arange(30))[0].detach()
        torch.testing.assert_close(sq, sq.transpose(-1, -2))


@pytest.mark.compile
@pytest.mark.parametrize("name", list(SCORE) + ["xpos", "pope"])
def test_flex_backend_equals_sdpa(name):
    torch.manual_seed(2)
    extra = {"xpos": lambda: XPos(8, max_len=128), "pope": lambda: PoPE(8, 4)}
    enc = extra[name]() if name in extra else SCORE[name][0]()
    q = torch.randn(2, 4, 9, 8)
    k, v = torch.randn(2, 2, 2, 20, 8).unbind(0)
    pm = torch.ones(2, 20, dtype=torch.bool)
    pm[1, :5] = False  # row 1 left-padded
    kp = torch.stack([torch.arange(20), (torch.arange(20) - 5).clamp(min=0)])
    with torch.no_grad():
        for causal in (True, False) if not enc.requires_causal else (True,):
            kw = {"k_positions": kp, "causal": causal, "padding_mask": pm}
            sdpa = attend(q, k, v, enc, **kw)
            flex = attend(q, k, v, enc, backend="flex", **kw)
            torch.testing.assert_close(flex, sdpa, rtol=1e-4, atol=1e-5)


def test_flex_backend_refuses_to_train_on_cpu():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    with pytest.raises(ValueError, match="backend='flex' has no backward on the CPU"):
        attend(q, q, q, ALiBi(2), backend="flex")


def test_xpos_equals_rotary_embedding_torch_scores_and_numpy():
    from rotary_embedding_torch import RotaryEmbedding as RET

    torch.manual_seed(3)
    q, k = torch.randn(2, 1, 3, 100, 32).unbind(0)
    ret = RET(dim=32, use_xpos=True, xpos_scale_base=512)
    q_ret, k_ret = ret.rotate_queries_and_keys(q, k)  # centred on 100 // 2 for this call
    ours = XPos(32, pairing="interleaved", max_len=100)
    qx, kx = ours(q, k)
    torch.testing.assert_close(
        qx @ kx.transpose(-1, -2), q_ret @ k_ret.transpose(-1, -2), rtol=1e-4, atol=1e-4
    )
    ref_q = posenc.xpos(q.double().numpy(), 100, pairing="interleaved")
    ref_k = posenc.xpos(k.double().numpy(), 100, pairing="interleaved", key=True)
    np.testing.assert_allclose(
        (qx @ kx.transpose(-1, -2)).double().numpy(),
        ref_q @ np.swapaxes(ref_k, -1, -2),
        rtol=1e-4,
        atol=1e-4,
    )


def test_xpos_stays_finite_then_refuses_clearly():
    xpos = XPos(16, max_len=16384)  # centre 8192
    window16 = xpos.window(torch.float16)
    assert 2000 < window16 < 5000 and xpos.window(torch.float32) > 30000
    x = torch.ones(1, 1, 1, 16, dtype=torch.float16)
    for p in (8192 - window16, 8192 + window16):  # the edges of the float16 window
        qx, kx = xpos(x, x, torch.tensor([p]))
        assert torch.isfinite(qx).all() and torch.isfinite(kx).all()
    with pytest.raises(ValueError, match="positions must be within .* of the centre 8192"):
        xpos(x, x, torch.tensor([8192 + window16 + 1]))
    with pytest.raises(ValueError, match="max_len must be <= "):
        XPos(16, max_len=200_000)
    big = XPos(16, max_len=xpos.window(torch.float32) * 2)
    y = torch.ones(1, 1, 2, 16)
    qx, kx = big(y, y, torch.tensor([0, big.max_len - 1]))
    assert torch.isfinite(qx).all() and torch.isfinite(kx).all()


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="heads must be >= 1, got 0"):
        posenc.alibi_slopes(0)
    with pytest.raises(ValueError, match="heads must be >= 1, got 0"):
        ALiBi(0)
    with pytest.raises(ValueError, match="num_buckets must be even when bidirectional, got 31"):
        T5RelativeBias(4, num_buckets=31, bidirectional=True)
    with pytest.raises(ValueError, match="max_distance must be > num_buckets // 2 = 16, got 16"):
        posenc.t5_buckets([1], num_buckets=32, max_distance=16)
    with pytest.raises(ValueError, match="scale_base must be a positive finite number, got -1"):
        XPos(8, scale_base=-1.0)
    with pytest.raises(ValueError, match="k_positions must have the batch of q_positions"):
        posenc.alibi_bias([0.5], np.zeros((2, 3), int), np.zeros((3, 3), int))
    with pytest.raises(ValueError, match="variant must be one of \\('log', 'power'\\)"):
        KERPLE(2, variant="exp")
    with pytest.raises(ValueError, match="ALiBi was built for heads=8, attention has heads=4"):
        attend(torch.ones(1, 4, 3, 8), torch.ones(1, 4, 3, 8), torch.ones(1, 4, 3, 8), ALiBi(8))
