"""plan_step's decisions (posenc.torch.cache.step), read from what it hands to ``plan``: the
first slot and key span of a step without a cache, the whole-buffer keys that FlexAttention
gets with a growing cache (asked for, or chosen by ``"auto"`` for a score bias on CUDA: the
device is only named, never used, because ``plan`` is replaced), and position checks that
keep the encoding's number of axes when a cache is used. Then two pieces ``plan`` builds
from: the allowed-slot mask on the device asked for, and SDPA's math kernel forced only for a
mask under a ``torch.func`` transform on the CPU; the per-thread bias buffer shaped by the
rows of positions, written in place, on the device asked for; the mask's dtype; values
narrower or wider than the queries.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from expect import raises_exactly
from test_attend_edges import _WrongHeads  # a score bias with 3 heads

from posenc.torch import (
    ALiBi,
    KVCache,
    PositionalEncoding,
    RotaryEmbedding,
    StaticKVCache,
    T5RelativeBias,
)
from posenc.torch.attention import core as core_mod
from posenc.torch.attention import mask as mask_mod
from posenc.torch.cache import step as step_mod

KW = dict(causal=True, heads=2, dtype=torch.float32)


def _cache():
    return KVCache(layers=1, batch=2, max_len=8, kv_heads=1, key_dim=4, value_dim=4)


def _plan(encoding, *, backend="sdpa", device=None):
    """``plan`` of a 3-token causal step without a cache or padding."""
    return core_mod.plan(encoding, range(3), range(3), key_valid=None, backend=backend,
                              device=device, **KW)  # fmt: skip


def _planned(monkeypatch, encoding, cache, *, positions=None, padding_mask=None, **kw):
    """Run plan_step with ``plan`` replaced: return what plan would have been given."""
    seen = {}
    monkeypatch.setattr(step_mod, "plan", lambda enc, q, k, **a: seen.update(q=q, k=k, **a))
    step_mod.plan_step(encoding, 2, 3, positions, padding_mask, cache, **(KW | kw))
    return seen


def test_without_a_cache_the_step_starts_at_slot_0_over_its_own_keys(monkeypatch):
    mask = torch.tensor([[True, True, True], [False, True, True]])
    seen = _planned(monkeypatch, ALiBi(2), None, padding_mask=mask, backend="sdpa", device=None)
    assert seen["start"] == 0 and seen["full_kv"] is False and seen["cache"] is None
    assert seen["key_valid"] is mask and seen["q"] is seen["k"]
    # positions count the real tokens: the left-padded row starts at its first real one
    assert seen["q"].tolist() == [[0, 1, 2], [0, 0, 1]]


@pytest.mark.parametrize(
    ("encoding", "backend", "device", "whole_buffer"),
    [
        (ALiBi(2), "flex", None, True),  # asked for
        (RotaryEmbedding(4, max_len=8), "flex", None, True),
        (ALiBi(2), "sdpa", "cuda", False),
        (ALiBi(2), "auto", "cuda", True),  # auto: flex for a score bias on CUDA
        (RotaryEmbedding(4, max_len=8), "auto", "cuda", False),  # no score bias: sdpa
        (ALiBi(2), "auto", torch.device("cuda"), True),
        (ALiBi(2), "auto", None, False),  # the CPU: sdpa
        (ALiBi(2), "auto", "cpu", False),
    ],
)
def test_a_growing_cache_gives_flex_the_whole_buffer(
    monkeypatch, encoding, backend, device, whole_buffer
):
    cache = _cache()
    seen = _planned(monkeypatch, encoding, cache, backend=backend, device=device)
    assert seen["full_kv"] is whole_buffer and seen["start"] == 0
    if whole_buffer:  # every slot, the unfilled ones hidden by the cache's valid flags
        assert seen["k"] is cache.positions and seen["key_valid"] is cache.valid
    else:  # the filled slots only
        assert seen["k"] == range(3) and seen["key_valid"] is None


@pytest.mark.parametrize("causal", [True, False])
def test_a_static_cache_hides_its_unfilled_slots_by_a_mask_only_without_causal(monkeypatch, causal):
    cache = StaticKVCache(layers=1, batch=2, max_len=8, kv_heads=1, key_dim=4, value_dim=4)
    seen = _planned(monkeypatch, ALiBi(2), cache, causal=causal, backend="sdpa", device=None)
    assert seen["full_kv"] is True and int(seen["start"]) == 0
    if causal:  # the causal mask hides slots 3.. : no mask, SDPA keeps its causal kernel
        assert seen["key_valid"] is None
    else:
        assert seen["key_valid"].tolist() == [[True] * 3 + [False] * 5] * 2


@pytest.mark.parametrize("static", [False, True])
def test_grid_positions_for_a_one_axis_encoding_are_refused_with_a_cache(static, monkeypatch):
    cache = (StaticKVCache if static else KVCache)(
        layers=1, batch=2, max_len=8, kv_heads=1, key_dim=4, value_dim=4
    )
    grid = torch.zeros(2, 3, 2, dtype=torch.long)  # (batch, seq, 2 axes)
    message = "positions must have shape (seq,) or (batch, seq) = (2, 3), got (2, 3, 2)"
    with raises_exactly(message):
        _planned(monkeypatch, RotaryEmbedding(4, max_len=8), cache, positions=grid,
                 backend="sdpa", device=None)  # fmt: skip
    assert len(cache) == 0


# --- the mask pieces plan builds from ------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_allowed_slots_are_built_on_the_device_asked_for(causal):
    # key_valid on the CPU, mask on another device (meta stands in for a GPU)
    key_valid = torch.tensor([[True, False, True, True]])
    allowed = mask_mod._allowed(2, 4, causal, key_valid, "meta")
    assert allowed.device.type == "meta" and allowed.shape == (1, 1, 2, 4)
    on_cpu = mask_mod._allowed(2, 4, causal, key_valid, "cpu")  # the values, for reference
    want = [[True, False, True, not causal], [True, False, True, True]]
    assert on_cpu[0, 0].tolist() == want
    docs = torch.tensor([[0, 0, 1, 1]])  # and document ids on the CPU, likewise
    allowed = mask_mod._allowed(4, 4, causal, None, "meta", documents=(docs, docs))
    assert allowed.device.type == "meta" and allowed.shape == (1, 1, 4, 4)


def test_the_math_kernel_is_forced_only_for_a_transformed_cpu_mask():
    mask = torch.zeros(1, 1, 2, 2)
    assert isinstance(core_mod._kernels_for(mask), contextlib.nullcontext)
    assert isinstance(core_mod._kernels_for(None), contextlib.nullcontext)
    kinds = []
    torch.func.vmap(lambda m: kinds.append(type(core_mod._kernels_for(m))) or m)(mask[None])
    assert kinds and kinds[0] is not contextlib.nullcontext


def _step(q_positions):
    return core_mod.Step(q_positions, q_positions, None, 0)


@pytest.mark.parametrize("rows", [1, 2])
def test_the_reused_bias_buffer_has_one_row_per_position_row(rows, no_kept_masks):
    # inference with a step: the score bias goes into the per-thread workspace, shaped
    # (rows of positions, heads, seq_q, seq_k); positions per row (2 rows, 5 tokens) differ
    pos = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])[:rows]
    alibi = ALiBi(2)
    want, _ = mask_mod.attention_mask(
        alibi, pos, pos, causal=True, heads=2, dtype=torch.float32
    )  # no step: a fresh tensor
    step = _step(pos)
    try:
        with torch.no_grad():
            got, _ = mask_mod._mask(alibi, pos, pos, True, None, 2, torch.float32, None, step)
        assert step.holds_workspace and got.shape == (rows, 2, 5, 5)
        assert got is mask_mod._LOCAL.mask  # written in place, no fresh (b, h, sq, sk)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    finally:
        mask_mod.release(step)


class _OnItsDevice(PositionalEncoding):
    """A score bias written into the buffer it is given, on that buffer's device."""

    def score_bias(self, q_positions, k_positions, *, out=None):
        return out.fill_(0.5)


def test_the_reused_bias_buffer_is_made_on_the_device_asked_for(no_kept_masks):
    step = _step(range(3))
    try:
        with torch.no_grad():
            got, _ = mask_mod._mask(_OnItsDevice(), range(3), range(3), True, None, 2,
                                         torch.float32, "meta", step)  # fmt: skip
        assert step.holds_workspace and got.device.type == "meta" and got.shape == (1, 2, 3, 3)
    finally:
        mask_mod.release(step)


@pytest.mark.parametrize("causal", [False, True])
def test_a_score_bias_mask_comes_in_the_dtype_asked_for(causal):
    # T5's bias is computed in float32; the mask is rounded to the dtype SDPA will get
    t5 = T5RelativeBias(2, bidirectional=True)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        mask, is_causal = mask_mod.attention_mask(
            t5, range(3), range(3), causal=causal, heads=2, dtype=dtype
        )
        want = t5.score_bias(range(3), range(3)).double()  # (1, 2, 3, 3)
        if causal:
            want = want.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
        assert mask.dtype == dtype and not is_causal
        torch.testing.assert_close(mask.double(), want.to(dtype).double(), rtol=0, atol=0)


@pytest.mark.parametrize("v_dim", [3, 6])
def test_values_narrower_or_wider_than_the_queries(v_dim):
    # SDPA gets v zero-padded to the q/k width when narrower; wider v passes as it is. 8 heads
    # and 8 queries, both more than v_dim, so a pad computed from either would show.
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 8, 8, 4, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 8, 8, v_dim, generator=g, dtype=torch.float64)
    got = core_mod.attend(q, k, v, causal=False)
    weights = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1)  # scale 1 / sqrt(4)
    assert got.shape == (1, 8, 8, v_dim)
    torch.testing.assert_close(got, weights @ v, rtol=0, atol=1e-12)


def test_a_plan_without_a_cache_starts_at_slot_0():
    step = _plan(ALiBi(2))
    assert step.start == 0 and step.full_kv is False and step.cache is None
    mask_mod.release(step)


@pytest.mark.parametrize("device", ["cuda", torch.device("cuda")])
def test_auto_plans_flex_for_a_score_bias_on_cuda_with_the_mask_there(monkeypatch, device):
    # flex_plan replaced: the CUDA device is only named, never used
    seen = {}
    monkeypatch.setattr(core_mod, "flex_plan", lambda *a, **kw: seen.update(kw) or (1, 2))
    step = _plan(ALiBi(2), backend="auto", device=device)
    assert step.backend == "flex" and (step.score_mod, step.block_mask) == (1, 2)
    assert seen["device"] == device and seen["causal"] is True and seen["q_start"] is None


def test_a_plan_that_fails_gives_the_workspace_back(no_kept_masks):
    with torch.no_grad(), pytest.raises(ValueError, match="gives 3 heads, attention has 2"):
        _plan(_WrongHeads())
    assert getattr(mask_mod._LOCAL, "holder", None) is None
    with torch.no_grad():  # the next step gets it
        step = _plan(ALiBi(2))
    assert step.holds_workspace
    mask_mod.release(step)


def test_a_step_released_from_another_thread_is_left_to_its_own(no_kept_masks):
    with torch.no_grad():
        step = _plan(ALiBi(2))
    errors = []
    worker = threading.Thread(target=lambda: _release_or_record(step, errors))
    worker.start()
    worker.join()
    assert errors == [] and mask_mod._LOCAL.holder is step  # still this thread's
    mask_mod.release(step)
    assert mask_mod._LOCAL.holder is None and step.holds_workspace is False


def _release_or_record(step, errors):
    try:
        mask_mod.release(step)  # another thread: its workspace, not this step's
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def test_a_narrower_v_is_padded_to_the_query_width_for_the_fused_kernels(monkeypatch):
    # MLA's heads: q and k 16 wide, v 8; SDPA's fused kernels need one width, so v is
    # zero-padded (2-5x faster than the math kernel) and the output cut back to v's width
    import torch.nn.functional as F

    widths, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        widths.append(v.shape[-1])
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 16, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64)
    pos = torch.arange(5)[None]
    out = core_mod.attend(q, k, v, None, q_positions=pos, k_positions=pos, backend="sdpa")
    assert widths == [16] and out.shape == (1, 2, 5, 8)
    hidden = torch.ones(5, 5, dtype=torch.bool).triu(1)
    s = (q @ k.transpose(-1, -2) / 4).masked_fill(hidden, float("-inf"))
    torch.testing.assert_close(out, s.softmax(-1) @ v, rtol=0, atol=1e-12)
