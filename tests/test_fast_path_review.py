"""Review of the whole-call fast path of ``attend`` (28db5f2): cases where a kept call differs
from a freshly planned one, each checked against a float64 formula (never against the code
under test). Every test here failed on 28db5f2 and passes with the kept calls and masks
switched off (``reuse.recall`` and ``reuse.get`` returning None); all but the ALiBi case of
the first and the ``.data`` one passed on 28db5f2^ (those two are the older mask cache's).
All pass since the fix that followed the review."""

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import (
    ALiBi,
    NoPE,
    PositionalEncoding,
    RotaryEmbedding,
    SoftmaxFactor,
    T5RelativeBias,
)
from posenc.torch.attention.core import attend

B, H, KVH, D, SK = 1, 4, 2, 8, 12


def _qkv(seq_q, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, seq_q, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, KVH, SK, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v


def _ref(q, k, v, *, bias=None, scale=D**-0.5, causal=True):
    """Float64 attention, queries at the last seq_q key slots, GQA by repeating k and v."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    sq, sk = q.shape[2], k.shape[2]
    scores = q.double() @ k.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias
    if causal:
        i = torch.arange(sk - sq, sk)[:, None]
        j = torch.arange(sk)[None]
        scores = scores.masked_fill(j > i, float("-inf"))
    return scores.softmax(-1) @ v


def _alibi_bias(slopes, sq, sk):
    i = torch.arange(sk - sq, sk, dtype=torch.float64)[:, None]
    j = torch.arange(sk, dtype=torch.float64)[None]
    return -torch.as_tensor(slopes, dtype=torch.float64)[:, None, None] * (i - j)  # (H, sq, sk)


@pytest.mark.parametrize(
    "make, bias",
    [
        (lambda: None, lambda sq: None),
        (NoPE, lambda sq: None),
        (lambda: ALiBi(H).double(), lambda sq: _alibi_bias(posenc.alibi_slopes(H), sq, SK)),
    ],
    ids=["none", "nope", "alibi"],  # none/nope: new in 28db5f2; alibi: the mask cache, before
)
def test_a_call_under_inference_mode_does_not_break_a_later_training_call(make, bias):
    # a causal mask for 1 < seq_q < seq_k, built under inference_mode and kept, is an
    # inference tensor: a later call in grad mode must not feed it to autograd
    enc = make()
    q, k, v = _qkv(5)
    with torch.inference_mode():
        attend(q, k, v, enc, backend="sdpa")
    qg = q.clone().requires_grad_(True)
    attend(qg, k, v, enc, backend="sdpa").sum().backward()  # raised RuntimeError
    qr = q.clone().requires_grad_(True)
    _ref(qr, k, v, bias=bias(5)).sum().backward()
    torch.testing.assert_close(qg.grad, qr.grad)


def test_a_softmax_factor_set_to_a_numpy_float_changes_the_next_call():
    # np.float64 is a float (SDPA takes it as the scale) but not type float: the settings
    # counter did not see it, and the kept call kept the old scale
    enc = SoftmaxFactor(NoPE(), factor=1.0)
    q, k, v = _qkv(SK)
    attend(q, k, v, enc, backend="sdpa")
    enc.factor = np.float64(4.0)
    got = attend(q, k, v, enc, backend="sdpa")
    torch.testing.assert_close(got, _ref(q, k, v, scale=4.0 * D**-0.5))


class _Capped(PositionalEncoding):
    """A user's bias -|i - j|, clamped at -cap unless cap is None (a plain setting)."""

    reuses_masks = True  # a function of its plain attributes and the positions alone

    def __init__(self, cap):
        super().__init__()
        self.cap = cap

    def score_bias(self, q_positions, k_positions):
        i = torch.tensor(list(q_positions), dtype=torch.float64)[:, None]
        j = torch.tensor(list(k_positions), dtype=torch.float64)[None]
        bias = -(i - j).abs()
        return (bias if self.cap is None else bias.clamp(min=-self.cap))[None, None]


def test_a_plain_setting_set_back_to_none_changes_the_next_call():
    # setting an attribute to None (an optional setting switched off) was not counted: the
    # mask kept for cap=0.5 served the call with cap=None (28db5f2^ keyed the values: right)
    enc = _Capped(0.5)
    q, k, v = _qkv(SK)
    attend(q, k, v, enc, backend="sdpa", causal=False)
    enc.cap = None
    got = attend(q, k, v, enc, backend="sdpa", causal=False)
    pos = torch.arange(SK, dtype=torch.float64)
    want = _ref(q, k, v, bias=-(pos[:, None] - pos[None]).abs(), causal=False)
    torch.testing.assert_close(got, want)


def test_a_bias_weight_written_through_data_changes_the_next_call():
    # ``.data`` has its own version counter: an update through it (old-style init, EMA
    # copies) leaves id, address and version of a learned bias's weight unchanged, so
    # nothing computed from a learned bias is kept (derived tables such as ALiBi's slopes
    # are computed from the constructor's arguments and are not written by hand)
    t5 = T5RelativeBias(H, num_buckets=8, max_distance=16).double()
    q, k, v = _qkv(1)
    with torch.no_grad():
        attend(q, k, v, t5, backend="sdpa")
        attend(q, k, v, t5, backend="sdpa")
        t5.weight.data.mul_(50.0)
        got = attend(q, k, v, t5, backend="sdpa")
    rel = torch.arange(SK)[None] - torch.arange(SK - 1, SK)[:, None]  # key - query
    buckets = torch.from_numpy(posenc.t5_buckets(rel.numpy(), bidirectional=False,
                                                 num_buckets=8, max_distance=16))
    bias = t5.weight.detach()[buckets].permute(2, 0, 1)  # (H, 1, SK)
    torch.testing.assert_close(got, _ref(q, k, v, bias=bias))


def test_a_call_under_fake_tensors_does_not_poison_real_calls():
    # shape propagation under FakeTensorMode is not torch.compile: the mask it plans is fake
    # and must not be kept for the real calls that follow
    from torch._subclasses.fake_tensor import FakeTensorMode

    rope = RotaryEmbedding(D, max_len=64).double()
    q, k, v = _qkv(5)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        attend(*(mode.from_tensor(t) for t in (q, k, v)), rope, backend="sdpa")
    got = attend(q, k, v, rope, backend="sdpa")  # raised DataDependentOutputException
    with torch.no_grad():
        qr, kr = rope.encode_qk(q, k, range(SK - 5, SK), range(SK))  # checked in test_fast_path
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, _ref(qr, kr, v))


class _Sharp(NoPE):
    """A user's encoding with its own softmax scale (1, not 1 / sqrt(head_dim))."""

    def softmax_scale(self, head_dim):
        return 1.0


def test_a_wrapper_given_another_inner_encoding_changes_the_next_call():
    # the key holds the settings counters of the modules, not which modules they are: a new
    # inner encoding with the same counters served the kept scale of the old one
    enc = SoftmaxFactor(NoPE(), factor=2.0)
    q, k, v = _qkv(SK)
    attend(q, k, v, enc, backend="sdpa")
    enc.inner = _Sharp()
    got = attend(q, k, v, enc, backend="sdpa")
    torch.testing.assert_close(got, _ref(q, k, v, scale=2.0))
