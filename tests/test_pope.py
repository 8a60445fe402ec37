"""PoPE: parity with pope-pytorch 0.2.1, the torch module against NumPy, properties.

Sign convention (pope-pytorch and posenc): the query at m has phase m theta_c, the key at n
has n theta_c + delta_c, and the score is sum_c mu_q mu_k cos((n - m) theta_c + delta_c).
"""

import math

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import MultiHeadAttention, PoPE, TransformerLM

pope_pytorch = pytest.importorskip("PoPE_pytorch")


def _reference_scores(q, k, delta, positions):
    """pope-pytorch's score matrix (apply_pope_to_qk), its frequencies given in float64."""
    d = q.shape[-1]
    inv = torch.from_numpy(posenc.pope_frequencies(d))  # checked against its own below
    ref = pope_pytorch.PoPE(d, heads=q.shape[1], inv_freqs=inv).double()
    with torch.no_grad():
        ref.bias.copy_(delta)
    q_pope, k_pope = pope_pytorch.apply_pope_to_qk(ref(positions.double()), q, k)
    return (q_pope @ k_pope.transpose(-1, -2)).detach()  # (b, h, sq, sk)


def test_frequencies_equal_pope_pytorch():
    for d in (1, 8, 32, 128):
        theirs = pope_pytorch.PoPE(d, heads=1).inv_freqs.double().numpy()  # float32 powers
        np.testing.assert_allclose(posenc.pope_frequencies(d), theirs, rtol=2e-7)


def test_scores_equal_pope_pytorch():
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 3, 11, 32, dtype=torch.float64).unbind(0)
    delta = torch.rand(3, 32, dtype=torch.float64) * -2 * math.pi  # inside its clamp
    positions = torch.tensor([0, 1, 2, 5, 9, 17, 40, 41, 300, 301, 1000])
    ref = _reference_scores(q, k, delta, positions).numpy()
    ours = posenc.pope_scores(q.numpy(), k.numpy(), positions.numpy(), positions.numpy(),
                              delta=delta.numpy())  # fmt: skip
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-10)


def test_module_equals_numpy_with_gqa_and_per_row_positions():
    torch.manual_seed(1)
    pope = PoPE(16, 4, delta_init="uniform").double()
    q = torch.randn(2, 4, 6, 16, dtype=torch.float64)
    k = torch.randn(2, 2, 9, 16, dtype=torch.float64)  # 2 key heads, shared by pairs of queries
    qp, kp = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 0, 1, 2, 3, 4]]), torch.arange(9)[None]
    with torch.no_grad():
        q2, k2 = pope.encode_qk(q, k, qp, kp)
    assert q2.shape == (2, 4, 6, 32) and k2.shape == (2, 2, 9, 32)
    got = q2 @ k2.repeat_interleave(2, dim=1).transpose(-1, -2)  # (2, 4, 6, 9)
    kr = k.repeat_interleave(2, dim=1).numpy()
    for b in range(2):
        ref = posenc.pope_scores(q[b].numpy(), kr[b], qp[b].numpy(), kp[0].numpy(),
                                 delta=pope.raw_delta.detach().numpy())  # fmt: skip
        np.testing.assert_allclose(got[b].numpy(), ref, rtol=1e-10, atol=1e-10)


def test_scores_depend_on_the_offset_only():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 2, 5, 8))
    delta = rng.uniform(-2 * np.pi, 0, (2, 8))
    a = posenc.pope_scores(q, k, np.arange(5), np.arange(5), delta=delta)
    b = posenc.pope_scores(q, k, np.arange(5) + 777, np.arange(5) + 777, delta=delta)
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_content_does_not_shift_the_position_signal():
    # RoPE: a pair's score is |q||k| cos(angle_q - angle_k + (m - n) theta): rotating the
    # content of q by phi moves the position signal. PoPE: magnitudes only, so the score at
    # each offset depends on the content only through mu, never through a phase.
    rng = np.random.default_rng(3)
    k = rng.standard_normal((1, 8))
    offsets = np.arange(0, 64)
    # equal magnitudes, two contents with different "angles" in RoPE's sense: same PoPE score
    q1, q2 = np.array([[1.0, -1.0] * 4]), np.array([[-1.0, 1.0] * 4])
    s1 = [posenc.pope_scores(np.abs(q1), k, [r], [0])[0, 0] for r in offsets]
    s2 = [posenc.pope_scores(np.abs(q2), k, [r], [0])[0, 0] for r in offsets]
    np.testing.assert_allclose(s1, s2)
    r1 = [(posenc.rope(q1, [r]) @ posenc.rope(k, [0]).T)[0, 0] for r in offsets]
    r2 = [(posenc.rope(q2, [r]) @ posenc.rope(k, [0]).T)[0, 0] for r in offsets]
    assert np.abs(np.array(r1) - np.array(r2)).max() > 0.5  # RoPE: content moves the curve


def test_what_holds_for_the_decay_with_equal_magnitudes():
    # delta = 0, every magnitude equal: a(r) = mu^2 sum_c cos(r theta_c).
    d = 64
    theta = posenc.pope_frequencies(d)
    r = np.arange(0, 2000)
    q = np.zeros((1, d))  # mu = log 2 everywhere
    a = np.array([posenc.pope_scores(q, q, [int(x)], [0])[0, 0] for x in r])
    mu2 = np.log(2) ** 2
    np.testing.assert_allclose(a, mu2 * np.cos(r[:, None] * theta).sum(-1), rtol=1e-12)
    assert a[0] == pytest.approx(d * mu2) and (np.abs(a[1:]) < a[0]).all()  # largest at r = 0
    # Part 3's bound (1/d) sum_j |C_j(r)|, C_j the partial sums of e^{i r theta}: it is NOT
    # monotone in r, but its running maximum over larger offsets never increases, and it
    # falls from window to window on average.
    C = np.cumsum(np.exp(1j * r[:, None] * theta), axis=1)
    bound = np.abs(C).mean(axis=1)
    assert (np.diff(bound) > 0).any()  # not monotone
    running = np.maximum.accumulate(bound[::-1])[::-1]  # max over offsets >= r
    assert (np.diff(running) <= 0).all()
    windows = [bound[s : s + 10].mean() for s in (0, 100, 1000)]
    assert windows[0] > windows[1] > windows[2]


def test_delta_has_a_gradient_everywhere_and_wraps_into_its_interval():
    pope = PoPE(4, 1)
    with torch.no_grad():
        pope.raw_delta.copy_(torch.tensor([[0.5, -7.0, 0.0, -1.0]]))  # outside [-2 pi, 0] too
    wrapped = pope.delta.detach()
    assert (wrapped <= 0).all() and (wrapped >= -2 * math.pi).all()
    torch.testing.assert_close(torch.cos(wrapped), torch.cos(pope.raw_delta.detach()))
    # q != k: with q == k the summed scores are symmetric in m - n and their gradient at
    # delta = 0 vanishes exactly (an earlier version of this test passed on round-off)
    q, k = torch.randn(2, 1, 1, 3, 4, generator=torch.Generator().manual_seed(0))
    q2, k2 = pope(q, k)
    (q2 @ k2.transpose(-1, -2)).sum().backward()
    assert (pope.raw_delta.grad.abs() > 1e-3).all()  # including the component at +0.5
    # the paper's clamp (pope-pytorch): a delta above 0 gets no gradient and stays there
    ref = pope_pytorch.PoPE(4, heads=1)
    with torch.no_grad():
        ref.bias.copy_(torch.tensor([[0.5, -1.0, -2.0, -3.0]]))
    qp, kp = pope_pytorch.apply_pope_to_qk(ref(3), q, q)
    (qp @ kp.transpose(-1, -2)).sum().backward()
    assert ref.bias.grad[0, 0] == 0 and ref.bias.grad[0, 1:].abs().min() > 0


def test_uniform_init_works_where_pope_pytorch_raises():
    with pytest.raises(RuntimeError, match="leaf Variable"):
        pope_pytorch.PoPE(8, heads=2, bias_uniform_init=True)
    torch.manual_seed(4)
    delta = PoPE(8, 2, delta_init="uniform").delta
    assert (delta < 0).all() and (delta > -2 * math.pi).all() and delta.std() > 1


def test_low_precision_phases_in_float32():
    pope = PoPE(16, 2).bfloat16()
    q = torch.randn(1, 2, 4, 16).bfloat16()
    positions = torch.tensor([100_000, 100_001, 100_002, 100_003])
    q2, _ = pope(q, q, positions)
    assert q2.dtype == torch.bfloat16
    exact = posenc.pope_scores(q.double().numpy()[0], q.double().numpy()[0], positions.numpy(),
                               positions.numpy())  # fmt: skip
    got = (q2.double() @ q2.double().transpose(-1, -2))[0].detach().numpy()
    np.testing.assert_allclose(got, exact, rtol=0.03, atol=0.05)  # bf16 rounding of q2 only


def test_attention_scale_is_one_over_sqrt_head_dim():
    torch.manual_seed(5)
    pope = PoPE(8, 2)
    attn = MultiHeadAttention(16, 2, encoding=pope).double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    W = attn.qkv.weight.detach()
    q, k = (x @ W[i * 16 : (i + 1) * 16].T for i in range(2))
    q, k = (t.view(1, 5, 2, 8).transpose(1, 2) for t in (q, k))
    with torch.no_grad():
        scores = torch.from_numpy(posenc.pope_scores(q.numpy(), k.numpy(), 5, 5)) / math.sqrt(8)
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        w = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        v = (x @ W[32:48].T).view(1, 5, 2, 8).transpose(1, 2)
        ref = attn.out((w @ v).transpose(1, 2).reshape(1, 5, 16))
        torch.testing.assert_close(attn(x), ref)


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="head_dim must be >= 1, got 0"):
        PoPE(0, 2)
    with pytest.raises(ValueError, match="head_dim must be >= 1, got 0"):
        posenc.pope_frequencies(0)
    with pytest.raises(ValueError, match="delta_init must be one of \\('zeros', 'uniform'\\)"):
        PoPE(8, 2, delta_init="normal")
    with pytest.raises(ValueError, match="q must have heads=2"):
        PoPE(8, 2)(torch.ones(1, 3, 4, 8), torch.ones(1, 3, 4, 8))
    with pytest.raises(ValueError, match="delta must end in head_dim=8"):
        posenc.pope_scores(np.ones((2, 8)), np.ones((2, 8)), 2, 2, delta=np.zeros(4))
    lm = TransformerLM(10, 16, 1, 2, encoding=PoPE(8, 2))
    assert lm.new_cache(1, 4).keys[0].shape == (1, 2, 4, 16)  # cache holds 2 * head_dim keys
