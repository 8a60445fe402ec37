"""RoPE's eager kernels on every memory layout a user can hand them, against NumPy.

The fast paths (a complex multiply for interleaved pairs, four kernels on the halves) only
apply to some layouts; each layout here must either take them correctly or fall back to the
blocked path, never mis-view memory. The large float16 case runs the blocked path over
several blocks whose last one is short.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import apply_rope

HD = 8


def _views():
    g = torch.Generator().manual_seed(0)
    even = torch.randn(2, 3, 4, 18, generator=g)  # strides (216, 72, 18, 1): all even
    odd = torch.randn(2, 3, 4, 15, generator=g)  # strides (180, 60, 15, 1): seq's odd
    return {
        "odd storage offset": even[..., 3 : 3 + HD],  # offset 3, every stride even
        "last-dim stride 2": even[..., : 2 * HD : 2],
        "odd row stride": odd[..., :HD],
        "odd batch stride": torch.randn(3, 3, 5, HD, generator=g)[:2, :, 1:],
        "contiguous": even[..., :HD].contiguous(),
    }


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("layout", list(_views()))
def test_every_layout_is_rotated_as_numpy_does(layout, pairing):
    x = _views()[layout]
    seq = x.shape[2]
    expected = posenc.rope(x.double().numpy(), np.arange(seq), pairing=pairing)
    got = apply_rope(x, pairing=pairing)
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-5, atol=1e-5)
    out = torch.empty_like(x)  # contiguous output of a strided input
    apply_rope(x, pairing=pairing, out=out)
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(x.numpy(), _views()[layout].numpy())  # input untouched


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("layout", ["odd storage offset", "last-dim stride 2", "odd row stride"])
def test_strided_output_buffers_receive_the_rotation(layout, pairing):
    x = _views()[layout]  # input and output in the same layout, in different memory
    expected = posenc.rope(x.double().numpy(), np.arange(4), pairing=pairing)
    target = _views()[layout].zero_()  # the strided view itself receives the result
    apply_rope(x, pairing=pairing, out=target)
    np.testing.assert_allclose(target.double().numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_large_float16_goes_through_blocks_with_a_short_last_one(pairing):
    # 3 * 1000 * 512 elements > the 2**20 of one block: 2 rows per block, then 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, 1000, 512, generator=g).half()
    pos = np.arange(1000)
    expected = posenc.rope(x.double().numpy(), pos, pairing=pairing)
    got = apply_rope(x, pairing=pairing)
    assert got.dtype == torch.float16
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=2e-3, atol=2e-3)
