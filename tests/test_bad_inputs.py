"""Bad inputs that used to pass silently or fail deep inside torch: each refused by name.

* integer embeddings into the input encodings (the encoding was truncated to integers);
* ``generate`` on an empty prompt (an ``IndexError``);
* FlexAttention asked for float64 (an error deep inside inductor);
* a compiled static-cache decode past ``max_len`` after a padded prefill (an inductor
  bounds error, after writing past the filled slots on some paths).
"""

from __future__ import annotations

import pytest
import torch
from expect import raises_exactly

from posenc.torch import (
    ALiBi,
    LearnedEncoding,
    MultiHeadAttention,
    RotaryEmbedding,
    SinusoidalEncoding,
    SinusoidalEncoding2D,
    TransformerLM,
    attend,
)


@pytest.mark.parametrize(
    "enc", [SinusoidalEncoding(8, max_len=16), LearnedEncoding(16, 8), SinusoidalEncoding2D(8)],
    ids=["sinusoidal", "learned", "sincos_2d"],
)  # fmt: skip
def test_integer_embeddings_are_refused_by_the_input_encodings(enc):
    x = torch.ones(1, 3, 8, dtype=torch.long)
    with raises_exactly("x must be a floating-point tensor, got dtype torch.int64"):
        enc(x)
    assert enc(x.float()).dtype == torch.float32  # floats still work


def test_generate_refuses_an_empty_prompt():
    lm = TransformerLM(10, 8, 1, 2, encoding=RotaryEmbedding(4, max_len=16))
    empty = torch.zeros(1, 0, dtype=torch.long)
    with raises_exactly("idx must be a (batch, seq) prompt of at least one token, got (1, 0)"):
        lm.generate(empty, 3)
    assert lm.generate(empty, 0).shape == (1, 0)  # nothing to generate: nothing to refuse


def test_flex_refuses_float64_with_the_dtypes_it_takes():
    q = k = v = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    msg = "backend='flex' takes float32, float16, bfloat16 (FlexAttention's kernels), got "
    msg += "torch.float64"
    with raises_exactly(msg):
        attend(q, k, v, ALiBi(2), backend="flex")
    attn = MultiHeadAttention(16, 2, encoding=ALiBi(2), backend="flex").double()
    with raises_exactly(msg), torch.no_grad():
        attn(torch.randn(1, 4, 16, dtype=torch.float64))


@pytest.mark.compile
def test_a_compiled_static_decode_past_the_end_after_a_padded_prefill_is_refused():
    torch._dynamo.reset()
    torch.manual_seed(0)
    lm = TransformerLM(50, 16, 1, 2, encoding=RotaryEmbedding(8, max_len=64), max_len=8).eval()
    cache = lm.new_cache(1, 8, static=True)
    step = torch.compile(lm, fullgraph=True)
    prompt = torch.tensor([[0, 0, 3, 4, 5]])
    pad = prompt != 0
    pos = (pad.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = step(prompt, pos, pad, cache=cache)
        for _ in range(3):  # fills slots 5, 6, 7
            logits = step(logits[:, -1:].argmax(-1), cache=cache)
        keys = cache.keys[0].clone()
        msg = "cache slots must be < max_len=8, got 8; the StaticKVCache is full (adding 1)"
        with raises_exactly(msg):
            step(logits[:, -1:].argmax(-1), cache=cache)
    assert torch.equal(cache.keys[0], keys) and int(cache.filled) == 8  # nothing overwritten
