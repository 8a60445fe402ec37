"""The last call kept on each encoding (``reuse.last_call``): every way a repeated ``attend``
call can differ from the one kept, each against a float64 formula. Each test fails when the
comparison it names is taken out of ``last_call`` (seen failing, one by one)."""

import copy
import pickle

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import posenc
from posenc.torch import ALiBi, PoPE, RotaryEmbedding
from posenc.torch.attention.core import attend

B, H, D, SK = 1, 6, 8, 40  # six heads: slopes that are not powers of two


def _qkv(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=g, dtype=torch.float64)  # one query, at the end
    k, v = (torch.randn(B, H, SK, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _ref(q, k, v, slopes):
    """Float64 attention of the last position over every key with ALiBi's -m_h (i - j)."""
    q, k, v = q.double(), k.double(), v.double()
    dist = (SK - 1) - torch.arange(SK, dtype=torch.float64)  # i - j, (SK,)
    bias = -torch.as_tensor(slopes, dtype=torch.float64)[:, None, None] * dist  # (H, 1, SK)
    return ((q @ k.transpose(-1, -2)) * D**-0.5 + bias).softmax(-1) @ v


def _kept(alibi, q, k, v):
    with torch.no_grad():
        attend(q, k, v, alibi, backend="sdpa")
    assert "_last_call" in alibi.__dict__  # the call is kept: the next one may use it


def test_a_table_swapped_for_a_view_at_the_same_address_is_seen():
    alibi, (q, k, v) = ALiBi(H).double(), _qkv(torch.float64)
    _kept(alibi, q, k, v)
    old = alibi.slopes
    same = old.as_strided((H,), (0,))  # same address and version counter, every slope m_0
    alibi.register_buffer("slopes", same, persistent=False)  # no attribute set: no count
    with torch.no_grad():
        out = attend(q, k, v, alibi, backend="sdpa")
    torch.testing.assert_close(out, _ref(q, k, v, [old[0].item()] * H), rtol=1e-12, atol=1e-12)


def test_a_table_written_through_data_is_seen():
    alibi, (q, k, v) = ALiBi(H).double(), _qkv(torch.float64)
    _kept(alibi, q, k, v)
    new = torch.linspace(0.05, 0.6, H, dtype=torch.float64)
    alibi.slopes.data = new.clone()  # the same tensor object, new memory, no version bump
    with torch.no_grad():
        out = attend(q, k, v, alibi, backend="sdpa")
    torch.testing.assert_close(out, _ref(q, k, v, new), rtol=1e-12, atol=1e-12)


def test_a_table_that_starts_to_require_grad_gets_its_gradient():
    alibi, (q, k, v) = ALiBi(H).double(), _qkv(torch.float64)
    _kept(alibi, q, k, v)
    alibi.slopes.requires_grad_(True)  # in place: no version bump, no attribute set
    out = attend(q, k, v, alibi, backend="sdpa")
    out.sum().backward()
    slopes = alibi.slopes.detach().clone().requires_grad_(True)
    _ref(q, k, v, slopes).sum().backward()
    assert alibi.slopes.grad is not None
    torch.testing.assert_close(alibi.slopes.grad, slopes.grad, rtol=1e-10, atol=1e-12)


def _two_queries():  # two queries at the end: a causal mask (SDPA's own is aligned top-left)
    g = torch.Generator().manual_seed(1)
    return [torch.randn(B, H, n, D, generator=g) for n in (2, SK, SK)]


def test_the_same_call_on_another_device_is_planned_there():
    q, k, v = _two_queries()
    with torch.no_grad():
        attend(q, k, v, backend="sdpa")  # kept, with its mask on the CPU
        out = attend(*(t.to("meta") for t in (q, k, v)), backend="sdpa")
    assert out.device.type == "meta" and out.shape == (B, H, 2, D)


def test_fake_tensors_after_a_real_call_are_planned_anew():
    q, k, v = _two_queries()
    with torch.no_grad():
        attend(q, k, v, backend="sdpa")  # kept, with a real mask
    with FakeTensorMode() as mode, torch.no_grad():
        out = attend(*(mode.from_tensor(t) for t in (q, k, v)), backend="sdpa")
    assert out.shape == (B, H, 2, D)


def test_a_module_cast_to_float64_computes_its_bias_in_float64_again():
    # .double() keeps the float64 slopes (the same tensor) and changes only the work dtype
    heads = 12  # slopes whose products round differently in float32
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, heads, 1, D, generator=g)
    k, v = (torch.randn(B, heads, SK, D, generator=g) for _ in range(2))
    alibi = ALiBi(heads)
    _kept(alibi, q, k, v)
    table = alibi.slopes
    alibi.double()
    assert alibi.slopes is table
    with torch.no_grad():
        out = attend(q, k, v, alibi, backend="sdpa")
        fresh = attend(q, k, v, ALiBi(heads).double(), backend="sdpa")
        before = attend(q, k, v, ALiBi(heads), backend="sdpa")
    assert torch.equal(out, fresh)
    assert not torch.equal(fresh, before)  # the work dtype shows in these numbers


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_copy_starts_without_the_kept_call(clone):
    alibi, (q, k, v) = ALiBi(H).double(), _qkv(torch.float64)
    _kept(alibi, q, k, v)
    twin = clone(alibi)
    assert "_last_call" not in twin.__dict__
    with torch.no_grad():
        out = attend(q, k, v, twin, backend="sdpa")
    torch.testing.assert_close(out, _ref(q, k, v, posenc.alibi_slopes(H)), rtol=1e-12, atol=1e-12)


def test_encodings_without_a_bias_keep_their_calls_and_rotate_every_call():
    rope, (q, k, v) = RotaryEmbedding(D, max_len=64).double(), _qkv(torch.float64)
    with torch.no_grad():
        first = attend(q, k, v, rope, backend="sdpa")
        assert "_last_call" in rope.__dict__
        again = attend(q, k, v, rope, backend="sdpa")
        other = attend(q * 2, k, v, rope, backend="sdpa")  # same shapes, other values
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("heads_k", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("seq_q", [1, 5, 12])
@pytest.mark.parametrize(
    "make",
    [
        lambda: None,
        lambda: RotaryEmbedding(16, max_len=64),
        lambda: ALiBi(4),
        lambda: PoPE(16, heads=4),
    ],  # fmt: skip
    ids=["none", "rope", "alibi", "pope"],
)
def test_a_call_with_sdpas_own_defaults_equals_a_planned_one(make, seq_q, heads_k, monkeypatch):
    # head width 16: posenc's scale 16 ** -0.5 is SDPA's own 1 / sqrt(16), so a kept call
    # that needs no causal flag and no GQA passes SDPA its defaults (the shortest call)
    from posenc.torch.attention import reuse
    from posenc.torch.attention.core import _NOPE

    enc = make()
    enc = enc if enc is None else enc.double()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, seq_q, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, heads_k, 12, 16, generator=g, dtype=torch.float64) for _ in range(2))
    with torch.no_grad():
        first = attend(q, k, v, enc, backend="sdpa")
        again = attend(q, k, v, enc, backend="sdpa")  # the kept call
        plain = (_NOPE if enc is None else enc).__dict__["_last_call"][-1].plain
        monkeypatch.setattr(reuse, "last_call", lambda *a: None)
        monkeypatch.setattr(reuse, "recall", lambda *a: None)
        planned = attend(q, k, v, enc, backend="sdpa")  # every call planned
    assert torch.equal(first, again) and torch.equal(again, planned)
    # causal over all keys: SDPA's flag; grouped heads: its enable_gqa; PoPE: v padded
    own = (seq_q < 12 or isinstance(enc, ALiBi)) and heads_k == 4 and not isinstance(enc, PoPE)
    assert plain == own


def test_a_query_key_hook_set_on_the_instance_runs_on_every_kept_call():
    # places is read from the class: a hook patched onto one instance (or a wrapper whose
    # own encode_qk its places do not show) must still run on the kept calls
    alibi, (q, k, v) = ALiBi(H).double(), _qkv(torch.float64)
    _kept(alibi, q, k, v)
    alibi.encode_qk = lambda q, k, qp, kp, **kw: (2 * q, k)
    with torch.no_grad():
        outs = [attend(q, k, v, alibi, backend="sdpa") for _ in range(2)]
    want = _ref(2 * q, k, v, posenc.alibi_slopes(H))
    for out in outs:
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_a_table_written_while_a_call_runs_is_not_kept_as_the_old_state(monkeypatch):
    # another thread's in-place write after this call built its mask: the state kept with
    # the call is the one read before planning, so the next call sees the write
    from posenc.torch.attention import core

    alibi, (q, k, v) = ALiBi(H).double(), _qkv(torch.float64)
    run, done = core._run, []

    def run_then_write(*args, **kwargs):
        out = run(*args, **kwargs)
        if not done:
            done.append(True)
            with torch.no_grad():
                alibi.slopes.mul_(4)
        return out

    monkeypatch.setattr(core, "_run", run_then_write)
    with torch.no_grad():
        attend(q, k, v, alibi, backend="sdpa")  # planned with the old slopes
        out = attend(q, k, v, alibi, backend="sdpa")
    want = _ref(q, k, v, 4 * torch.as_tensor(posenc.alibi_slopes(H)))
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_a_deleted_setting_is_a_change():
    from posenc.torch import NoPE, SoftmaxFactor

    class Scaled(SoftmaxFactor):
        factor = 1.0  # the class default a deleted instance value falls back to

    enc, (q, k, v) = Scaled(NoPE(), factor=3.0).double(), _qkv(torch.float64)
    with torch.no_grad():
        attend(q, k, v, enc, backend="sdpa")
        attend(q, k, v, enc, backend="sdpa")
        del enc.factor
        out = attend(q, k, v, enc, backend="sdpa")
    torch.testing.assert_close(out, _ref(q, k, v, [0.0] * H), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [np.array(True), torch.tensor(True)], ids=["array", "tensor"])
def test_a_causal_flag_that_is_an_array_or_a_tensor_is_planned_every_call(causal):
    q, k, v = _two_queries()
    with torch.no_grad():
        first = attend(q, k, v, causal=causal, backend="sdpa")
        if isinstance(causal, torch.Tensor):
            causal.fill_(False)  # flipped in place: the next call is not causal
        again = attend(q, k, v, causal=causal, backend="sdpa")
        want = attend(q, k, v, causal=bool(causal), backend="sdpa")
    assert torch.equal(again, want)
    assert first.shape == again.shape
    with pytest.raises(ValueError, match="backend must be one of"):
        attend(q, k, v, backend=["sdpa"])


def test_the_same_call_again_is_served_by_the_kept_call(monkeypatch):
    # what keeping it is for: the repeated call neither keys nor recalls a plan (host time)
    from posenc.torch.attention import reuse

    keyed, call_key = [], reuse.call_key
    monkeypatch.setattr(reuse, "call_key", lambda *a: keyed.append(a) or call_key(*a))
    for encoding in (RotaryEmbedding(D, max_len=64), ALiBi(H), None):
        q, k, v = _qkv()
        with torch.no_grad():
            first = attend(q, k, v, encoding, backend="sdpa")
            keyed.clear()
            again = attend(q, k, v, encoding, backend="sdpa")
        assert keyed == [] and torch.equal(first, again), encoding
