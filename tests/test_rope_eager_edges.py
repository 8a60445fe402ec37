"""The CPU kernels of posenc.torch.kernels.rope_eager at their edges: views whose strides
rule out the complex-number path, and the blocked kernel in place over more rows than one
block (each block must be read before it is written). Reference: the float64 NumPy
``posenc.rope``.
"""

from __future__ import annotations

import numpy as np
import torch

import posenc
from posenc.torch import kernels
from posenc.torch.kernels import rope_eager


def _cs(seq, head_dim):
    inv = 10_000.0 ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return kernels.cos_sin(torch.arange(seq), inv, 1.0, torch.float32)  # (seq, hd // 2, 2)


def _ref(x, pairing):
    seq = x.shape[-2]
    return torch.from_numpy(posenc.rope(x.double().numpy(), np.arange(seq), pairing=pairing))


def test_a_view_with_odd_strides_is_rotated_without_the_complex_path():
    # every leading stride odd (27, 27, 9): adjacent pairs cannot be viewed as complex numbers
    x = torch.randn(1, 1, 3, 9, generator=torch.Generator().manual_seed(0))[..., :8]
    assert x.stride() == (27, 27, 9, 1) and not rope_eager._complex_view_ok(x)
    with torch.no_grad():
        got = kernels.rotate(x, _cs(3, 8), "interleaved", impl="eager")
    torch.testing.assert_close(got.double(), _ref(x, "interleaved"), rtol=0, atol=2e-6)


def test_the_blocked_kernel_rotates_in_place_over_several_blocks():
    # 40 rows of (512, 64): 32 rows per block of 2**20 elements, so two blocks, in place
    x = torch.randn(5, 8, 512, 64, generator=torch.Generator().manual_seed(1))
    assert x.numel() > rope_eager._BLOCK
    want = _ref(x, "half")
    with torch.no_grad():
        got = kernels.rotate(x, _cs(512, 64), "half", inplace=True, impl="eager")
    assert got is x
    torch.testing.assert_close(got.double(), want, rtol=0, atol=5e-6)
