"""torch.compile (fullgraph), torch.func transforms and the in-place inference path.

Graph breaks do not depend on the backend, so most compile tests use ``aot_eager``
(seconds); two use inductor to check the generated code's numbers.
"""

import numpy as np
import pytest
import torch

import posenc
from posenc.scaling import DynamicNTK
from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    LearnedEncoding,
    MultiHeadAttention,
    NoPE,
    PoPE,
    PositionalEncoding,
    RotaryEmbedding,
    SinusoidalEncoding,
    T5RelativeBias,
    TransformerLM,
    XPos,
    apply_rope,
    position_tensor,
)


class DistancePenalty(PositionalEncoding):
    def score_bias(self, q_positions, k_positions):
        qp, kp = position_tensor(q_positions), position_tensor(k_positions)
        return -(qp[:, None, :, None] - kp[:, None, None, :]).abs().float() / 4


ENCODINGS = {
    "nope": NoPE,
    "sinusoidal": lambda: SinusoidalEncoding(32, max_len=64),
    "learned": lambda: LearnedEncoding(64, 32),
    "rope_half": lambda: RotaryEmbedding(8, max_len=64),
    "rope_interleaved": lambda: RotaryEmbedding(8, pairing="interleaved", max_len=64),
    "rope_dynamic": lambda: RotaryEmbedding(8, scaling=DynamicNTK(2.0, 8), max_len=64),
    "score_bias": DistancePenalty,
    "alibi": lambda: ALiBi(4),
    "t5": lambda: T5RelativeBias(4, num_buckets=8, max_distance=16),
    "kerple": lambda: KERPLE(4),
    "fire": lambda: FIRE(4, hidden=8),
    "xpos": lambda: XPos(8, max_len=64),
    "pope": lambda: PoPE(8, 4),
}


def _pair(name):
    torch.manual_seed(0)
    lm = TransformerLM(17, 32, 2, 4, kv_heads=2, encoding=ENCODINGS[name]())
    return lm, torch.randint(0, 17, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.compile
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_compile_fullgraph_inference_and_training(name):
    lm, idx = _pair(name)
    torch._dynamo.reset()
    compiled = torch.compile(lm, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx), lm(idx), rtol=1e-5, atol=1e-5)
    compiled(idx).logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}
    lm.zero_grad()
    lm(idx).logsumexp(-1).mean().backward()
    assert grads.keys() == {n for n, p in lm.named_parameters() if p.grad is not None}
    for n, p in lm.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.compile
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_compile_inductor_rope_under_no_grad(pairing):
    # the interleaved case crashed before ("Tensor must have a last dimension of size 2")
    torch.manual_seed(2)
    rot = RotaryEmbedding(16, pairing=pairing, max_len=64)
    q, k = torch.randn(2, 1, 4, 20, 16).unbind(0)
    torch._dynamo.reset()
    compiled = torch.compile(rot, fullgraph=True)
    ref = posenc.rope(q.double().numpy(), np.arange(20), pairing=pairing)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(q, k)[0].double().numpy(), ref, atol=2e-6)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_vmap_grad_jacfwd_on_apply_rope(pairing):
    torch.manual_seed(3)
    x = torch.randn(5, 1, 2, 3, 8, dtype=torch.float64)  # a batch of 5 inputs for vmap
    pos = torch.tensor([7, 100, 3001])
    batched = torch.func.vmap(lambda t: apply_rope(t, pos, pairing=pairing))(x)
    ref = posenc.rope(x.numpy(), pos.numpy(), pairing=pairing)
    np.testing.assert_allclose(batched.numpy(), ref, rtol=0, atol=1e-12)
    # RoPE is linear: its Jacobian is the block rotation R, and the gradient of w . R x is R^T w
    eye = np.eye(8)
    R = np.stack([posenc.rope(eye, [p] * 8, pairing=pairing).T for p in pos.tolist()])  # (3, 8, 8)
    jac = torch.func.jacfwd(lambda t: apply_rope(t, pos, pairing=pairing))(x[0])
    jac = jac.reshape(2, 3, 8, 2, 3, 8)
    for s in range(3):
        np.testing.assert_allclose(jac[0, s, :, 0, s].numpy(), R[s], atol=1e-12)
        assert jac[0, s, :, 0, (s + 1) % 3].abs().max() == 0  # positions do not mix
    w = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    g = torch.func.grad(lambda t: (apply_rope(t, pos, pairing=pairing) * w).sum())(x[0])
    expect = np.einsum("sji,hsj->hsi", R, w[0].numpy())  # R^T w per position
    np.testing.assert_allclose(g[0].numpy(), expect, atol=1e-12)


class Spy(RotaryEmbedding):
    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        self.calls.append((inplace, q.data_ptr(), k.data_ptr()))
        out = super().encode_qk(q, k, q_positions, k_positions, inplace=inplace)
        self.results.append((out[0].data_ptr(), out[1].data_ptr()))
        return out


def test_attention_rotates_its_own_projections_in_place_under_no_grad():
    torch.manual_seed(4)
    spy = Spy(8, max_len=64)
    spy.calls, spy.results = [], []
    attn = MultiHeadAttention(32, 4, kv_heads=2, encoding=spy)
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        y = attn(x)
    assert spy.calls[-1][0] is True
    assert spy.results[-1] == spy.calls[-1][1:]  # written into q and k, no new outputs
    y_grad = attn(x)  # autograd records: a new, differentiable output
    assert spy.calls[-1][0] is False and spy.results[-1] != spy.calls[-1][1:]
    torch.testing.assert_close(y, y_grad.detach(), rtol=0, atol=1e-6)
