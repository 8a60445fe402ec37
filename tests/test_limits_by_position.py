"""Sliding windows and chunks are counted in positions, not in cache slots (issue 40, class 4).

A window shows query position ``p`` the keys at positions ``p - window < k <= p``; a chunk,
the keys with ``k // chunk == p // chunk``. After left padding the positions start at the
first real token, in a packed row at each document, after a packed prefill they continue
the row's last document. Oracles: transformers' own ``masking_utils`` (with a left-padding
``attention_mask``, and packed position ids), each document run alone, the unpadded prompt
run alone, the unsharded model (context parallelism); in every backend (SDPA's float mask,
FlexAttention's block mask, the caches' planned steps). Grid coordinates (M-RoPE) name no
one position: their limits count slots from each document's and each row's first real token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Llama4TextConfig, MistralConfig
from transformers.masking_utils import (
    create_chunked_causal_mask,
    create_sliding_window_causal_mask,
)

import posenc
from posenc.torch import (
    Layer,
    MRoPE,
    NoPE,
    RotaryEmbedding,
    Schedule,
    SinusoidalEncoding,
    TransformerLM,
    attend,
    attention_mask,
    positions_from_documents,
)

V, D, H, HD, S = 19, 16, 2, 8, 11
PAD = torch.tensor([[0] * 3 + [1] * 8, [0] * 1 + [1] * 10, [1] * 11], dtype=torch.bool)
POS = (PAD.long().cumsum(1) - 1).clamp(min=0)  # 0 on each row's first real token
DOCS = torch.tensor([[0] * 5 + [1] * 6, [0] * 2 + [1] * 7 + [2] * 2])  # lengths 5 6 | 2 7 2
LIMITS = [{"chunk": 3}, {"chunk": 4}, {"window": 3}, {"window": 2, "chunk": 4}]


def _hf_mask(limits, padding=PAD, position_ids=None):
    """HF's sdpa mask of a chunked (Llama 4) or sliding (Mistral) layer, bool (b, 1, S, S);
    ``padding=None`` and per-document ``position_ids``: HF's packed rows."""
    rows = len(padding if padding is not None else position_ids)
    args = (torch.zeros(rows, S, 4), padding, None, position_ids)  # embeds, mask, cache, ids
    masks = []
    if "window" in limits:
        config = MistralConfig(sliding_window=limits["window"])
        config._attn_implementation = "sdpa"
        masks.append(create_sliding_window_causal_mask(config, *args))
    if "chunk" in limits:  # both: each mask says who may see whom, their meet is both
        config = Llama4TextConfig(attention_chunk_size=limits["chunk"])
        config._attn_implementation = "sdpa"
        masks.append(create_chunked_causal_mask(config, *args))
    return masks[0] if len(masks) == 1 else masks[0] & masks[1]


def _oracle(q, k, v, visible):
    """Float64 NumPy softmax attention under a bool ``(b, 1, sq, sk)`` mask, per row."""
    outs = [posenc.attention(*(t[b].double().numpy() for t in (q, k, v)),
                             mask=visible[b, 0].numpy())[0] for b in range(q.shape[0])]  # fmt: skip
    return torch.from_numpy(np.stack(outs))  # (b, heads, sq, hd)


@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_left_padded_masks_equal_hfs_masking_utils_on_real_queries(limits):
    want = _hf_mask(limits)  # (b, 1, S, S): True where visible
    mask, _ = attention_mask(NoPE(), POS, POS, causal=True, key_valid=PAD, dtype=torch.float64,
                             **limits)  # fmt: skip
    got = (mask == 0).expand_as(want)
    real = PAD[:, None, :, None].expand_as(want)  # HF hides a padding query's every key
    assert torch.equal(got[real], want[real])
    slots, _ = attention_mask(NoPE(), range(S), range(S), causal=True, key_valid=PAD,
                              dtype=torch.float64, **limits)  # fmt: skip
    if "chunk" in limits:  # counted in slots the chunks would start at the padding
        assert not torch.equal((slots == 0).expand_as(want)[real], want[real])


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_left_padded_attention_equals_attention_under_hfs_mask(limits, backend):
    g = torch.Generator().manual_seed(0)
    dtype = torch.float64 if backend == "sdpa" else torch.float32  # flex: no float64
    q, k, v = (torch.randn(3, H, S, HD, generator=g, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        got = attend(q, k, v, q_positions=POS, k_positions=POS, padding_mask=PAD,
                     backend=backend, **limits)  # fmt: skip
    itself = torch.eye(S, dtype=torch.bool)  # HF leaves a padding query no key: give it one
    want = _oracle(q, k, v, _hf_mask(limits) | itself)
    real = PAD[:, None, :, None].expand_as(got)
    tol = 1e-12 if backend == "sdpa" else 1e-5
    torch.testing.assert_close(got[real].double(), want[real], rtol=0, atol=tol)


def _alone(q, k, v, docs, encoding, **kw):
    """Every document of every row run alone (positions from 0), where the row has it."""
    want = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for d in docs[b].unique():
            at = (docs[b] == d).nonzero().flatten()
            want[b, :, at] = attend(*(t[b : b + 1, :, at] for t in (q, k, v)), encoding, **kw)[0]
    return want


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_packed_documents_with_limits_attend_as_each_document_alone(limits, backend):
    g = torch.Generator().manual_seed(1)
    dtype = torch.float64 if backend == "sdpa" else torch.float32
    q, k, v = (torch.randn(2, H, S, HD, generator=g, dtype=dtype) for _ in range(3))
    rope = RotaryEmbedding(HD, max_len=32)
    with torch.no_grad():
        got = attend(q, k, v, rope, documents=DOCS, backend=backend, **limits)
        want = _alone(q, k, v, DOCS, rope, backend="sdpa", **limits)
    tol = 1e-12 if backend == "sdpa" else 1e-5
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_packed_rows_equal_attention_under_hfs_packed_mask(limits):
    # HF detects packing from position ids restarting at 0 and counts limits in them
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, H, S, HD, generator=g, dtype=torch.float64) for _ in range(3))
    got = attend(q, k, v, documents=DOCS, **limits)
    want = _oracle(q, k, v, _hf_mask(limits, None, positions_from_documents(DOCS)))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("limits", [{"chunk": 3}, {"window": 2, "chunk": 4}], ids=str)
def test_grid_coordinates_count_limits_in_slots_from_each_document_and_first_real_token(
    limits, backend
):
    # M-RoPE's (b, seq, 3) coordinates name no one position: the limits count slots, from
    # each document's first slot and each row's first real token (HF's text positions)
    g = torch.Generator().manual_seed(7)
    dtype = torch.float64 if backend == "sdpa" else torch.float32
    q, k, v = (torch.randn(2, H, S, HD, generator=g, dtype=dtype) for _ in range(3))
    coords = torch.randint(0, 16, (2, S, 3), generator=g)
    mrope = MRoPE(HD, sections=(2, 1, 1), max_len=32)
    tol = 1e-12 if backend == "sdpa" else 1e-5
    with torch.no_grad():
        got = attend(q, k, v, mrope, k_positions=coords, documents=DOCS, backend=backend,
                     **limits)  # fmt: skip
        want = torch.zeros_like(q)
        for b in range(2):
            for d in DOCS[b].unique():
                at = (DOCS[b] == d).nonzero().flatten()
                one = (t[b : b + 1, :, at] for t in (q, k, v))
                want[b, :, at] = attend(*one, mrope, k_positions=coords[b : b + 1, at],
                                        backend="sdpa", **limits)[0]  # fmt: skip
        torch.testing.assert_close(got, want, rtol=0, atol=tol)
        pad = PAD[:2]
        got = attend(q, k, v, mrope, k_positions=coords, padding_mask=pad, backend=backend,
                     **limits)  # fmt: skip
        for b in range(2):
            one = (t[b : b + 1, :, pad[b]] for t in (q, k, v))
            alone = attend(*one, mrope, k_positions=coords[b : b + 1, pad[b]], **limits)[0]
            torch.testing.assert_close(got[b][:, pad[b]], alone, rtol=0, atol=tol)


def _lm(backend="auto", **limits):
    torch.manual_seed(0)
    rope = RotaryEmbedding(HD, max_len=64)
    sched = Schedule([Layer(rope, **limits), Layer(rope), Layer(rope, **limits)])
    lm = TransformerLM(V, D, 3, H, schedule=sched, backend=backend).eval()
    return lm.double() if backend != "flex" else lm  # flex: float32


@pytest.mark.parametrize(
    ("limits", "backend"),
    [*((limits, "sdpa") for limits in LIMITS), ({"window": 2, "chunk": 4}, "flex")],
    ids=str,
)
def test_decoding_after_a_packed_prefill_ending_in_padding_equals_the_last_document_alone(
    limits, backend
):
    lm = _lm(backend, **limits)  # flex with a cache: every slot, each with its position
    ref = _lm(**limits).to(lm.head.weight.dtype)  # the same weights on SDPA, no cache
    idx = torch.randint(0, V, (2, S + 3), generator=torch.Generator().manual_seed(2))
    prompt, steps = idx[:, :S], idx[:, S:]
    real = torch.ones(2, S, dtype=torch.bool)
    real[0, -2:] = False  # row 0 ends in two padding tokens (its second document's tail)
    real[1, -2:] = False  # row 1: its third document is all padding
    with torch.no_grad():
        cache = lm.new_cache(2, S + 3)
        got = [lm(prompt, padding_mask=real, documents=DOCS, cache=cache)]
        got += [lm(steps[:, i : i + 1], cache=cache) for i in range(3)]
        got = torch.cat(got, 1)[:, S:]  # (2, 3, V): the three decode steps
        for b, doc in ((0, 1), (1, 1)):
            last = ((DOCS[b] == doc) & real[b]).nonzero().flatten()
            alone = ref(torch.cat([prompt[b : b + 1, last], steps[b : b + 1]], 1))[0, len(last) :]
            tol = 1e-12 if backend == "sdpa" else 1e-5
            torch.testing.assert_close(got[b], alone, rtol=0, atol=tol)


@pytest.mark.parametrize("given", [True, False], ids=["positions", "default positions"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_decoding_after_a_left_padded_prefill_equals_the_unpadded_forward(limits, static, given):
    # positions not given with a padding mask count the real tokens only, as POS does
    lm = _lm(**limits)
    idx = torch.randint(0, V, (3, S + 3), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = lm.new_cache(3, S + 3, static=static)
        got = [lm(idx[:, :S], POS if given else None, PAD, cache=cache)]
        got += [lm(idx[:, i : i + 1], cache=cache) for i in range(S, S + 3)]
        got = torch.cat(got, 1)  # (3, S + 3, V)
        for b in range(3):
            real = torch.cat([PAD[b], torch.ones(3, dtype=torch.bool)])
            alone = lm(idx[b : b + 1, real])[0]  # the row without its padding, from 0
            torch.testing.assert_close(got[b, real], alone, rtol=0, atol=1e-12)


INNER = torch.tensor(
    [[0, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9 + [0, 0]],
    dtype=torch.bool,
)  # padding on the left, inside a row, on the right


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_padding_anywhere_without_positions_leaves_each_rows_real_tokens_as_alone(limits, static):
    # default positions count the real tokens only: padding on the left, inside a row or on
    # its right changes nothing for the real tokens, an absolute encoding of the input
    # included (its positions); a cache continues each row after its last real token
    torch.manual_seed(0)
    rope = RotaryEmbedding(HD, max_len=64)
    sched = Schedule([Layer(rope, **limits), Layer(rope)], input=SinusoidalEncoding(D))
    lm = TransformerLM(V, D, 2, H, schedule=sched).double().eval()
    idx = torch.randint(0, V, (3, S + 2), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got = lm(idx[:, :S], padding_mask=INNER)
        cache = lm.new_cache(3, S + 2, static=static)
        steps = [lm(idx[:, :S], padding_mask=INNER, cache=cache)]
        steps += [lm(idx[:, i : i + 1], cache=cache) for i in range(S, S + 2)]
        steps = torch.cat(steps, 1)  # (3, S + 2, V)
        for b in range(3):
            alone = lm(idx[b : b + 1, :S][:, INNER[b]])[0]  # the real tokens, from 0
            torch.testing.assert_close(got[b, INNER[b]], alone, rtol=0, atol=1e-12)
            real = torch.cat([INNER[b], torch.ones(2, dtype=torch.bool)])
            alone = lm(idx[b : b + 1, real])[0]  # then the two decoded tokens
            torch.testing.assert_close(steps[b, real], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pad", [PAD, INNER], ids=["left", "left, inside and right"])
@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_generate_from_a_padded_prompt_gives_the_unpadded_prompts_tokens(limits, use_cache, pad):
    # a row's first new token comes from its last real token's logits (right padding too)
    lm = _lm(**limits)
    lm.head.weight.data *= 50  # sharp logits: a wrong mask changes the argmax, not a decimal
    idx = torch.randint(0, V, (3, S), generator=torch.Generator().manual_seed(4))
    got = lm.generate(idx, 6, padding_mask=pad, use_cache=use_cache)
    for b in range(3):
        alone = lm.generate(idx[b : b + 1, pad[b]], 6)
        assert torch.equal(got[b, S:], alone[0, -6:]), (b, got[b, S:], alone[0, -6:])


def _sharded(rank, world, path, out):
    """One rank of a context-parallel forward of the windowed and chunked models."""
    import torch.distributed as dist

    from posenc.torch import context_parallel_forward, shard_index

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    idx = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(5))
    docs = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [0] * 16])
    errors = {}
    for limits in LIMITS:
        lm = _lm(**limits)
        with torch.no_grad():
            want = lm(idx, documents=docs)[:, shard_index(16, rank, world)]
            got = context_parallel_forward(lm, idx, documents=docs)
        errors[str(limits)] = float((got - want).abs().max())
    if rank == 0:
        torch.save(errors, out)
    dist.destroy_process_group()


def test_a_sharded_forward_counts_windows_and_chunks_in_the_global_positions(tmp_path):
    # context parallelism: the mask's slots are global indices (``order``), the limits
    # count the tokens' global positions (restarting at each document) as the model does
    import torch.multiprocessing as mp

    out = tmp_path / "errors.pt"
    mp.spawn(_sharded, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    errors = torch.load(out)
    assert set(errors) == {str(limits) for limits in LIMITS}
    assert max(errors.values()) < 1e-10, errors


@pytest.mark.compile
def test_a_compiled_static_decode_step_with_limits_reads_nothing_back(monkeypatch):
    # per-row positions after a left-padded prefill: the limits read position tensors,
    # inside the graph, never on the host (no .item(), no sync: CUDA graphs can replay it)
    from test_decode_syncs import _counted, _dense
    from torch.profiler import profile

    torch._dynamo.reset()
    torch.manual_seed(0)
    sched = Schedule([Layer(RotaryEmbedding(HD, max_len=64), window=2, chunk=3)])
    lm = TransformerLM(V, D, 1, H, schedule=sched).eval()
    step = torch.compile(lm, fullgraph=True)
    cache = lm.new_cache(3, S + 4, static=True)
    with torch.no_grad():
        logits = step(torch.randint(0, V, (3, S)), POS, PAD, cache=cache)
        for _ in range(2):
            logits = step(logits[:, -1:].argmax(-1), cache=cache)
        reads = _counted(monkeypatch)
        with profile() as prof:
            step(logits[:, -1:].argmax(-1), cache=cache)
    assert _dense(prof) == 0
    assert set(reads) <= {"checked_positions"}  # its CPU branch; on CUDA a device assert
