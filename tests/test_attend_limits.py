"""``attend``'s window, chunk and documents each hide keys from a query; checked against a
float64 NumPy oracle (``posenc.attention``), the mask built by hand from the docstring's words:

* ``window=w``: query position ``i`` sees key positions ``j`` with ``0 <= i - j < w``;
* ``chunk=c``: query position ``i`` sees key positions ``j <= i`` with ``i // c == j // c``
  (positions, not slots: in a packed row they restart at each document);
* without causality a window is refused by name (a bidirectional one is not built, a
  look-back one is none) and documents still apply;
* the same hidden keys through FlexAttention's block mask as through SDPA's float mask;
* ``documents``: a packed row gives each document what it gets alone (RoPE's positions
  restart at every document, ALiBi's distances too).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from expect import raises_exactly

import posenc
from posenc.torch import (
    ALiBi,
    Layer,
    MultiHeadAttention,
    NoPE,
    RotaryEmbedding,
    Schedule,
    TransformerLM,
    attend,
    attention_mask,
)
from posenc.torch.attention.core import plan

B, H, S, D = 2, 2, 9, 8


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3)]


def _softmax_attention(q, k, v, visible):
    """The float64 NumPy oracle without position: ``visible[i, j]`` says who sees whom."""
    out, _ = posenc.attention(*(t.numpy() for t in (q, k, v)), mask=visible)
    return out  # (batch, heads, seq, D)


def _visible(rule):
    return np.array([[rule(i, j) for j in range(S)] for i in range(S)])


@pytest.mark.parametrize("window", [1, 2, 3, S, S + 4])
def test_a_window_shows_each_query_its_last_window_keys(window):
    q, k, v = _qkv()
    got = attend(q, k, v, window=window)
    want = _softmax_attention(q, k, v, _visible(lambda i, j: 0 <= i - j < window))
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 2, 4, S])
def test_a_chunk_shows_each_query_the_earlier_keys_of_its_chunk(chunk):
    q, k, v = _qkv(1)
    got = attend(q, k, v, chunk=chunk)
    want = _softmax_attention(q, k, v, _visible(lambda i, j: j <= i and i // chunk == j // chunk))
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_a_window_inside_chunks_applies_both():
    q, k, v = _qkv(2)
    got = attend(q, k, v, window=2, chunk=4)
    want = _softmax_attention(q, k, v, _visible(lambda i, j: 0 <= i - j < 2 and i // 4 == j // 4))
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


REFUSED = ("window needs causal=True{}, got window=3 with causal=False: a bidirectional "
           "sliding window (HF's |i - j| <= w) is not built, and a look-back window is no such "
           "window")  # fmt: skip


def test_without_causality_a_window_is_refused_and_documents_still_hide_keys():
    # causal=False with a window: refused by name, wherever it is asked for (it was built as
    # a look-back window with every later key visible, which is no bidirectional convention:
    # HF's is |i - j| <= w); documents keep each query to its own; nothing else is hidden
    q, k, v = _qkv(5)
    with raises_exactly(REFUSED.format("")):
        attend(q, k, v, causal=False, window=3)
    with raises_exactly(REFUSED.format("")):
        attention_mask(NoPE(), range(S), range(S), causal=False, window=3, dtype=torch.float64)
    with raises_exactly(REFUSED.format("")):
        plan(NoPE(), range(S), range(S), causal=False, key_valid=None, heads=H,
             backend="sdpa", dtype=torch.float64, device=None, limits=(3, None))  # fmt: skip
    with raises_exactly(REFUSED.format("")):
        MultiHeadAttention(16, 2, causal=False, window=3)
    schedule = Schedule([Layer(NoPE()), Layer(NoPE(), window=3)])
    with raises_exactly(REFUSED.format(" (schedule layer 1)")):
        TransformerLM(11, 16, 2, 2, schedule=schedule, causal=False)
    TransformerLM(11, 16, 2, 2, schedule=schedule)  # causal: the window is built
    docs = torch.tensor([[0] * 4 + [1] * 5] * B)
    got = attend(q, k, v, causal=False, documents=docs)
    want = _softmax_attention(q, k, v, _visible(lambda i, j: (i < 4) == (j < 4)))
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    everything = _softmax_attention(q, k, v, _visible(lambda i, j: True))
    np.testing.assert_allclose(attend(q, k, v, causal=False).numpy(), everything, atol=1e-12)


def test_flex_attention_hides_the_same_keys():
    # FlexAttention (float32: it refuses float64) builds its block mask from the same rule;
    # with documents it takes its general mask (without, a cached causal one)
    q, k, v = (t.float() for t in _qkv(4))
    docs = torch.tensor([[0] * 5 + [1] * 4] * B)  # slots 0-4, then 5-8

    def limits(i, j):
        return 0 <= i - j < 2 and i // 4 == j // 4

    def at(i):  # the position of slot i: it restarts at 0 with the second document
        return i if i < 5 else i - 5

    for kw, rule in [
        ({}, limits),
        ({"documents": docs}, lambda i, j: limits(at(i), at(j)) and (i < 5) == (j < 5)),
    ]:
        got = attend(q, k, v, window=2, chunk=4, backend="flex", **kw)
        want = _softmax_attention(*(t.double() for t in (q, k, v)), _visible(rule))
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-5)


def test_window_and_chunk_are_refused_by_name():
    q, k, v = _qkv()
    for name, bad in [("window", 0), ("window", 2.0), ("chunk", True), ("chunk", -3)]:
        with raises_exactly(f"{name} must be None or an int >= 1, got {bad!r}"):
            attend(q, k, v, **{name: bad})


@pytest.mark.parametrize("encoding", [None, RotaryEmbedding(D, max_len=16), ALiBi(H)])
def test_packed_documents_attend_as_each_document_alone(encoding):
    q, k, v = _qkv(3)
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1, 1]])
    got = attend(q, k, v, encoding, documents=docs)
    want = torch.zeros_like(got)
    for b in range(B):
        for d in docs[b].unique():
            at = (docs[b] == d).nonzero().flatten()
            one = [t[b : b + 1, :, at] for t in (q, k, v)]  # the document alone, from 0
            want[b, :, at] = attend(*one, encoding)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert (attend(q, k, v, encoding) - want).abs().amax() > 1e-3  # the test can tell


def test_documents_are_refused_for_cross_attention_with_both_lengths():
    q, k, v = _qkv()
    with raises_exactly("documents needs self-attention (seq_q == seq_k), got 3 and 9"):
        attend(q[:, :, :3], k, v, documents=torch.zeros(B, S, dtype=torch.long))
