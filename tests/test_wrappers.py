"""The wrappers (ChannelSlice, SoftmaxFactor, QueryTemperature): what they pass through to
the encoding inside, what they refuse, and the grid RoPE's table call."""

from __future__ import annotations

import re

import pytest
import torch
from expect import raises_exactly

from posenc.torch import (
    ALiBi,
    ChannelSlice,
    MRoPE,
    PositionalEncoding,
    RotaryEmbedding,
    SoftmaxFactor,
)

B, H, S, HD = 2, 3, 5, 8


def _qk(width=HD):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, S, width, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, S, width, generator=g, dtype=torch.float64)
    return q, k


def test_forward_takes_per_row_positions_of_the_batch_not_the_heads():
    rope = RotaryEmbedding(HD, max_len=32).double()
    q, k = _qk()
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])  # (batch, seq), batch 2, heads 3
    want = rope.encode_qk(q, k, pos, pos)
    for got in (SoftmaxFactor(rope, factor=2.0)(q, k, pos), ChannelSlice(rope, start=0)(q, k, pos)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("shapes", [((B, H, S), (B, 1, S)), ((B, H, S, HD), (B, 1, S + 1, HD))])
def test_forward_refuses_q_and_k_that_do_not_pair(shapes):
    q, k = torch.zeros(shapes[0]), torch.zeros(shapes[1])
    why = f"q and k must be 4-D with the same seq, got {tuple(q.shape)} and {tuple(k.shape)}"
    with pytest.raises(ValueError, match=re.escape(why)):
        SoftmaxFactor(RotaryEmbedding(HD), factor=2.0)(q, k)
    q3, k4 = torch.zeros(B, H, S), torch.zeros(B, 1, S, HD)  # only q is not 4-D
    with pytest.raises(ValueError, match="q and k must be 4-D"):
        SoftmaxFactor(RotaryEmbedding(HD), factor=2.0)(q3, k4)


def test_encode_qk_is_out_of_place_unless_asked():
    wrapped = SoftmaxFactor(RotaryEmbedding(HD, max_len=32).double(), factor=2.0)
    q, k = _qk()
    q0 = q.clone()
    rq, _ = wrapped.encode_qk(q, k, range(S), range(S))
    assert torch.equal(q, q0) and not torch.equal(rq, q0)
    rq, _ = wrapped.encode_qk(q, k, range(S), range(S), inplace=True)
    assert torch.equal(q, rq)  # the caller asked: the inner encoding wrote into q


def test_channel_slice_refusals_name_what_is_wrong():
    rope = RotaryEmbedding(4)
    with pytest.raises(ValueError, match="start must be >= 0, got -1"):
        ChannelSlice(rope, start=-1)
    with pytest.raises(ValueError, match=re.escape(
            "encoding must be a query/key encoding with a head_dim (RoPE, xPos, M-RoPE), "
            "got ALiBi acting at ('scores',)")):  # fmt: skip
        ChannelSlice(ALiBi(H), start=0)

    class QKOnly(PositionalEncoding):  # acts at q/k, but has no head_dim
        def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
            return q, k

    with pytest.raises(ValueError, match="got QKOnly acting at"):
        ChannelSlice(QKOnly(), start=0)

    class Wider(QKOnly):  # a width of its own, the default softmax scale
        head_dim = 4

        def qk_dim(self, head_dim):
            return 2 * head_dim

    class Scaled(QKOnly):  # the same width, a softmax scale of its own
        head_dim = 4

        def softmax_scale(self, head_dim):
            return 1.0

    for cls in (Wider, Scaled):
        why = f"encoding must keep the width and softmax scale of the slice, {cls.__name__} changes"
        with pytest.raises(ValueError, match=why):
            ChannelSlice(cls(), start=0)
    q, k = torch.zeros(1, 1, 2, 6), torch.zeros(1, 1, 2, 7)
    why = "q and k must have at least start + width = 7 channels, got 6 and 7"
    with pytest.raises(ValueError, match=re.escape(why)):
        ChannelSlice(rope, start=3).encode_qk(q, k, range(2), range(2))
    with pytest.raises(ValueError, match="got 7 and 6"):
        ChannelSlice(rope, start=3).encode_qk(k, q, range(2), range(2))


@pytest.mark.parametrize("factor", [True, 0, -1.0, float("inf"), float("nan"), "2"])
def test_softmax_factor_must_be_a_positive_finite_number(factor):
    with pytest.raises(ValueError, match=re.escape(f"factor must be a positive finite number, "
                                                   f"got {factor!r}")):  # fmt: skip
        SoftmaxFactor(RotaryEmbedding(HD), factor=factor)


def test_grid_table_keeps_the_dtype_and_checks_positions_by_name():
    mrope = MRoPE(HD, sections=(2, 1, 1), max_len=8)
    pos = torch.zeros(1, S, 3, dtype=torch.long)  # (batch, seq, axes)
    assert mrope.table(pos, torch.float64).dtype == torch.float64
    assert mrope.table(pos).dtype == torch.float32
    with pytest.raises(ValueError, match=r"positions .*8"):
        mrope.table(torch.full((1, S, 3), 8), torch.float64)


def test_a_wrapper_takes_only_an_encoding_and_passes_out_through():
    with pytest.raises(ValueError, match="^encoding must be a PositionalEncoding, got str$"):
        SoftmaxFactor("rope", factor=2.0)
    alibi = ALiBi(H)
    buf = torch.empty(1, H, S, S)
    got = SoftmaxFactor(alibi, factor=2.0).score_bias(range(S), range(S), out=buf)
    assert got.data_ptr() == buf.data_ptr()  # written into the caller's buffer
    torch.testing.assert_close(buf, alibi.score_bias(range(S), range(S)), rtol=0, atol=0)


def test_score_bias_batches_must_pair():
    alibi = ALiBi(H)
    q2, k3 = torch.zeros(2, S, dtype=torch.long), torch.zeros(3, S, dtype=torch.long)
    with pytest.raises(ValueError, match=re.escape("k_positions must have the batch of "
                                                   "q_positions (2), got 3")):  # fmt: skip
        alibi(q2, k3)
    assert alibi(q2[:1], k3[:2]).shape == (2, H, S, S)  # a batch of 1 broadcasts
    assert alibi(q2, k3[:1]).shape == (2, H, S, S)


def test_xpos_names_the_positions_it_refuses():
    from posenc.torch import XPos

    xpos = XPos(HD, max_len=32)
    q = torch.randn(1, 2, 3, HD)
    with pytest.raises(ValueError, match="^q_positions must be non-negative, got -1"):
        xpos.encode_qk(q, q, torch.tensor([[-1, 0, 1]]), range(3))
    with pytest.raises(ValueError, match="^k_positions must be < max_len=32, got 99"):
        xpos.encode_qk(q, q, range(3), torch.tensor([[0, 1, 99]]))


def test_attention_module_passes_packed_documents_on():
    from posenc.torch import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, encoding=RotaryEmbedding(8, max_len=32)).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)  # (batch, seq, dim): documents of 3 and 4
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    got = mha(x, documents=docs)
    want = torch.cat([mha(x[:, :3]), mha(x[:, 3:])], dim=1)  # each alone, from position 0
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_attention_mask_applies_window_and_chunk():
    from posenc.torch import NoPE
    from posenc.torch.attention.mask import attention_mask

    def visible(**limits):
        m, _ = attention_mask(NoPE(), range(6), range(6), causal=True, dtype=torch.float64,
                              **limits)  # fmt: skip
        return (m[0, 0] == 0).long().tolist()  # (seq_q, seq_k): 1 where a key is seen

    window = visible(window=2)  # the query and the key before it
    assert window[5] == [0, 0, 0, 0, 1, 1] and window[0] == [1, 0, 0, 0, 0, 0]
    chunk = visible(chunk=4)  # keys of the query's own chunk of 4, up to it
    assert chunk[5] == [0, 0, 0, 0, 1, 1] and chunk[3] == [1, 1, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="^window"):
        visible(window=0)
    with pytest.raises(ValueError, match="^chunk"):
        visible(chunk=0)


def test_a_static_cache_refuses_documents_by_name():
    from posenc.torch import TransformerLM

    lm = TransformerLM(11, 16, 1, 2, encoding=RotaryEmbedding(8, max_len=32))
    cache = lm.new_cache(1, 8, static=True)
    why = "^documents are not supported with a StaticKVCache: use a KVCache for a packed prefill"
    with pytest.raises(ValueError, match=why):
        lm(torch.tensor([[1, 2, 3]]), cache=cache, documents=torch.tensor([[0, 0, 1]]))


def test_a_wrapper_without_its_encoding_has_no_inner_attribute():
    # as during unpickling, before the state is set: hasattr must answer, not raise KeyError
    bare = SoftmaxFactor.__new__(SoftmaxFactor)
    torch.nn.Module.__init__(bare)
    assert not hasattr(bare, "inner") and not hasattr(bare, "_hidden")


def test_a_model_takes_exactly_one_of_encoding_and_schedule_and_names_a_wrong_one():
    from posenc.torch import Layer, NoPE, Schedule, TransformerLM

    for kw, got in [
        ({}, "neither"),
        ({"encoding": NoPE(), "schedule": Schedule([Layer(NoPE())])}, "both"),
    ]:
        with raises_exactly(f"give one of encoding= and schedule=, got {got}"):
            TransformerLM(13, 8, 1, 2, **kw)
    with raises_exactly("schedule must be a Schedule, got list"):
        TransformerLM(13, 8, 1, 2, schedule=[Layer(NoPE())])
    with raises_exactly("layers must hold at least one Layer, got none"):
        Schedule([])
