"""RotaryEmbedding (torch) at its edges: the lazily grown table stays float32, tables made
now (float64 inputs, vmapped positions) come in the right dtype and on the inputs' device, the
default table device is where the module lives, and a bad base is refused at construction even
when no table is built then (length-dependent scaling). Reference: NumPy float64 cos/sin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from posenc.scaling import DynamicNTK
from posenc.torch import RotaryEmbedding


def _want(positions, head_dim=8):
    """float64 [cos, sin] of positions * theta_j: (len, head_dim // 2, 2)."""
    inv, _ = posenc.rope_frequencies(head_dim)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv
    return torch.from_numpy(np.stack([np.cos(angles), np.sin(angles)], -1))


def test_the_table_grows_in_float32_with_float64_angles():
    rot = RotaryEmbedding(8, max_len=10_000)
    first = rot.cos_sin.shape[0]  # built at construction: the first 4096 rows
    got = rot.table(range(first + 10, first + 13))  # past them: the table grows
    assert rot.cos_sin.dtype == torch.float32 and rot.cos_sin.shape[0] > first + 12
    want = _want(range(first + 10, first + 13))[None].float()  # rounded once from float64
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_default_table_device_is_where_the_module_lives():
    assert RotaryEmbedding(8, max_len=8)._device() == torch.device("cpu")
    with torch.device("meta"):  # stands in for an accelerator
        assert RotaryEmbedding(8, max_len=8)._device() == torch.device("meta")
    dynamic = RotaryEmbedding(8, max_len=64, scaling=DynamicNTK(2.0, original_max_len=16))
    assert dynamic._device() == torch.device("cpu")  # no cached table: the CPU


def test_a_table_for_vmapped_positions_is_float32_and_equals_the_cached_rows():
    rot = RotaryEmbedding(8, max_len=16)
    positions = torch.tensor([[1, 2, 3], [7, 8, 9]])
    got = torch.func.vmap(lambda p: rot.table(p[None], torch.float32))(positions)
    assert got.dtype == torch.float32 and got.shape == (2, 1, 3, 4, 2)
    torch.testing.assert_close(got[:, 0], rot.cos_sin[positions], rtol=0, atol=0)


def test_float64_tables_are_built_on_the_device_of_each_input():
    # q and k on meta (standing in for an accelerator), different positions: both tables
    # are computed now, each on its tensor's device
    rot = RotaryEmbedding(8, max_len=16)
    q = torch.empty(1, 2, 4, 8, dtype=torch.float64, device="meta")
    k = torch.empty(1, 1, 4, 8, dtype=torch.float64, device="meta")
    qr, kr = rot.encode_qk(q, k, range(4), range(1, 5))
    assert qr.device.type == kr.device.type == "meta" and kr.dtype == torch.float64
    cs = rot.table(range(1, 5), torch.float64)
    assert cs.dtype == torch.float64
    torch.testing.assert_close(cs[0], _want(range(1, 5)), rtol=0, atol=1e-15)


@pytest.mark.parametrize("base", [-1.0, 0.0, float("inf")])
def test_a_bad_base_is_refused_at_construction_even_without_a_table(base):
    dynamic = DynamicNTK(2.0, original_max_len=16)  # length-dependent: no table at init
    with pytest.raises(ValueError, match=f"base must be a positive finite number, got {base}"):
        RotaryEmbedding(8, base=base, scaling=dynamic, max_len=64)
