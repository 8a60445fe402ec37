"""FlexAttention planning without torch.compile: the compiled kernel is made once per device
type, and a padding block mask is built per batch row (a row's padding never hides the
keys of another row, even when a whole 128-key block of one row is padding).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from posenc.torch import NoPE
from posenc.torch.attention import flex as _flex

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def test_the_compiled_kernel_is_made_once_per_device_type():
    cpu = _flex.flex_attention_compiled()
    assert cpu is _flex.flex_attention_compiled("cpu")  # the default is the CPU's, cached
    assert cpu._torchdynamo_orig_callable is flex_attention  # compiled lazily: no cost here
    other = _flex.flex_attention_compiled("cuda")  # made, not run: no GPU needed
    assert other is not cpu and other is _flex.flex_attention_compiled("cuda")
    assert other._torchdynamo_orig_callable is flex_attention


def _masked_attention(q, k, v, allowed):
    """Plain softmax attention over ``allowed`` ``(batch, seq_q, seq_k)``: the reference."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (b, h, sq, sk)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [True, False])
def test_padding_of_one_row_never_hides_keys_of_another(causal):
    # row 0: the first 140 keys are padding (all of block 0, 128 keys); row 1: none
    seq = 160
    valid = torch.ones(2, seq, dtype=torch.bool)
    valid[0, :140] = False
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, seq, 8, generator=g) for _ in range(3))
    score_mod, block_mask = _flex.flex_plan(
        NoPE(), range(seq), range(seq), causal=causal, key_valid=valid
    )
    assert score_mod is None
    out = flex_attention(q, k, v, block_mask=block_mask)
    i = torch.arange(seq)
    allowed = (i[None, :] <= i[:, None]) if causal else torch.ones(seq, seq, dtype=torch.bool)
    allowed = (allowed[None] & valid[:, None, :]) | torch.eye(seq, dtype=torch.bool)[None]
    torch.testing.assert_close(out, _masked_attention(q, k, v, allowed), rtol=1e-5, atol=1e-5)
    # eager flex applies the mask elementwise; compiled kernels skip the blocks the block
    # mask calls empty, so it must be per row: queries 128.. of row 1 need keys 0..127
    blocks = block_mask.to_dense()  # (batch, 1, query blocks, key blocks)
    assert blocks.shape == (2, 1, 2, 2)
    assert blocks[1, 0, 1, 0] == 1 and blocks[0, 0, 1, 0] == 0
