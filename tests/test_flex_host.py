"""FlexAttention with a score bias asks nothing of the host per call after the first.

On a GPU every ``.item()`` / ``int(t)`` / ``bool(t)`` of a device tensor waits for it (a
stream sync), and every tensor built from Python data (``torch.tensor(x, device=...)``) is a
host-to-device copy, which waits too from pageable memory. Counted on the CPU with
``torch.profiler``: ``aten::_local_scalar_dense`` (a read the host waits on), ``aten::lift_fresh``
(a tensor from Python data), ``aten::_to_copy`` / ``aten::copy_`` (copies), and the ops
that build tensors from scratch. ALiBi, T5, KERPLE and FIRE, through ``attend`` at a decode
shape (one query over 64 keys) and a prefill shape, and through a cached decode step of a
``TransformerLM`` (the attention plan and run of each layer), each checked against the SDPA
backend (a dense float bias, float32).
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import posenc.torch.cache.step as step_module
import posenc.torch.model.mha as mha_module
from posenc.torch import FIRE, KERPLE, ALiBi, T5RelativeBias, TransformerLM
from posenc.torch.attention import flex as _flex
from posenc.torch.attention.core import attend

HOST_WORK = (
    "aten::_local_scalar_dense",  # .item(), int(t), bool(t): a stream sync on a GPU
    "aten::lift_fresh",  # torch.tensor(python data): a host-to-device copy on a GPU
    "aten::_to_copy",  # a cast or a move that copies (a no-op .to() does not run it)
    "aten::copy_",
    "aten::arange",
    "aten::full",
    "aten::scalar_tensor",
    "aten::linspace",
)
HEADS = 8


def _encodings():
    torch.manual_seed(0)
    fire = FIRE(HEADS, hidden=8, threshold=100.0)  # queries past L at 256: a table per query
    with torch.no_grad():  # away from the initialisation: the biases differ per head
        for p in fire.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return {"alibi": ALiBi(HEADS), "t5": T5RelativeBias(HEADS), "kerple": KERPLE(HEADS),
            "fire": fire}  # fmt: skip


ENCODINGS = _encodings()
SHAPES = {"decode": ((1, HEADS, 1, 64), (1, HEADS, 64, 64)),
          "prefill": ((1, HEADS, 256, 64), (1, HEADS, 256, 64))}  # fmt: skip


def _host_work(events):
    """How often each op of ``HOST_WORK`` ran, those that did."""
    counts = {name: sum(e.name == name for e in events) for name in HOST_WORK}
    return {name: n for name, n in counts.items() if n}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_repeated_attend_calls_sync_and_copy_nothing(name, shape):
    enc = ENCODINGS[name]
    g = torch.Generator().manual_seed(1)
    qs, ks = SHAPES[shape]
    q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, ks))
    with torch.no_grad():
        want = attend(q, k, v, enc, backend="sdpa")
        attend(q, k, v, enc, backend="flex")  # the first call builds and compiles
        for _ in range(2):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                got = attend(q, k, v, enc, backend="flex")
            assert (_host_work(prof.events())) == {}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _in(ranges, events):
    """The events that start inside one of ``ranges`` (profiler events of one thread)."""
    spans = [(r.time_range.start, r.time_range.end) for r in ranges]
    return [e for e in events if any(a <= e.time_range.start <= b for a, b in spans)]


def _traced(monkeypatch):
    """Run each layer's attention plan and attention call under a profiler label."""
    plan, run = step_module.plan, mha_module._run

    def labelled(fn):
        def call(*args, **kwargs):
            with record_function("posenc-flex"):
                return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(step_module, "plan", labelled(plan))
    monkeypatch.setattr(mha_module, "_run", labelled(run))


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_cached_decode_step_plans_without_host_work(name, cache_kind, monkeypatch):
    import torch.nn.attention.flex_attention as fa

    enc = ENCODINGS[name]
    torch.manual_seed(2)
    lms = {b: TransformerLM(11, 32, 2, HEADS, encoding=enc, max_len=64, backend=b).eval()
           for b in ("flex", "sdpa")}  # fmt: skip
    lms["sdpa"].load_state_dict(lms["flex"].state_dict())
    idx = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    pad = torch.tensor([[False, True, True, True], [True] * 4])  # rows of their own
    caches = {b: lm.new_cache(2, 40, static=cache_kind == "static") for b, lm in lms.items()}
    logits = {}
    built, real = [], fa.create_block_mask
    monkeypatch.setattr(fa, "create_block_mask", lambda *a, **k: built.append(1) or real(*a, **k))
    _traced(monkeypatch)
    with torch.no_grad():
        for b, lm in lms.items():
            logits[b] = lm(idx, cache=caches[b], padding_mask=pad)
        for i in range(4):
            token = logits["sdpa"][:, -1:].argmax(-1)
            logits["sdpa"] = lms["sdpa"](token, cache=caches["sdpa"])
            built.clear()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                logits["flex"] = lms["flex"](token, cache=caches["flex"])
            events = prof.events()
            labelled = [e for e in events if e.name == "posenc-flex"]
            assert len(labelled) == 1 + 2  # one plan for the step, a run per layer
            if i:  # the first step may build what the next ones reuse
                assert (_host_work(_in(labelled, events))) == {}
                assert built == []  # no block mask evaluated on the host
            torch.testing.assert_close(logits["flex"], logits["sdpa"], rtol=1e-5, atol=1e-5)


def test_kept_inputs_follow_in_place_updates():
    # KERPLE's and FIRE's score_mod inputs are kept between calls: an optimizer step (an
    # in-place update) must rebuild them, never leave the old numbers in the kernel
    g = torch.Generator().manual_seed(3)
    qs, ks = SHAPES["decode"]  # compiled already
    q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, ks))
    for enc in (KERPLE(HEADS), FIRE(HEADS, hidden=4), T5RelativeBias(HEADS)):
        with torch.no_grad():
            before = attend(q, k, v, enc, backend="flex")
            for p in enc.parameters():
                p.mul_(1.5).add_(0.1)
            after = attend(q, k, v, enc, backend="flex")
            want = attend(q, k, v, enc, backend="sdpa")
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5)


def test_biases_follow_writes_through_data():
    # `.data` writes (old-style init, EMA copies) bump no version counter: T5's and KERPLE's
    # score_mod inputs are built per call, so such a write reaches the next call (a kept
    # float copy of T5's bf16 table, or KERPLE's softplus, would keep the old numbers)
    g = torch.Generator().manual_seed(4)
    qs, ks = SHAPES["decode"]
    q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, ks))
    for enc in (KERPLE(HEADS), T5RelativeBias(HEADS).to(torch.bfloat16)):
        with torch.no_grad():
            attend(q, k, v, enc, backend="flex")
            for p in enc.parameters():
                p.data.mul_(1.5).add_(0.25)
            after = attend(q, k, v, enc, backend="flex")
            want = attend(q, k, v, enc, backend="sdpa")
        torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5)


def _cells(fn):
    return {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__,
                                                strict=True)}  # fmt: skip


def test_kept_inputs_follow_the_module_to_its_device():
    # a kept tensor on another device than the module's must never reach the kernel
    alibi, t5, positions = ALiBi(HEADS), T5RelativeBias(HEADS), range(4)
    slopes = _cells(alibi.score_mod(positions, positions))["slopes"]
    assert slopes.dtype == torch.float32 and slopes.device.type == "cpu"
    assert _cells(alibi.score_mod(positions, positions))["slopes"] is slopes  # kept
    meta = torch.arange(4, device="meta")[None]
    assert _cells(alibi.to("meta").score_mod(meta, meta))["slopes"].is_meta
    assert _cells(t5.to("meta").score_mod(positions, positions))["table"].is_meta
    t5.to_empty(device="cpu")
    assert _cells(t5.score_mod(positions, positions))["table"].device.type == "cpu"
    alibi.to_empty(device="cpu")
    assert _cells(alibi.score_mod(positions, positions))["slopes"].device.type == "cpu"


def test_range_starts_are_device_views_of_their_value():
    from posenc.torch.positions import position_at

    idx = torch.arange(3)
    for start in (0, 5, 70_000):  # 70,000: past the first table, which then grows
        for device in ("cpu", "meta"):
            got = position_at(range(start, start + 3), device)(0, idx.to(device))
            assert got.device.type == device
            if device == "cpu":
                assert got.tolist() == [start, start + 1, start + 2]


def test_threads_share_the_caches():
    g = torch.Generator().manual_seed(5)
    enc, errors = ALiBi(HEADS), []
    shapes = [SHAPES[s] for s in ("decode", "prefill", "decode", "prefill")]
    inputs = [(torch.randn(qs, generator=g), torch.randn(ks, generator=g),
               torch.randn(ks, generator=g)) for qs, ks in shapes]  # fmt: skip
    with torch.no_grad():
        wants = [attend(*x, enc, backend="sdpa") for x in inputs]
        for x in inputs:  # compiled once per shape before the threads race for the caches
            attend(*x, enc, backend="flex")
    _flex._MASKS.clear()

    def work(x, want):
        try:
            with torch.no_grad():
                for _ in range(3):
                    torch.testing.assert_close(attend(*x, enc, backend="flex"), want,
                                               rtol=1e-5, atol=1e-5)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=xw) for xw in zip(inputs, wants, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("filled", [100, 130, 300])
def test_cached_step_blocks_cover_every_visible_key(filled):
    # a decode step over a 300-slot cache buffer (3 blocks of 128 keys): the kept block
    # mask must list every block holding a key the query sees; checked in float64 math
    import posenc

    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, HEADS, 1, 16, generator=g)
    k, v = (torch.randn(1, HEADS, 300, 16, generator=g) for _ in range(2))
    valid = torch.rand(1, 300, generator=g) < 0.8
    valid[0, filled:] = False  # unfilled slots
    slot = filled - 1  # the query is the last token written
    enc = ALiBi(HEADS)
    with torch.no_grad():
        score_mod, mask = _flex.flex_plan(enc, range(slot, slot + 1), range(300), causal=True,
                                          key_valid=valid, q_start=slot)  # fmt: skip
        got = _flex.flex_attention_compiled("cpu")(q, k, v, score_mod=score_mod, block_mask=mask)
    slopes = torch.from_numpy(posenc.alibi_slopes(HEADS))[:, None, None]  # (h, 1, 1)
    j = torch.arange(300, dtype=torch.float64)
    scores = q.double() @ k.double().transpose(-1, -2) / 4 - slopes * (slot - j)
    seen = (j <= slot) & (valid[0] | (j == slot))
    weights = scores.masked_fill(~seen, float("-inf")).softmax(-1)
    torch.testing.assert_close(got.double(), weights @ v.double(), rtol=1e-5, atol=1e-5)


def test_fire_reads_its_learned_threshold_once_while_training(monkeypatch):
    # the threshold L is a learned parameter (it requires grad); the plan reads it on the host
    # once and keeps it until the parameter changes, not once a call
    fire = FIRE(4, hidden=8, threshold=3.0)
    assert fire.log_threshold.requires_grad and torch.is_grad_enabled()
    reads, to_float = [], torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: reads.append(t) or to_float(t))
    for _ in range(3):
        fire.score_mod(range(6), range(6))
    assert len(reads) == 1
    with torch.no_grad():
        fire.log_threshold.add_(0.5)  # a step of the optimizer: read again
    fire.score_mod(range(6), range(6))
    assert len(reads) == 2
