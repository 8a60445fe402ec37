"""A step's mask over range positions is built once per encoding state and reused
(:mod:`posenc.torch.attention.reuse`), and never when reusing it would be wrong."""

import threading

import pytest
import torch

import posenc
from posenc.torch import ALiBi, T5RelativeBias
from posenc.torch.attention import reuse
from posenc.torch.attention.core import attend, plan
from posenc.torch.attention.mask import release

B, H, D, S = 1, 4, 8, 12


def _qkv(seq_q=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, seq_q, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v


def _step_mask(enc):
    kw = {"causal": True, "key_valid": None, "heads": H, "backend": "sdpa",
          "dtype": torch.float64, "device": torch.device("cpu")}  # fmt: skip
    step = plan(enc, range(S - 1, S), range(S), **kw)
    release(step)  # a step that took the thread's workspace gives it back
    return step.mask


def test_a_decode_steps_mask_is_built_once(monkeypatch):
    alibi = ALiBi(H).double()
    first = _step_mask(alibi)
    assert _step_mask(alibi) is first  # kept: the same tensor, no work
    calls = []
    monkeypatch.setattr(ALiBi, "score_bias", lambda *a, **kw: calls.append(1))  # a rebuild
    _step_mask(alibi)
    assert not calls


@pytest.mark.parametrize("seq_q", [1, 5])
def test_kept_masks_give_the_float64_formula(seq_q):
    alibi = ALiBi(H).double()
    q, k, v = _qkv(seq_q)
    i = torch.arange(S - seq_q, S, dtype=torch.float64)[:, None]  # query positions
    j = torch.arange(S, dtype=torch.float64)[None]  # key positions
    slopes = torch.from_numpy(posenc.alibi_slopes(H))[:, None, None]  # (H, 1, 1)
    scores = q @ k.transpose(-1, -2) / D**0.5 - slopes * (i - j)  # (B, H, sq, S)
    want = scores.masked_fill(j > i, float("-inf")).softmax(-1) @ v
    for _ in range(3):  # built, then kept
        torch.testing.assert_close(attend(q, k, v, alibi, backend="sdpa"), want)


def test_a_weight_changed_in_place_is_a_new_mask():
    t5 = T5RelativeBias(H, num_buckets=8, max_distance=16).double()
    with torch.no_grad():
        before = _step_mask(t5).clone()
        t5.weight.add_(1.0)  # an optimizer step under no_grad: in place
        after = _step_mask(t5)
    torch.testing.assert_close(after, before + 1.0)
    with torch.no_grad():
        t5.weight.data = t5.weight.data * 0  # a swapped .data: another storage
        zero = _step_mask(t5)
    assert float(zero.abs().max()) == 0.0


def test_a_learned_bias_is_never_kept():
    t5 = T5RelativeBias(H, num_buckets=8, max_distance=16).double()
    q, k, v = _qkv()
    with torch.no_grad():  # not even in inference: a write through .data shows nowhere
        assert _step_mask(t5) is not _step_mask(t5)
        attend(q, k, v, t5, backend="sdpa")
        t5.weight.data.mul_(50.0)  # old-style init or an EMA copy: no version change
        got = attend(q, k, v, t5, backend="sdpa")
        bias = t5.score_bias(range(S - 1, S), range(S))  # (1, H, 1, S), as written now
        want = (q @ k.transpose(-1, -2) / D**0.5 + bias).softmax(-1) @ v
    torch.testing.assert_close(got, want)
    for _ in range(2):  # ... but a training step builds its own: the weights get gradients,
        attend(q, k, v, t5, backend="sdpa").sum().backward()  # and no graph is reused
        assert t5.weight.grad is not None and float(t5.weight.grad.abs().sum()) > 0


def test_large_masks_tensor_positions_and_the_public_mask_are_not_kept():
    alibi = ALiBi(H)
    assert reuse.key(alibi, range(2048), range(2048), True, H, torch.float32, None,
                     (None, None)) is None  # fmt: skip
    assert reuse.key(alibi, torch.arange(3)[None], range(3), True, H, torch.float32, None,
                     (None, None)) is None  # fmt: skip
    from posenc.torch.attention.mask import attention_mask

    a, _ = attention_mask(alibi, range(3), range(3), causal=True, heads=H, dtype=torch.float32)
    b, _ = attention_mask(alibi, range(3), range(3), causal=True, heads=H, dtype=torch.float32)
    assert a is not b  # handed to the caller, who may write into it


def test_a_setting_changed_by_hand_is_a_new_mask_and_user_encodings_are_not_kept():
    alibi = ALiBi(H).double()
    q, k, v = _qkv()
    attend(q, k, v, alibi, backend="sdpa", causal=True)  # kept
    alibi.symmetric = True  # -m |i - j|, which bidirectional attention takes
    sym = attend(q, k, v, alibi, backend="sdpa", causal=False)
    bias = alibi.score_bias(range(S - 1, S), range(S))  # (1, H, 1, S)
    scores = q @ k.transpose(-1, -2) / D**0.5 + bias
    torch.testing.assert_close(sym, scores.softmax(-1) @ v)

    class Penalty(posenc.torch.PositionalEncoding):  # reads a plain attribute we may change
        scale = 1.0

        def score_bias(self, qp, kp):
            qp, kp = posenc.torch.position_tensor(qp), posenc.torch.position_tensor(kp)
            return -self.scale * (qp[:, None, :, None] - kp[:, None, None, :]).double()

    pen = Penalty()
    assert reuse.key(pen, range(3), range(3), True, H, torch.float64, None, (None, None)) is None


def test_inference_mode_tensors_are_not_kept():
    with torch.inference_mode():
        t5 = T5RelativeBias(H, num_buckets=8, max_distance=16).double()  # no version counters
        args = (range(S - 1, S), range(S), True, H, torch.float64, None, (None, None))
        assert reuse.key(t5, *args) is None  # nothing to key on: built every call
        first = _step_mask(t5).clone()
        torch.testing.assert_close(_step_mask(t5), first)


def test_threads_share_kept_masks_safely():
    alibi = ALiBi(H).double()
    q, k, v = _qkv()
    want = attend(q, k, v, alibi, backend="sdpa")
    errors = []

    def run():
        for _ in range(50):
            if not torch.equal(attend(q, k, v, alibi, backend="sdpa"), want):
                errors.append(1)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_the_size_bound_of_a_kept_mask_counts_its_heads():
    # 8 heads of 384 x 384 scores: 1.18 M elements, over MAX_ELEMENTS (2**20), though one
    # head's 147 k is not; without a head count (a bias shared by the heads) one head counts
    alibi, args = ALiBi(8), (True, torch.float32, "cpu", (None, None))
    big, small = range(384), range(64)
    assert 384 * 384 < reuse.MAX_ELEMENTS < 8 * 384 * 384
    assert reuse.key(alibi, big, big, args[0], 8, *args[1:]) is None
    assert reuse.key(alibi, small, small, args[0], 8, *args[1:]) is not None
    assert reuse.key(alibi, small, small, args[0], None, *args[1:]) is not None
