"""Packed documents: each document's logits are those it gets alone (float64), for every
encoding family; conversions to and from cu_seqlens and HF's flattened position ids; named
errors where positions and documents disagree."""

import re

import pytest
import torch
from expect import raises_exactly

from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    Layer,
    LearnedEncoding,
    MRoPE,
    NoPE,
    PoPE,
    RotaryEmbedding,
    Schedule,
    SinusoidalEncoding,
    T5RelativeBias,
    TransformerLM,
    XPos,
    attend,
    cu_seqlens_from_documents,
    documents_from_cu_seqlens,
    documents_from_positions,
    positions_from_documents,
)

V, D, H, HD = 19, 16, 2, 8
DOCS = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1, 1]])

ENCODINGS = {
    "nope": NoPE, "sinusoidal": lambda: SinusoidalEncoding(D, max_len=32),
    "learned": lambda: LearnedEncoding(32, D), "rope": lambda: RotaryEmbedding(HD, max_len=32),
    "xpos": lambda: XPos(HD, max_len=32), "alibi": lambda: ALiBi(H),
    "t5": lambda: T5RelativeBias(H, num_buckets=8, max_distance=16),
    "kerple": lambda: KERPLE(H), "fire": lambda: FIRE(H, hidden=4),
    "pope": lambda: PoPE(HD, H, delta_init="uniform"),
    "mrope": lambda: MRoPE(HD, sections=(2, 1, 1), max_len=32),
}  # fmt: skip


def _model(name, **kw):
    torch.manual_seed(0)
    return TransformerLM(V, D, 2, H, encoding=ENCODINGS[name](), **kw).double().eval()


def _each_document(lm, idx, docs):
    """Logits of every document run alone, placed where the packed row has them."""
    out = torch.zeros(*idx.shape, V, dtype=torch.float64)
    for b in range(idx.shape[0]):
        for d in docs[b].unique():
            where = (docs[b] == d).nonzero().flatten()
            out[b, where] = lm(idx[b : b + 1, where])[0]
    return out


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_packed_rows_give_each_document_its_own_logits(name):
    lm = _model(name)
    idx = torch.randint(0, V, DOCS.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        packed = lm(idx, documents=DOCS)
        alone = _each_document(lm, idx, DOCS)
        mixed = lm(idx)  # without documents the second document sees the first
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)
    assert (mixed - alone).abs().amax() > 1e-3  # the test can tell


PADDED = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 0, 1], [1, 1, 0, 0, 1, 1, 0, 1, 0]], dtype=torch.bool)


def test_default_positions_of_padded_packed_rows_count_the_real_tokens_only():
    from posenc.torch.documents import real_positions

    # counted by hand: 0 at each document's first real token, +1 at each real token after
    # it; a padding slot takes the position of the real token before it (0 before any)
    assert real_positions(PADDED, DOCS).tolist() == [[0, 0, 1, 2, 0, 0, 1, 0, 0],
                                                     [0, 1, 0, 0, 0, 1, 1, 2, 2]]  # fmt: skip
    assert real_positions(PADDED).tolist() == [[0, 0, 1, 2, 2, 3, 4, 4, 5],
                                               [0, 1, 1, 1, 2, 3, 3, 4, 4]]  # fmt: skip


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_padding_inside_packed_documents_leaves_each_documents_real_tokens_as_alone(name):
    # positions not given count each document's real tokens from its first: padding at a
    # document's start, inside it or at its end changes nothing (absolute encodings too);
    # decoding continues the row's last document after its last real token
    torch.manual_seed(0)
    enc = ENCODINGS[name]()
    layers = [Layer(enc, chunk=2), Layer(enc, window=2)]
    sched = Schedule(layers, input=enc if "input" in enc.places else None)
    lm = TransformerLM(V, D, 2, H, schedule=sched).double().eval()
    idx = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        packed = lm(idx[:, :9], padding_mask=PADDED, documents=DOCS)
        cache = lm.new_cache(2, 11)
        steps = [lm(idx[:, :9], padding_mask=PADDED, documents=DOCS, cache=cache)]
        steps = torch.cat(steps + [lm(idx[:, i : i + 1], cache=cache) for i in (9, 10)], 1)
        for b in range(2):
            for d in DOCS[b].unique():
                where = ((DOCS[b] == d) & PADDED[b]).nonzero().flatten()
                alone = lm(idx[b : b + 1, where])[0]
                torch.testing.assert_close(packed[b, where], alone, rtol=0, atol=1e-12)
            where = torch.cat([where, torch.tensor([9, 10])])  # the last document, decoded
            torch.testing.assert_close(steps[b, where], lm(idx[b : b + 1, where])[0], rtol=0,
                                       atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_attend_with_padding_inside_packed_documents_gives_each_document_alone(backend):
    # attend's default positions: each document's real keys counted from its first
    g = torch.Generator().manual_seed(10)
    dtype = torch.float64 if backend == "sdpa" else torch.float32  # flex: no float64
    q, k, v = (torch.randn(2, H, 9, HD, generator=g, dtype=dtype) for _ in range(3))
    rope = RotaryEmbedding(HD, max_len=32)
    got = attend(q, k, v, rope, padding_mask=PADDED, documents=DOCS, chunk=2, backend=backend)
    for b in range(2):
        for d in DOCS[b].unique():
            where = ((DOCS[b] == d) & PADDED[b]).nonzero().flatten()
            one = (t[b : b + 1, :, where].double() for t in (q, k, v))
            want = attend(*one, rope, chunk=2, backend="sdpa")[0]  # alone, from 0
            torch.testing.assert_close(got[b][:, where].double(), want, rtol=0,
                                       atol=1e-12 if backend == "sdpa" else 1e-5)  # fmt: skip


def test_a_schedule_with_a_window_and_flex_attention_keep_documents_apart():
    torch.manual_seed(0)
    sched = Schedule([Layer(ALiBi(H), window=3), Layer(RotaryEmbedding(HD, max_len=32))])
    lm = TransformerLM(V, D, 2, H, schedule=sched).double().eval()
    idx = torch.randint(0, V, DOCS.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(lm(idx, documents=DOCS), _each_document(lm, idx, DOCS),
                                   rtol=0, atol=1e-12)  # fmt: skip
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, H, 9, HD, generator=g) for _ in range(3))
    sdpa = attend(q, k, v, ALiBi(H), documents=DOCS, backend="sdpa")
    flex = attend(q, k, v, ALiBi(H), documents=DOCS, backend="flex")
    torch.testing.assert_close(flex, sdpa, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["rope", "alibi", "learned", "mrope"])
def test_decoding_after_a_packed_prefill_continues_each_rows_last_document(name):
    lm = _model(name)
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(4))
    prompt, steps = idx[:, :9], idx[:, 9:]
    with torch.no_grad():
        cache = lm.new_cache(2, 12)
        got = [lm(prompt, documents=DOCS, cache=cache)[:, -1]]
        got += [lm(steps[:, i : i + 1], cache=cache)[:, -1] for i in range(3)]
        for b in range(2):  # the last document alone, then the same three tokens
            last = (DOCS[b] == DOCS[b, -1]).nonzero().flatten()
            alone = lm(torch.cat([prompt[b : b + 1, last], steps[b : b + 1]], 1))[0]
            want = alone[len(last) - 1 :]  # its last prompt token and the three after
            torch.testing.assert_close(torch.stack([g[b] for g in got]), want, rtol=0,
                                       atol=1e-12)  # fmt: skip


def test_flex_decoding_after_a_packed_prefill_keeps_every_slots_document():
    # Flex with a growing cache scores the whole buffer: each slot's document must travel
    torch.manual_seed(0)
    lm = TransformerLM(V, D, 1, H, encoding=ALiBi(H), backend="flex").eval()  # float32
    sdpa = TransformerLM(V, D, 1, H, encoding=ALiBi(H), backend="sdpa").eval()
    sdpa.load_state_dict(lm.state_dict())  # the same model on SDPA, no cache: the reference
    idx = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = lm.new_cache(2, 11)
        got = [lm(idx[:, :9], documents=DOCS, cache=cache)]  # (2, 9, V)
        got = torch.cat(got + [lm(idx[:, i : i + 1], cache=cache) for i in (9, 10)], 1)
        for b in range(2):  # the row's last document alone, then the two decoded tokens
            where = torch.cat([(DOCS[b] == DOCS[b, -1]).nonzero().flatten(), torch.tensor([9, 10])])
            alone = sdpa(idx[b : b + 1, where])[0]  # (len, V)
            torch.testing.assert_close(got[b, where], alone, rtol=1e-5, atol=1e-5)


def test_conversions_round_trip_and_match_hfs_flattening_collator():
    cu = torch.tensor([0, 4, 7, 9], dtype=torch.int32)
    docs = documents_from_cu_seqlens(cu)
    assert docs.tolist() == [[0, 0, 0, 0, 1, 1, 1, 2, 2]]
    assert torch.equal(cu_seqlens_from_documents(docs), cu)
    pos = positions_from_documents(docs)
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1]]
    assert torch.equal(documents_from_positions(pos), docs)
    transformers = pytest.importorskip("transformers")
    collator = transformers.DataCollatorWithFlattening(return_position_ids=True)
    batch = collator([{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]},
                      {"input_ids": [12, 13]}])  # fmt: skip
    hf_pos = torch.as_tensor(batch["position_ids"])
    assert torch.equal(hf_pos, pos)  # HF's position ids are posenc's
    assert torch.equal(documents_from_positions(hf_pos), docs)


def test_disagreeing_positions_and_documents_are_refused_by_name():
    lm = _model("rope")
    idx = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="documents must not decrease along a row: row 0 "
                       "goes from 1 to 0 at index 3"):  # fmt: skip
        lm(idx, documents=torch.tensor([[0, 0, 1, 0, 0]]))
    with pytest.raises(ValueError, match="positions must restart at 0 where a document "
                       "starts: row 0, index 2 starts document 1 at position 2"):  # fmt: skip
        lm(
            idx,
            positions=torch.tensor([[0, 1, 2, 3, 4]]),
            documents=torch.tensor([[0, 0, 1, 1, 1]]),
        )
    with pytest.raises(ValueError, match=r"documents must be an int64 tensor of shape \(1, 5\)"):
        lm(idx, documents=torch.zeros(1, 4, dtype=torch.long))
    cache = lm.new_cache(1, 10)
    lm(idx, cache=cache)
    with pytest.raises(ValueError, match="documents must be given on a cache's first step"):
        lm(idx, documents=torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="documents are not supported with a StaticKVCache"):
        lm(
            idx,
            documents=torch.zeros(1, 5, dtype=torch.long),
            cache=lm.new_cache(1, 10, static=True),
        )
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing lengths from 0"):
        documents_from_cu_seqlens(torch.tensor([1, 3]))


def test_flex_block_masks_follow_each_rows_documents():
    # rows pack differently; a block mask built from the first row alone skipped the
    # blocks the second row needs (found by review: 1.9 off with blocks of 128)
    docs = torch.stack([torch.repeat_interleave(torch.tensor([0, 1]), 128), torch.zeros(256)])
    docs = docs.long()
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, H, 256, HD, generator=g) for _ in range(3))
    sdpa = attend(q, k, v, ALiBi(H), documents=docs, backend="sdpa")
    flex = attend(q, k, v, ALiBi(H), documents=docs, backend="flex")
    torch.testing.assert_close(flex, sdpa, rtol=1e-5, atol=1e-5)


def test_decoding_continues_the_last_real_document_not_a_padding_one():
    lm = _model("rope")
    docs = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    real = torch.tensor([[True] * 5 + [False] * 3])  # document 1 is padding only
    idx = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(8))
    nxt = torch.tensor([[3]])
    with torch.no_grad():
        cache = lm.new_cache(1, 9)
        lm(idx, padding_mask=real, documents=docs, cache=cache)
        got = lm(nxt, cache=cache)[0, -1]
        want = lm(torch.cat([idx[:, :5], nxt], 1))[0, -1]  # document 0 continued alone
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_range_positions_with_documents_are_checked_too():
    lm = _model("rope")
    idx = torch.zeros(2, 6, dtype=torch.long)
    docs = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)
    with pytest.raises(ValueError, match="positions must restart at 0 where a document starts"):
        lm(idx, positions=range(6), documents=docs)
    with pytest.raises(ValueError, match="positions must restart at 0 where a document starts"):
        attend(*(torch.zeros(2, H, 6, HD) for _ in range(3)), documents=docs, k_positions=range(6))


def test_a_packed_forward_reads_its_documents_once():
    # the ids are checked once per step (one host read), not again to derive positions
    from torch.profiler import profile

    lm = TransformerLM(50, 32, 2, 2, encoding=RotaryEmbedding(16)).eval()
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    with torch.no_grad():
        lm(idx, documents=docs)
        with profile() as prof:
            lm(idx, documents=docs)
    reads = sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")
    assert reads == 1


def test_cu_seqlens_edges_and_refusals():
    from posenc.torch import documents_from_cu_seqlens

    assert documents_from_cu_seqlens([0, 3]).tolist() == [[0, 0, 0]]  # one document
    assert documents_from_cu_seqlens([0, 2, 2, 3]).tolist() == [[0, 0, 2]]  # an empty one
    for bad in (torch.tensor([0.0, 2.0]), torch.tensor([False, True])):
        with pytest.raises(ValueError, match=f"cu_seqlens must hold integers, got dtype "
                                             f"{bad.dtype}"):  # fmt: skip
            documents_from_cu_seqlens(bad)
    for bad in ([0], [1, 3], [0, 3, 2], [[0, 3]]):
        why = f"cu_seqlens must be non-decreasing lengths from 0, got {bad}"
        with pytest.raises(ValueError, match=re.escape(why)):
            documents_from_cu_seqlens(bad)


def test_positions_must_be_an_integer_batch_of_rows():
    from posenc.torch import documents_from_positions

    for bad, shape in ((torch.zeros(2, 3), "(2, 3)"), (torch.zeros(3, dtype=torch.long), "(3,)")):
        why = f"position_ids must be an integer (batch, seq) tensor, got {bad.dtype} {shape}"
        with pytest.raises(ValueError, match=re.escape(why)):
            documents_from_positions(bad)


def test_decoding_continues_after_the_last_real_document():
    from posenc.torch.documents import after_last_document

    docs = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]])
    pos = torch.tensor([[0, 1, 2, 0, 1], [0, 0, 1, 2, 3]])  # (batch, n): restarting
    nxt, last = after_last_document(pos, docs)
    assert nxt.tolist() == [[2], [4]] and last.tolist() == [[1], [1]]
    # padding after the real tokens: the last real token's document continues
    real = torch.tensor([[True, True, True, False, False], [True, False, False, False, False]])
    nxt, last = after_last_document(pos, docs, real)
    assert nxt.tolist() == [[3], [1]] and last.tolist() == [[0], [0]]
    # a row of padding only continues nothing: next position 0, in the row's last document
    nxt, last = after_last_document(pos, docs, torch.zeros(2, 5, dtype=torch.bool))
    assert nxt.tolist() == [[0], [0]] and last.tolist() == [[1], [1]]
    padded = torch.tensor([[False] * 5, [True, True, False, False, False]])  # one row only
    nxt, last = after_last_document(pos, torch.tensor([[0, 0, 1, 2, 3], [0, 1, 1, 1, 1]]), padded)
    assert nxt.tolist() == [[0], [1]] and last.tolist() == [[3], [1]]
    # a range shared by the batch, starting past 0; positions (1, n) broadcast over rows
    nxt, last = after_last_document(range(5, 10), torch.zeros(2, 5, dtype=torch.long))
    assert nxt.tolist() == [[10], [10]] and last.tolist() == [[0], [0]]
    nxt, last = after_last_document(range(5, 8), torch.tensor([[0, 1, 1]]))
    assert nxt.tolist() == [[8]] and last.tolist() == [[1]]
    nxt, _ = after_last_document(pos[:1], docs)  # row 1: positions 1, 2, 0, 1 in document 1
    assert nxt.tolist() == [[2], [3]]
    # grid coordinates (batch, n, axes): one past the largest coordinate of the document
    grid = torch.tensor([[[0, 0, 0], [1, 3, 2], [2, 0, 7], [0, 0, 0], [1, 1, 1]]]).expand(2, 5, 3)
    nxt, _ = after_last_document(grid, torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]))
    assert nxt.tolist() == [[2], [8]]


def test_a_row_may_begin_inside_a_document():
    from posenc.torch.documents import check_agree

    docs = torch.tensor([[4, 4, 5, 5], [0, 0, 0, 1]])
    pos = torch.tensor([[7, 8, 0, 1], [3, 4, 5, 0]])  # row starts continue a document
    assert torch.equal(check_agree(pos, docs), pos)
    assert torch.equal(check_agree(range(3, 7), torch.zeros(1, 4, dtype=torch.long)),
                       torch.tensor([[3, 4, 5, 6]]))  # fmt: skip
    grid = torch.zeros(2, 4, 3, dtype=torch.long) + 9  # M-RoPE coordinates: not checked
    assert check_agree(grid, docs) is grid
    why = "positions must restart at 0 where a document starts: row 1, index 3 starts document 1"
    with pytest.raises(ValueError, match=re.escape(why) + " at position 6$"):
        check_agree(torch.tensor([[7, 8, 0, 1], [3, 4, 5, 6]]), docs)


def test_vmapped_positions_are_checked_against_documents_as_eager_ones_are():
    # under vmap the positions are out of Python's reach, as compiled: the check is an op
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    docs = torch.tensor([[0, 0, 1, 1, 1, 2]])
    enc = RotaryEmbedding(8, max_len=16)

    def run(kp):
        return attend(q, k, v, enc, documents=docs, k_positions=kp)

    # the second set begins inside document 0: only starts after the first token restart
    pos = torch.tensor([[[0, 1, 0, 1, 2, 0]], [[3, 5, 0, 1, 2, 0]]])  # (sets, 1, seq)
    got = torch.func.vmap(run)(pos)
    want = torch.stack([run(p) for p in pos])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not torch.allclose(want[0], want[1])  # document 0 has another distance
    for bad, value in [([0, 1, 0, 1, 2, 5], 5), ([0, 1, 1, 2, 3, 0], 1)]:
        sets = torch.tensor([[[0, 1, 0, 1, 2, 0]], [bad]])
        why = f"positions at a document start must be < 1, got {value}"
        with pytest.raises(ValueError, match=f"^{why}$"):
            torch.func.vmap(run)(sets)


def test_document_ids_are_checked_with_the_first_decrease_named():
    from posenc.torch.documents import check_documents

    for docs, row, where in [([[0, 0, 1, 0]], 0, "from 1 to 0 at index 3"),
                             ([[1, 0]], 0, "from 1 to 0 at index 1"),
                             ([[0, 1], [2, 1]], 1, "from 2 to 1 at index 1"),
                             ([[0, 2, 1]], 0, "from 2 to 1 at index 2")]:  # fmt: skip
        with raises_exactly(f"documents must not decrease along a row: row {row} goes {where}"):
            check_documents(torch.tensor(docs), len(docs), len(docs[0]))
    assert check_documents(torch.tensor([[5]], dtype=torch.int32), 1, 1).dtype == torch.long
    for bad, got in [([[0, 1]], "[[0, 1]]"), (torch.zeros(1, 3, dtype=torch.long), "(1, 3)")]:
        with raises_exactly(f"documents must be an int64 tensor of shape (1, 2), got {got}"):
            check_documents(bad, 1, 2)
    for dtype in (torch.float32, torch.bool):
        with raises_exactly(f"documents must hold integer ids, got dtype {dtype}"):
            check_documents(torch.zeros(1, 2, dtype=dtype), 1, 2)


def test_vmapped_documents_are_checked_and_kept_as_eager_ones_are():
    # under vmap the ids are out of Python's reach: the check is an op they are rebuilt from
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    enc = RotaryEmbedding(8, max_len=16)

    def run(docs):
        return attend(q, k, v, enc, documents=docs)

    sets = torch.tensor([[[0, 0, 1, 1, 1]], [[3, 3, 3, 7, 7]]])  # (sets, 1, seq)
    got = torch.func.vmap(run)(sets)
    torch.testing.assert_close(got, torch.stack([run(d) for d in sets]), rtol=0, atol=1e-12)
    why = "document id steps must be non-negative, got -1; documents must not decrease along a row"
    with raises_exactly(why):
        torch.func.vmap(run)(torch.tensor([[[0, 0, 1, 1, 1]], [[0, 1, 0, 0, 0]]]))


def test_real_positions_stay_on_the_device_of_the_mask():
    # meta stands in for a GPU: every tensor made on the way follows the mask's device
    from posenc.torch.documents import real_positions

    real = torch.tensor([[False, True, True, True, True]])
    docs = torch.tensor([[0, 0, 0, 1, 1]])
    want = real_positions(real, docs)
    assert want.tolist() == [[0, 0, 1, 0, 1]]
    got = real_positions(real.to("meta"), docs.to("meta"))
    assert got.device.type == "meta" and got.shape == want.shape
