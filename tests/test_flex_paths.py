"""The FlexAttention backend without torch.compile: block masks, offsets, caches, ``"auto"``.

Each check runs FlexAttention *eagerly* (so the mutation run, which skips compile tests,
sees the flex planning code) and compares it with the dense SDPA path of the same plan,
itself checked against NumPy in ``tests/test_kv_cache.py``.
"""

from __future__ import annotations

import pytest
import torch
from test_kv_cache import LEFT_PAD, LEFT_POS, V, make_lm
from torch.nn.attention.flex_attention import flex_attention

from posenc.torch import FIRE, KERPLE, ALiBi, NoPE, RotaryEmbedding, T5RelativeBias
from posenc.torch.attention import flex as _flex
from posenc.torch.attention.core import _run, plan, resolve_backend
from posenc.torch.attention.mask import release

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
HEADS, HD = 4, 8


def _encodings():
    torch.manual_seed(0)
    return {
        "alibi": ALiBi(HEADS),
        "t5": T5RelativeBias(HEADS, num_buckets=8, max_distance=6),
        "kerple": KERPLE(HEADS),
        "fire": FIRE(HEADS, hidden=8, threshold=3.0),  # queries past L: a table per query
        "fire-below-threshold": FIRE(HEADS, hidden=8),  # L = 512: one table per distance
    }


# (seq_q, seq_k, key_valid, q_start, full_kv): the layouts a model step can have
PAD = torch.tensor([[False, False, True, True, True, True, True, True, True],
                    [True] * 9])  # fmt: skip
LAYOUTS = {
    "square": (9, 9, None, 0, False),
    "queries-last": (3, 9, None, 6, False),
    "padded": (9, 9, PAD, 0, False),
    "buffer-int": (2, 9, None, 4, True),  # slots 6.. unfilled: only causality hides them
    "buffer-tensor": (2, 9, None, torch.tensor(4), True),
    "buffer-padded": (1, 9, PAD & (torch.arange(9) < 5), torch.tensor(4), True),
}


def _both(enc, layout, causal=True):
    sq, sk, valid, start, full = LAYOUTS[layout]
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, HEADS, sq, HD, generator=g)
    k, v = (torch.randn(2, HEADS, sk, HD, generator=g) for _ in range(2))
    first = int(start) if full else sk - sq
    qp, kp = range(first, first + sq), range(sk)
    kw = {"causal": causal, "key_valid": valid, "heads": HEADS, "dtype": q.dtype,
          "device": q.device, "start": start, "full_kv": full}  # fmt: skip
    with torch.no_grad():
        sdpa = plan(enc, qp, kp, backend="sdpa", **kw)  # holds the mask workspace ...
        dense = _run(q, k, v, sdpa, HD**-0.5)
        release(sdpa)  # ... until released, as a model step does
        step = plan(enc, qp, kp, backend="flex", **kw)
        flex = flex_attention(
            q, k, v, score_mod=step.score_mod, block_mask=step.block_mask, scale=HD**-0.5
        )
    return flex, dense, step


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(_encodings()))
def test_eager_flex_plan_equals_dense_mask(name, layout):
    flex, dense, step = _both(_encodings()[name], layout)
    assert step.block_mask is not None
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


def test_unfilled_buffer_slots_are_hidden():
    # a buffer layout must not see the slots after its queries (they hold garbage in a cache)
    enc = ALiBi(HEADS)
    flex, dense, _ = _both(enc, "buffer-int")
    sq, sk, _, start, _ = LAYOUTS["buffer-int"]
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, HEADS, sq, HD, generator=g)
    k, v = (torch.randn(2, HEADS, sk, HD, generator=g) for _ in range(2))
    with torch.no_grad():  # the same queries over only the filled keys 0 .. 5
        kw = {"causal": True, "key_valid": None, "heads": HEADS, "dtype": q.dtype}
        step = plan(enc, range(4, 6), range(6), backend="sdpa", device=None, **kw)
        filled = _run(q, k[:, :, :6], v[:, :, :6], step, HD**-0.5)
        release(step)
    torch.testing.assert_close(dense, filled, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(flex, filled, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keys", [range(10), range(3, 7)])
@pytest.mark.parametrize("threshold", [3.0, 8.0, 512.0])
def test_fire_table_per_distance_equals_bias(threshold, keys):
    # queries 2..9: past L (3), straddling it (8: query 9 is past), below it; keys that
    # end before the queries do (distances up to 9 - 3)
    torch.manual_seed(0)
    fire = FIRE(HEADS, hidden=8, threshold=threshold)
    with torch.no_grad():
        for p in fire.parameters():
            p.add_(0.3 * torch.randn_like(p))
    qp = range(2, 10)
    mod = fire.score_mod(qp, keys)
    cells = dict(zip(mod.__code__.co_freevars, mod.__closure__, strict=True))
    rows = 1 if threshold >= 9 else 8  # one row per distance, or per query and distance
    assert cells["table"].cell_contents.shape == (rows, 10, HEADS)
    q_idx, kv_idx = torch.meshgrid(torch.arange(8), torch.arange(len(keys)), indexing="ij")
    with torch.no_grad():
        bias = fire.score_bias(qp, keys)[0]  # (heads, sq, sk)
        got = torch.stack([mod(torch.zeros(()), 0, h, q_idx, kv_idx) for h in range(HEADS)])
    torch.testing.assert_close(got, bias, rtol=1e-6, atol=1e-6)


def test_bidirectional_without_padding_has_no_block_mask():
    flex, dense, step = _both(ALiBi(HEADS, symmetric=True), "square", causal=False)
    assert step.block_mask is None
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


def test_causal_block_mask_is_built_once_per_shape_and_offset():
    _flex._MASKS.clear()
    a = _flex._causal_block_mask(4, 8, 4, None)
    assert _flex._causal_block_mask(4, 8, 4, "cpu") is a  # reused: no rebuild per call
    b = _flex._causal_block_mask(4, 8, 3, None)
    assert b is not a
    dense_a, dense_b = a.to_dense(), b.to_dense()  # (1, 1, q_blocks, kv_blocks)
    assert dense_a.shape == dense_b.shape == (1, 1, 1, 1)
    for n in range(_flex._MASKS_KEPT + 2):  # bounded: the oldest masks are dropped
        _flex._causal_block_mask(1, n + 1, n, None)
    assert len(_flex._MASKS) == _flex._MASKS_KEPT and a not in _flex._MASKS.values()
    # the offset is in the mask: query 0 at slot 3 sees keys 0..3, at slot 4 keys 0..4
    q, k = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 8, 8)
    v = torch.arange(8.0)[None, None, :, None].expand(1, 1, 8, 8)
    with torch.no_grad():
        mean3 = flex_attention(q, k, v, block_mask=_flex._causal_block_mask(4, 8, 3, None))
        mean4 = flex_attention(q, k, v, block_mask=_flex._causal_block_mask(4, 8, 4, None))
    assert mean3[0, 0, :, 0].tolist() == [1.5, 2.0, 2.5, 3.0]  # mean of 0..3, 0..4, ...
    assert mean4[0, 0, :, 0].tolist() == [2.0, 2.5, 3.0, 3.5]


def test_auto_backend_is_flex_for_score_biases_on_cuda_only():
    assert resolve_backend("auto", ALiBi(4), torch.device("cuda")) == "flex"
    assert resolve_backend("auto", T5RelativeBias(4), "cuda:0") == "flex"
    assert resolve_backend("auto", ALiBi(4), torch.device("cpu")) == "sdpa"
    assert resolve_backend("auto", ALiBi(4), None) == "sdpa"
    assert resolve_backend("auto", NoPE(), "cuda") == "sdpa"  # no bias: SDPA's fused kernels
    assert resolve_backend("auto", RotaryEmbedding(8, max_len=8), "cuda") == "sdpa"
    assert resolve_backend("sdpa", ALiBi(4), "cuda") == "sdpa"
    assert resolve_backend("flex", NoPE(), "cpu") == "flex"
    assert make_lm("alibi").backend == "sdpa"  # make_lm's default; the class default is auto
    from posenc.torch import TransformerLM

    assert TransformerLM(V, 16, 1, 4, encoding=NoPE()).blocks[0].attn.backend == "auto"
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'sdpa', 'flex'\)"):
        TransformerLM(V, 16, 1, 4, encoding=NoPE(), backend="dense")


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire", "rope_half"])
@pytest.mark.parametrize("static", [False, True])
def test_model_flex_decode_equals_sdpa_with_eager_flex(name, static, monkeypatch):
    # the model's flex path, with FlexAttention left eager (the compiled one is swapped out)
    monkeypatch.setitem(_flex._FLEX, "cpu", flex_attention)
    lm = make_lm(name, depth=2, backend="flex").float()
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = lm.new_cache(2, 14 if static else 12, static=static)
        out = [lm(idx[:, :7], LEFT_POS[:, :7], LEFT_PAD[:, :7], cache=cache)]
        out += [lm(idx[:, t : t + 1], cache=cache) for t in range(7, 12)]
        full_flex = lm(idx, LEFT_POS, LEFT_PAD)
        for block in lm.blocks:
            block.attn.backend = "sdpa"
        full = lm(idx, LEFT_POS, LEFT_PAD)
    torch.testing.assert_close(torch.cat(out, 1), full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(full_flex, full, rtol=1e-4, atol=1e-4)


def test_one_block_mask_per_model_step_shared_by_layers(monkeypatch):
    import torch.nn.attention.flex_attention as fa

    built = []
    real = fa.create_block_mask
    monkeypatch.setattr(fa, "create_block_mask", lambda *a, **k: built.append(1) or real(*a, **k))
    monkeypatch.setitem(_flex._FLEX, "cpu", flex_attention)
    _flex._MASKS.clear()
    lm = make_lm("alibi", depth=3, backend="flex").float()
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        lm(idx, LEFT_POS, LEFT_PAD)  # padding: a mask of its own, once for the 3 layers
        assert len(built) == 1
        lm(idx)  # causal only: built once for this shape ...
        lm(idx)  # ... and reused by the next call
        assert len(built) == 2


@pytest.mark.parametrize("documents", [False, True])
def test_flex_plan_traces_whole_under_dynamo(documents):
    # torch.compile(fullgraph=True) traces flex_plan's mask closure; dynamo refuses a closure
    # over a variable bound in one branch only ("Read uninitialized cell"), which broke every
    # compiled decode step with a score bias on CUDA. backend="eager": the trace, not inductor.
    torch._dynamo.reset()
    lm = make_lm("alibi", depth=2, backend="flex").float().eval()
    idx = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2], [0, 0, 0, 0, 0, 1, 1, 1, 1]])
    kw = {"documents": docs} if documents else {}
    step = torch.compile(lm, fullgraph=True, backend="eager")
    with torch.no_grad():
        cache = lm.new_cache(2, 12, static=True)
        if documents:  # a packed training step: the whole rows, no cache
            out = [step(idx, documents=docs)]
        else:
            out = [step(idx[:, :6], cache=cache)]
            out += [step(idx[:, t : t + 1], cache=cache) for t in range(6, 9)]
        for block in lm.blocks:
            block.attn.backend = "sdpa"
        full = lm(idx, **kw)
    torch.testing.assert_close(torch.cat(out, 1), full[:, : sum(o.shape[1] for o in out)],
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    torch._dynamo.reset()


def test_compiled_documents_are_checked_as_eager_ones_are():
    # under torch.compile the checks are ops (no host read to branch on); they still refuse
    torch._dynamo.reset()
    lm = make_lm("alibi", depth=1, backend="flex").float().eval()
    step = torch.compile(lm, fullgraph=True, backend="eager")
    idx = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with pytest.raises(ValueError, match="documents must not decrease along a row"):
            step(idx, documents=torch.tensor([[0, 0, 1, 1, 0, 0]]))
        with pytest.raises(ValueError, match="^positions at a document start must be < 1, got 3$"):
            step(
                idx,
                torch.tensor([[0, 1, 2, 3, 4, 5]]),
                documents=torch.tensor([[0, 0, 0, 1, 1, 1]]),
            )
        good = step(
            idx, torch.tensor([[0, 1, 2, 0, 1, 2]]), documents=torch.tensor([[0, 0, 0, 1, 1, 1]])
        )
        want = lm(idx, documents=torch.tensor([[0, 0, 0, 1, 1, 1]]))
    torch.testing.assert_close(good, want)
    torch._dynamo.reset()


def test_tensor_positions_without_limits_take_the_plain_causal_mask():
    # causal and unpadded, positions given as tensors (not ranges): the block mask is the
    # shape's causal one, with no range starts to read (ALiBi's bias reads the positions)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, HEADS, 9, HD, generator=g) for _ in range(3))
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]])
    kw = {"causal": True, "key_valid": None, "heads": HEADS, "dtype": q.dtype,
          "device": q.device, "start": 0, "full_kv": False}  # fmt: skip
    with torch.no_grad():
        sdpa = plan(ALiBi(HEADS), pos, pos, backend="sdpa", **kw)
        dense = _run(q, k, v, sdpa, HD**-0.5)
        release(sdpa)
        step = plan(ALiBi(HEADS), pos, pos, backend="flex", **kw)
        flex = flex_attention(
            q, k, v, score_mod=step.score_mod, block_mask=step.block_mask, scale=HD**-0.5
        )
    torch.testing.assert_close(flex, dense, rtol=0, atol=1e-5)


@pytest.mark.parametrize("limits", [(3, None), (None, 4)], ids=["window", "chunk"])
def test_plain_causal_block_mask_counts_a_window_from_the_range_starts(limits):
    # three queries at positions 6-8 over keys 0-8 (queries last), ranges: the block mask of
    # the shape, whose window and chunk count positions from the ranges' starts
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, HEADS, 3, HD, generator=g)
    k, v = (torch.randn(1, HEADS, 9, HD, generator=g) for _ in range(2))
    kw = {"causal": True, "key_valid": None, "heads": HEADS, "dtype": q.dtype,
          "device": q.device, "start": 6, "full_kv": False, "limits": limits}  # fmt: skip
    with torch.no_grad():
        sdpa = plan(NoPE(), range(6, 9), range(9), backend="sdpa", **kw)
        dense = _run(q, k, v, sdpa, HD**-0.5)
        release(sdpa)
        step = plan(NoPE(), range(6, 9), range(9), backend="flex", **kw)
        flex = flex_attention(q, k, v, block_mask=step.block_mask, scale=HD**-0.5)
    i, j = torch.arange(6, 9)[:, None], torch.arange(9)[None]  # float64 reference below
    seen = (j <= i) & ((i - j < 3) if limits[0] else (i // 4 == j // 4))
    s = (q.double() @ k.double().transpose(-1, -2) * HD**-0.5).masked_fill(~seen, float("-inf"))
    torch.testing.assert_close(dense.double(), s.softmax(-1) @ v.double(), rtol=0, atol=1e-6)
    torch.testing.assert_close(flex, dense, rtol=0, atol=1e-5)
