"""TransformerLM's constructor and length checks: exact refusals at each boundary, defaults.

Pins down: the names and minimums in the ``vocab_size`` / ``depth`` / ``max_len`` refusals
(the smallest accepted value and the largest refused one), the checked values kept as plain
``int`` attributes, the documented ``bias=False`` default (no bias in the attention
projections, never one in the head), the model's ``max_len`` bound (equal accepted, one more
refused, cache included), the static-cache capacity bound of ``new_cache``, and that a static
cache's own capacity check (not the model's length check) refuses an overflowing step.
"""

import numpy as np
import pytest
import torch
from expect import raises_exactly

from posenc.torch import NoPE, StaticKVCache, TransformerLM

DIM, HEADS = 8, 2


def small(vocab_size=5, depth=1, **kw):
    torch.manual_seed(0)
    return TransformerLM(vocab_size, DIM, depth, HEADS, encoding=NoPE(), **kw).eval()


def ids(batch, n):
    return torch.arange(batch * n).reshape(batch, n) % 5


def test_smallest_sizes_are_accepted_and_kept_as_ints():
    lm = small(np.int64(1), np.int64(1), max_len=np.int64(1))
    assert (lm.vocab_size, lm.depth, lm.max_len) == (1, 1, 1)
    assert all(type(v) is int for v in (lm.vocab_size, lm.depth, lm.max_len))
    assert len(lm.blocks) == 1 and lm.embed.num_embeddings == 1
    with torch.no_grad():
        assert lm(torch.zeros(1, 1, dtype=torch.long)).shape == (1, 1, 1)
    assert small(max_len=None).max_len is None and small(7).vocab_size == 7


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(vocab_size=0), "vocab_size must be >= 1, got 0"),
        (dict(vocab_size=-2), "vocab_size must be >= 1, got -2"),
        (dict(vocab_size=2.0), "vocab_size must be an integer, got 2.0"),
        (dict(depth=0), "depth must be >= 1, got 0"),
        (dict(depth=-1), "depth must be >= 1, got -1"),
        (dict(depth=True), "depth must be an integer, got True"),
        (dict(max_len=0), "max_len must be >= 1, got 0"),
        (dict(max_len=-5), "max_len must be >= 1, got -5"),
        (dict(max_len=4.0), "max_len must be an integer, got 4.0"),
    ],
)
def test_size_refusals_name_the_argument(kw, message):
    with raises_exactly(message):
        small(**kw)


def test_bias_defaults_to_false_in_attention_and_head_never_has_one():
    default = small(depth=2)
    for block in default.blocks:
        assert block.attn.qkv.bias is None and block.attn.out.bias is None
    assert default.head.bias is None
    names = {n for n, _ in default.named_parameters()}
    assert not any(n.startswith("blocks.") and ".attn." in n and n.endswith("bias") for n in names)
    biased = small(depth=2, bias=True)
    for block in biased.blocks:
        assert block.attn.qkv.bias.shape == (3 * DIM,) and block.attn.out.bias.shape == (DIM,)
    assert biased.head.bias is None  # the head has no bias whatever ``bias`` says


def test_max_len_bound_is_inclusive_with_and_without_cache():
    lm = small(max_len=4)
    with torch.no_grad():
        assert lm(ids(2, 4)).shape == (2, 4, 5)  # exactly max_len: accepted
        with raises_exactly("sequence length must be <= max_len=4, got 5"):
            lm(ids(2, 5))
        cache = lm.new_cache(2, 8)  # a growing cache larger than max_len
        lm(ids(2, 3), cache=cache)
        lm(ids(2, 1), cache=cache)  # 3 cached + 1 = max_len: accepted
        assert len(cache) == 4
        with raises_exactly("sequence length must be <= max_len=4, got 5"):
            lm(ids(2, 1), cache=cache)
        assert len(cache) == 4


def test_static_cache_capacity_may_equal_model_max_len():
    lm = small(max_len=4)
    cache = lm.new_cache(1, 4, static=True)
    assert isinstance(cache, StaticKVCache) and cache.max_len == 4
    with raises_exactly("max_len of a static cache must be <= the model's max_len=4, got 5"):
        lm.new_cache(1, 5, static=True)
    assert lm.new_cache(1, 5).max_len == 5  # a growing cache is checked per call instead


def test_static_cache_overflow_is_refused_by_the_cache_not_the_length_check():
    # a static cache's length is not added to the model's length check: its capacity
    # (<= the model's max_len) bounds the sequence, so an overflowing step gets its message
    lm = small(max_len=4)
    cache = lm.new_cache(2, 4, static=True)
    with torch.no_grad():
        lm(ids(2, 3), cache=cache)
        with raises_exactly("cache is full: max_len=4, holds 3 tokens, got 2 more"):
            lm(ids(2, 2), cache=cache)
        assert len(cache) == 3
        lm(ids(2, 1), cache=cache)  # fills it exactly
    assert len(cache) == 4


def test_a_static_cache_larger_than_max_len_is_refused_at_forward():
    # a static cache not made by this model's new_cache (another model's, or built directly)
    # must not let the model run past its max_len (its tokens are not in the length check)
    lm = small(max_len=4)
    big = small().new_cache(1, 8, static=True)
    with (
        torch.no_grad(),
        raises_exactly("max_len of a static cache must be <= the model's max_len=4, got 8"),
    ):
        lm(ids(1, 3), cache=big)
    assert len(big) == 0
