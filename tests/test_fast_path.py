"""Repeated calls: ``attend`` with default positions skips its checks and plan when a call of
the same key was planned before (``posenc.torch.attention.reuse.call_key``), and a decode
step's rotation splits its table once for q and k (``rope_eager.rotate_pair``). Each test
checks the result against a float64 formula, or against the planned path with the kept calls
switched off, and that whatever the plan depended on starts a new plan."""

import copy
import pickle

import pytest
import torch

import posenc
from posenc.torch import KERPLE, ALiBi, NoPE, PoPE, RotaryEmbedding, T5RelativeBias
from posenc.torch.attention import core, reuse
from posenc.torch.attention.core import attend

B, H, D, S = 1, 4, 8, 12


def _qkv(seq_q=1, seq_k=S, heads_k=H, dtype=torch.float64, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, seq_q, D, generator=g, dtype=dtype)
    k, v = (torch.randn(B, heads_k, seq_k, D, generator=g, dtype=dtype) for _ in range(2))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _alibi_ref(q, k, v, slopes, causal=True, symmetric=False):
    """Float64 ALiBi attention: scores - m (i - j) (or -m |i - j|), queries last."""
    sq, sk = q.shape[2], k.shape[2]
    i = torch.arange(sk - sq, sk, dtype=torch.float64)[:, None]
    j = torch.arange(sk, dtype=torch.float64)[None]
    m = torch.as_tensor(slopes, dtype=torch.float64)[:, None, None]  # (H, 1, 1)
    dist = (i - j).abs() if symmetric else i - j
    scores = q.double() @ k.double().transpose(-1, -2) / D**0.5 - m * dist
    if causal:
        scores = scores.masked_fill(j > i, float("-inf"))
    return scores.softmax(-1) @ v.double()


@pytest.fixture
def plans(monkeypatch):
    """Count the calls that go through ``plan`` (a kept call does not)."""
    calls = []
    real = core.plan

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "plan", counting)
    return calls


def test_a_repeated_decode_step_is_planned_once_and_gives_the_formula(plans):
    alibi = ALiBi(H).double()
    q, k, v = _qkv()
    want = _alibi_ref(q, k, v, posenc.alibi_slopes(H))
    for _ in range(3):
        torch.testing.assert_close(attend(q, k, v, alibi, backend="sdpa"), want)
    assert len(plans) == 1
    q2, k2, v2 = _qkv(seq_k=S + 1, seed=1)  # the next step: one more key, planned anew
    got = attend(q2, k2, v2, alibi, backend="sdpa")
    torch.testing.assert_close(got, _alibi_ref(q2, k2, v2, posenc.alibi_slopes(H)))
    assert len(plans) == 2


@pytest.mark.parametrize("seq_q", [1, 5, S])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda: None,
        lambda: NoPE(),
        lambda: RotaryEmbedding(D, max_len=64),
        lambda: ALiBi(H),
        lambda: T5RelativeBias(H, num_buckets=8, max_distance=16),
        lambda: PoPE(D, heads=H),  # encoded q, k twice as wide as v
    ],
    ids=["none", "nope", "rope", "alibi", "t5", "pope"],
)
@pytest.mark.parametrize("heads_k", [H // 2, H], ids=["gqa", "mha"])
def test_kept_calls_equal_planned_calls_bit_for_bit(make, grad, seq_q, heads_k, monkeypatch):
    torch.manual_seed(0)
    enc = make()
    enc = enc if enc is None else enc.double()
    q, k, v = _qkv(seq_q, heads_k=heads_k)  # grouped-query attention, or not
    with torch.set_grad_enabled(grad):
        first = attend(q, k, v, enc, backend="sdpa")
        again = attend(q, k, v, enc, backend="sdpa")  # kept where it may be
        monkeypatch.setattr(reuse, "last_call", lambda *a: None)
        monkeypatch.setattr(reuse, "recall", lambda *a: None)  # every call planned
        planned = attend(q, k, v, enc, backend="sdpa")
    assert torch.equal(first, again) and torch.equal(again, planned)


def test_a_bias_trained_after_inference_calls_still_gets_its_gradient():
    t5 = T5RelativeBias(H, num_buckets=8, max_distance=16).double()
    q, k, v = _qkv()
    with torch.no_grad():
        for _ in range(2):
            attend(q, k, v, t5, backend="sdpa")  # kept: no graph
    attend(q, k, v, t5, backend="sdpa").sum().backward()  # the same key but for grad mode
    assert t5.weight.grad is not None and float(t5.weight.grad.abs().sum()) > 0


def test_changed_tensors_settings_and_dtypes_start_a_new_plan(plans):
    alibi = ALiBi(H).double()
    q, k, v = _qkv()
    attend(q, k, v, alibi, backend="sdpa")
    with torch.no_grad():
        alibi.slopes.mul_(2.0)  # in place: a new version
    got = attend(q, k, v, alibi, backend="sdpa")
    want = _alibi_ref(q, k, v, 2.0 * torch.as_tensor(posenc.alibi_slopes(H)))
    torch.testing.assert_close(got, want)
    alibi.symmetric = True  # a setting set by hand: -m |i - j|, bidirectional
    got = attend(q, k, v, alibi, backend="sdpa", causal=False)
    want = _alibi_ref(q, k, v, 2.0 * torch.as_tensor(posenc.alibi_slopes(H)), False, True)
    torch.testing.assert_close(got, want)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    got = attend(q32, k32, v32, alibi, backend="sdpa", causal=False)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert len(plans) == 4


def test_a_setting_changed_by_hand_changes_the_next_call():
    kerple = KERPLE(H, variant="log").double()
    q, k, v = _qkv(S, seed=2)
    with torch.no_grad():
        attend(q, k, v, kerple, backend="sdpa")
        before = attend(q, k, v, kerple, backend="sdpa")  # kept
        kerple.variant = "power"  # the same call and tensors, the other kernel
        got = attend(q, k, v, kerple, backend="sdpa")
        fresh = KERPLE(H, variant="power").double()  # built for it, nothing kept
        fresh.load_state_dict(kerple.state_dict())
        want = attend(q, k, v, fresh, backend="sdpa")
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, before)


def test_a_call_that_must_fail_still_fails_after_a_kept_one():
    alibi = ALiBi(H).double()
    q, k, v = _qkv()
    attend(q, k, v, alibi, backend="sdpa")
    attend(q, k, v, alibi, backend="sdpa")
    with pytest.raises(ValueError, match="causal"):  # ALiBi without symmetric looks back
        attend(q, k, v, alibi, backend="sdpa", causal=False)
    with pytest.raises(ValueError, match="heads=8"):  # built for 8 heads
        attend(q, k, v, ALiBi(8).double(), backend="sdpa")
    with pytest.raises(ValueError, match="floating-point"):
        attend(q, k.long(), v, alibi, backend="sdpa")


def test_copies_and_pickles_keep_their_own_plans(plans):
    alibi = ALiBi(H).double()
    q, k, v = _qkv()
    attend(q, k, v, alibi, backend="sdpa")
    twin = copy.deepcopy(alibi)
    twin.symmetric = True
    back = pickle.loads(pickle.dumps(alibi))
    for enc, sym in ((alibi, False), (twin, True), (back, False)):
        got = attend(q, k, v, enc, backend="sdpa", causal=not sym)
        torch.testing.assert_close(got, _alibi_ref(q, k, v, posenc.alibi_slopes(H), not sym, sym))
    assert len(plans) == 3  # the original kept; the twin and the unpickled one planned


def _rotate_ref(x, pos, base=10_000.0):
    """Float64 RoPE, half pairing: pairs (j, j + d/2) turned by p * base^(-2j/d)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    ang = pos.double()[:, None, :, None] * inv  # (b, 1, seq, d/2)
    x1, x2 = x.double()[..., : d // 2], x.double()[..., d // 2 :]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)


def test_a_decode_rotation_matches_the_formula_and_the_four_kernel_path():
    from posenc.torch.kernels.rope_eager import rotate_eager

    rope = RotaryEmbedding(64, max_len=4096)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, 1, 64, generator=g), torch.randn(2, 2, 1, 64, generator=g)
    pos = torch.tensor([[100], [2047]])  # (b, 1): one decode position per row
    with torch.no_grad():
        got_q, got_k = rope.encode_qk(q, k, pos, pos)  # the decode path (small, plain)
        cs = rope.table(pos)[:, None]  # (b, 1, 1, 32, 2): the four kernels on the halves
        ref_q, ref_k = (rotate_eager(x, cs, "half", torch.empty_like(x)) for x in (q, k))
    torch.testing.assert_close(got_q.double(), _rotate_ref(q, pos), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(got_k.double(), _rotate_ref(k, pos), atol=2e-6, rtol=1e-5)
    assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)


def test_a_table_that_requires_grad_gets_its_gradient_after_inference_calls():
    alibi = ALiBi(H).double()
    alibi.slopes.requires_grad_(True)  # a user training the derived slopes
    q, k, v = _qkv()
    with torch.no_grad():
        for _ in range(2):
            attend(q, k, v, alibi, backend="sdpa")  # kept: no graph
    attend(q, k, v, alibi, backend="sdpa").sum().backward()
    assert alibi.slopes.grad is not None and float(alibi.slopes.grad.abs().sum()) > 0
