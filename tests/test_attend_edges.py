"""``attend`` and ``attention_mask`` (posenc.torch.attention): what the mutation run left unpinned.

* every refusal of ``attend`` has its exact message, and each ``or`` condition of a refusal
  is tested alone (one bad tensor, one bad dimension at a time);
* given positions (``k_positions``, ``q_positions``, grid coordinates), the default query
  positions (the last ``seq_q`` key positions, tensor or range), the padding mask, the
  encoding's softmax scale and the ``heads`` check all reach the result;
* the per-thread mask workspace is reallocated when its shape, dtype or device alone
  changes, and is free again once ``attend`` returns;
* the mask and the output stay on the inputs' device and in their dtype (checked with
  ``with torch.device("meta")`` around calls on CPU tensors).

Values are checked against a float64 NumPy softmax attention written here, with the
ALiBi bias from the NumPy reference ``posenc.alibi_bias``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from expect import raises_exactly

import posenc
from posenc.torch import ALiBi, AxialRotaryEmbedding, PositionalEncoding, attend, attention_mask
from posenc.torch.attention import core as core_mod
from posenc.torch.attention import mask as mask_mod


def _ref(q, k, v, *, bias=None, allowed=None, scale=None):
    """Float64 softmax attention: ``q (b,h,sq,d)``, ``k, v (b,kvh,sk,·)``, ``bias`` and
    ``allowed`` broadcast to ``(b,h,sq,sk)``."""
    q, k, v = (np.asarray(t.detach().double()) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.swapaxes(-1, -2) * scale
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def _qkv(b=1, h=2, kvh=2, sq=3, sk=3, d=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g, dtype=dtype)
    k = torch.randn(b, kvh, sk, d, generator=g, dtype=dtype)
    v = torch.randn(b, kvh, sk, d, generator=g, dtype=dtype)
    return q, k, v


def _causal(sq, sk):
    i = np.arange(sq)[:, None] + sk - sq
    return np.arange(sk)[None] <= i  # (sq, sk), aligned to the end


def _alibi(h, qp, kp, symmetric=False):
    return posenc.alibi_bias(posenc.alibi_slopes(h), qp, kp, symmetric=symmetric)


class _WrongHeads(PositionalEncoding):
    """A score bias with 3 heads and no ``heads`` attribute (so only the bias check sees it)."""

    def score_bias(self, q_positions, k_positions):
        return torch.zeros(1, 3, len(q_positions), len(k_positions))


class _HalfScale(PositionalEncoding):
    """No position at all, softmax scale 0.3 whatever the head width (default: 0.5 here)."""

    def softmax_scale(self, head_dim):
        return 0.3


# --- refusals ---------------------------------------------------------------------------


def test_non_causal_refused_for_causal_only_alibi():
    alibi = ALiBi(2)
    q, k, v = _qkv()
    with raises_exactly(
        f"encoding {alibi!r} is for causal attention only (causal=False was given)"
    ):
        attend(q, k, v, alibi, causal=False)


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_one_3d_tensor_is_refused_with_all_shapes(bad):
    qkv = list(_qkv())
    qkv[bad] = qkv[bad][0]
    shapes = ", ".join(str(tuple(t.shape)) for t in qkv)
    with raises_exactly(f"q, k, v must be 4-D, got {shapes}"):
        attend(*qkv)
    assert shapes.count("(2, 3, 4)") == 1  # exactly the one bad tensor is 3-D


@pytest.mark.parametrize(("bad", "name"), [(0, "q"), (1, "k"), (2, "v")])
def test_integer_tensor_refused_by_name(bad, name):
    qkv = list(_qkv())
    qkv[bad] = torch.zeros(qkv[bad].shape, dtype=torch.int64)
    with raises_exactly(f"{name} must be a floating-point tensor, got dtype torch.int64"):
        attend(*qkv)


@pytest.mark.parametrize(
    ("kshape", "vshape"),
    [
        ((2, 2, 3, 4), (2, 2, 3, 4)),  # k and v batch 2, q batch 1 (k's batch alone)
        ((1, 2, 3, 4), (1, 2, 5, 4)),  # v's seq differs from k's (v alone)
        ((1, 2, 3, 4), (1, 1, 3, 4)),  # v's heads differ from k's
        ((1, 3, 3, 4), (1, 3, 3, 4)),  # kv_heads 3 does not divide heads 2 (alone)
    ],
)
def test_bad_kv_shapes_refused_with_all_shapes(kshape, vshape):
    q = torch.zeros(1, 2, 3, 4)
    k, v = torch.zeros(kshape), torch.zeros(vshape)
    with raises_exactly(
        "k and v must be (batch, kv_heads, seq_k, ·) with kv_heads dividing heads, got "
        f"q (1, 2, 3, 4), k {kshape}, v {vshape}"
    ):
        attend(q, k, v, causal=False)


def test_causal_more_queries_than_keys_refused():
    q, k, v = _qkv(sq=4, sk=3)
    with raises_exactly("causal attention needs seq_q <= seq_k, got 4 and 3"):
        attend(q, k, v)
    attend(*_qkv(sq=3, sk=3))  # the boundary seq_q == seq_k is accepted


def test_bias_with_other_heads_refused():
    q, k, v = _qkv(h=2, kvh=2)
    with raises_exactly("_WrongHeads.score_bias gives 3 heads, attention has 2"):
        attend(q, k, v, _WrongHeads(), causal=False, backend="sdpa")
    with raises_exactly("ALiBi.score_bias gives 4 heads, attention has 2"):
        attention_mask(ALiBi(4), range(3), range(3), causal=True, heads=2, dtype=torch.float32)


def test_grid_positions_refused_for_one_axis_encoding():
    q, k, v = _qkv(sq=2, sk=3)
    grid = torch.zeros(1, 3, 2, dtype=torch.int64)
    with raises_exactly("positions must have shape (seq,) or (batch, seq) = (1, 3), got (1, 3, 2)"):
        attend(q, k, v, k_positions=grid)
    with raises_exactly("positions must have shape (seq,) or (batch, seq) = (1, 2), got (1, 2, 2)"):
        attend(q, k, v, q_positions=grid[:, :2])


# --- values -----------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_given_k_positions_and_default_q_positions_from_them(causal):
    # keys at 0, 2, 5, 9: the two queries default to positions 5 and 9 (not 2 and 3); the
    # symmetric bias -m|i - j| is not a per-row constant shift, so it sees the queries' own
    # positions (the causal -m(i - j) sees only the keys')
    q, k, v = _qkv(h=2, sq=2, sk=4)
    kp = torch.tensor([0, 2, 5, 9])
    alibi = ALiBi(2, symmetric=not causal).double()
    with torch.no_grad():
        got = attend(q, k, v, alibi, k_positions=kp, causal=causal, backend="sdpa")
    bias = _alibi(2, [5, 9], [0, 2, 5, 9], symmetric=not causal)
    want = _ref(q, k, v, bias=bias, allowed=_causal(2, 4) if causal else None)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_given_q_positions_per_batch():
    # two batches, query positions given per batch, non-causal symmetric ALiBi
    q, k, v = _qkv(b=2, h=2, sq=2, sk=3)
    qp = torch.tensor([[7, 1], [0, 4]])
    alibi = ALiBi(2, symmetric=True).double()
    with torch.no_grad():
        got = attend(q, k, v, alibi, q_positions=qp, causal=False, backend="sdpa")
    bias = np.stack([_alibi(2, qp[i].tolist(), [0, 1, 2], symmetric=True) for i in range(2)])
    np.testing.assert_allclose(got.numpy(), _ref(q, k, v, bias=bias), rtol=0, atol=1e-12)


def test_grid_q_positions_accepted_by_two_axis_encoding():
    torch.manual_seed(0)
    enc = AxialRotaryEmbedding(8, n_axes=2, max_len=16).double()
    q, k, v = _qkv(h=2, sq=2, sk=2, d=8)
    coords = torch.tensor([[[0, 1], [2, 3]]])
    got = attend(q, k, v, enc, q_positions=coords, k_positions=coords, causal=False)
    qe, ke = enc.encode_qk(q, k, coords, coords)
    np.testing.assert_allclose(got.numpy(), _ref(qe, ke, v), rtol=0, atol=1e-12)


@pytest.mark.parametrize("alibi", [False, True])
def test_padding_mask_hides_keys(alibi):
    q, k, v = _qkv(b=2, h=2, sq=3, sk=3)
    pad = torch.tensor([[True, True, True], [False, True, True]])
    enc = ALiBi(2).double() if alibi else None
    with torch.no_grad():
        got = attend(q, k, v, enc, padding_mask=pad, backend="sdpa")
    i = np.arange(3)
    allowed = (_causal(3, 3)[None, None] & pad.numpy()[:, None, None, :]) | (
        i[:, None] == i[None, :]
    )
    bias = _alibi(2, range(3), range(3)) if alibi else None
    want = _ref(q, k, v, bias=bias, allowed=allowed)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_bad_padding_mask_refused():
    q, k, v = _qkv(b=2, sq=3, sk=3)
    with raises_exactly(
        "padding_mask must be a bool tensor of shape (2, 3), got torch.bool (1, 3)"
    ):
        attend(q, k, v, padding_mask=torch.ones(1, 3, dtype=torch.bool))


def test_encoding_softmax_scale_is_used():
    q, k, v = _qkv(sq=3, sk=3)
    got = attend(q, k, v, _HalfScale(), causal=False)
    np.testing.assert_allclose(got.numpy(), _ref(q, k, v, scale=0.3), rtol=0, atol=1e-12)


# --- mask workspace ---------------------------------------------------------------------


def _alibi_call(dtype, sq, sk, seed=0):
    q, k, v = _qkv(h=2, sq=sq, sk=sk, dtype=dtype, seed=seed)
    alibi = ALiBi(2).double()  # bias computed in float64, rounded once to ``dtype``
    with torch.no_grad():
        got = attend(q, k, v, alibi, backend="sdpa")
    assert got.dtype == dtype
    return got, _ref(q, k, v, bias=_alibi(2, range(sk - sq, sk), range(sk)),
                     allowed=_causal(sq, sk))  # fmt: skip


def test_workspace_follows_dtype_and_shape_changes():
    _alibi_call(torch.float32, 3, 4)
    got, want = _alibi_call(torch.float64, 3, 4, seed=1)  # dtype alone changes
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    got, want = _alibi_call(torch.float64, 2, 5, seed=2)  # shape alone changes
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    got, want = _alibi_call(torch.float32, 2, 5, seed=3)  # dtype alone, back
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-5)


def test_workspace_is_free_after_attend_and_reused():
    _alibi_call(torch.float64, 2, 3)
    assert getattr(mask_mod._LOCAL, "holder", None) is None
    buf = mask_mod._LOCAL.mask
    got, want = _alibi_call(torch.float64, 2, 3, seed=4)
    assert mask_mod._LOCAL.mask is buf  # same shape, dtype, device: reused
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_workspace_follows_device_change_alone():
    step = core_mod.Step(range(2), range(2), None, 0)
    cpu = mask_mod._workspace((1, 2, 2, 2), torch.float32, "cpu", step)
    mask_mod.release(step)
    meta = mask_mod._workspace((1, 2, 2, 2), torch.float32, "meta", step)
    mask_mod.release(step)
    assert cpu.device.type == "cpu"
    assert meta.device.type == "meta"
    assert meta.shape == (1, 2, 2, 2) and meta.dtype == torch.float32


# --- device and dtype of the mask and output --------------------------------------------


def test_attention_mask_in_requested_dtype_and_device():
    with torch.device("meta"):
        mask, is_causal = attention_mask(
            ALiBi(2).double(), range(1, 3), range(3), causal=True, heads=2,
            dtype=torch.float64, device="cpu",
        )  # fmt: skip
    assert not is_causal
    assert mask.device.type == "cpu" and mask.dtype == torch.float64
    want = np.where(_causal(2, 3), _alibi(2, range(1, 3), range(3)), -np.inf)
    np.testing.assert_array_equal(mask[0].numpy(), want)


@pytest.mark.parametrize("padded", [False, True])
def test_attend_stays_on_inputs_device(padded):
    # a fresh shape, so the workspace is allocated under the meta default device
    q, k, v = _qkv(h=2, sq=5, sk=7, d=2, seed=5)
    pad = torch.tensor([[False, True, True, True, True, True, True]]) if padded else None
    with torch.device("meta"), torch.no_grad():
        got = attend(q, k, v, ALiBi(2).double(), padding_mask=pad, backend="sdpa")
    assert got.device.type == "cpu"
    allowed = _causal(5, 7) if pad is None else _causal(5, 7) & pad.numpy()[0]
    want = _ref(q, k, v, bias=_alibi(2, range(2, 7), range(7)), allowed=allowed)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
