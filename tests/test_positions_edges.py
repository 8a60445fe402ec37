"""The position helpers of ``posenc.torch`` at their edges: ``as_positions`` (public) checks
and places what it is given, ``position_tensor`` moves tensors to the device asked for,
``position_arg`` accepts grid coordinates only for readers of several axes, the hooks'
guard does not take a 3-D tensor for 1-axis positions, and an empty position set has
largest position -1.
"""

from __future__ import annotations

import pytest
import torch
from expect import raises_exactly

from posenc.torch import RotaryEmbedding, as_positions, position_tensor
from posenc.torch.position_values import max_position
from posenc.torch.positions import position_arg


def test_as_positions_checks_shape_and_values_and_places_the_result():
    got = as_positions(torch.tensor([[5, 6, 7], [0, 1, 2]]), 2, 3)
    assert got.dtype == torch.int64 and got.tolist() == [[5, 6, 7], [0, 1, 2]]
    assert as_positions(None, 2, 3).tolist() == [[0, 1, 2]]
    assert as_positions(range(4, 6), 3, 2, device="meta").device.type == "meta"
    assert as_positions(torch.tensor([1, 2]), 3, 2, device="meta").device.type == "meta"
    with raises_exactly("positions must have shape (seq,) or (batch, seq) = (2, 3), got (3, 3)"):
        as_positions(torch.zeros(3, 3, dtype=torch.long), 2, 3)
    with raises_exactly("positions must be non-negative, got -1"):
        as_positions(torch.tensor([0, -1, 2]), 1, 3)


def test_position_tensor_moves_a_tensor_only_when_asked():
    pos = torch.tensor([[3, 4]])
    assert position_tensor(pos) is pos
    assert position_tensor(pos, "meta").device.type == "meta"


def test_grid_coordinates_only_for_readers_of_several_axes():
    coords = torch.zeros(1, 3, 1, dtype=torch.long)  # (batch, seq, 1): one axis, but 3-D
    with raises_exactly("positions must have shape (seq,) or (batch, seq) = (1, 3), "
                        "got (1, 3, 1)"):  # fmt: skip
        position_arg(coords, 1, 3, axes=1)
    with raises_exactly("positions must have shape (seq,) or (batch, seq) = (1, 3), "
                        "or (batch, seq, n_axes=n) coordinates, got (1, 4, 2)"):  # fmt: skip
        position_arg(torch.zeros(1, 4, 2, dtype=torch.long), 1, 3, axes=None)
    assert position_arg(torch.zeros(1, 3, 2, dtype=torch.long), 1, 3, axes=None).shape == (1, 3, 2)


def test_hook_guard_refuses_three_axis_positions_for_one_axis_encodings():
    q = torch.randn(1, 2, 3, 8)
    coords = torch.zeros(1, 3, 1, dtype=torch.long)
    with raises_exactly("q_positions must be a range of 3 or have shape (batch|1, seq) with "
                        "batch 1 and seq 3, got (1, 3, 1)"):  # fmt: skip
        RotaryEmbedding(8).encode_qk(q, q, coords, range(3))


@pytest.mark.parametrize(("positions", "want"), [
    (range(0), -1), (range(2, 9), 8), (torch.zeros(1, 0, dtype=torch.long), -1),
    (torch.tensor([[4, 1], [0, 7]]), 7)])  # fmt: skip
def test_max_position_is_minus_one_when_empty(positions, want):
    assert max_position(positions) == want
