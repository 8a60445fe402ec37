"""How the Triton RoPE launcher splits its work (``rope_triton.plan``), checked by hand.

In process, no GPU and no compilation: block sizes, head groups, grid, warps and the byte
model behind ``tools/triton_aot.py``'s ``bytes_issued`` -- q and k read and written once
(the copy bound), plus one float32 ``[cos, sin]`` row read per head group, plus the int64
positions when the kernel indexes the table itself. ``tests/test_rope_triton_aot.py``
compiles the kernel for sm_80/sm_90 in a subprocess; this file is what mutation testing sees.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")
os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel module is first imported

import torch  # noqa: E402
from expect import raises_exactly  # noqa: E402

from posenc.torch.kernels import rope_triton  # noqa: E402


def _new(x):
    return torch.empty_like(x)


def test_prefill_bytes_are_the_copy_bound_plus_one_table_read_per_head_group():
    # (1, 32, 4096, 128) bf16, q and k new: 64 pairs -> block_h 64; 4096 // (2 * 64) = 32 rows
    # a block; 8 heads a program -> 4 groups each; 32 * 2 * 64 // 256 = 16 -> 4 warps
    x = torch.empty(1, 32, 4096, 128, dtype=torch.bfloat16)
    cs = torch.empty(1, 1, 4096, 64, 2)
    plan = rope_triton.plan([(x, cs, _new(x)), (x, cs, _new(x))])
    copy = 2 * (2 * 32 * 4096 * 128 * 2)
    assert plan.copy_bound == copy
    assert plan.bytes_issued == copy + 2 * 4 * 4096 * 64 * 2 * 4
    assert plan.grid == (128, 8, 1) and plan.heads_per == 8 and plan.groups == (4, 4)
    assert (plan.block_s, plan.block_h, plan.warps) == (32, 64, 4)


def test_a_decode_row_takes_one_warp_and_a_block_of_one_row():
    # (1, 8, 1, 64) float32: 32 pairs; one row -> block_s 1; 1 * 2 * 32 // 256 = 0 -> 1 warp
    x = torch.empty(1, 8, 1, 64)
    plan = rope_triton.plan([(x, torch.empty(1, 1, 1, 32, 2), _new(x))])
    assert (plan.grid, plan.block_s, plan.block_h, plan.heads_per) == ((1, 1, 1), 1, 32, 8)
    assert plan.warps == 1 and plan.groups == (1,)
    assert plan.copy_bound == 2 * 8 * 64 * 4  # 4096
    assert plan.bytes_issued == 4096 + 2 * 32 * 4  # one group's row of 32 float32 pairs


def test_eight_rows_of_four_heads_take_two_warps():
    # (1, 4, 8, 64) float32: block_s 8, block_h 32 -> 8 * 2 * 32 // 256 = 2 warps
    x = torch.empty(1, 4, 8, 64)
    plan = rope_triton.plan([(x, torch.empty(1, 1, 8, 32, 2), _new(x))])
    assert (plan.block_s, plan.block_h, plan.heads_per, plan.warps) == (8, 32, 4, 2)
    assert type(plan.warps) is int  # Triton's num_warps: 2.0 is not a launch setting
    assert plan.copy_bound == 2 * 4 * 8 * 64 * 4  # 16384
    assert plan.bytes_issued == 16384 + 8 * 2 * 32 * 4  # + 2048


def test_in_place_partial_rotary_moves_only_the_rotated_part():
    # (2, 4, 8, 64) float16 rotated in place over 32 dims: the tail stays put, unread
    x = torch.empty(2, 4, 8, 64, dtype=torch.float16)
    plan = rope_triton.plan([(x, torch.empty(1, 1, 8, 16, 2), x)])
    assert (plan.grid, plan.block_s, plan.block_h, plan.warps) == ((1, 1, 2), 8, 16, 1)
    assert plan.copy_bound == 2 * 2 * 4 * 8 * 32 * 2  # 8192
    assert plan.bytes_issued == 8192 + 2 * 8 * 2 * 16 * 4  # + 2048
    new = rope_triton.plan([(x, torch.empty(1, 1, 8, 16, 2), _new(x))])
    assert new.copy_bound == 2 * 2 * 4 * 8 * 64 * 2  # a new output: the whole head


def test_grouped_query_heads_and_an_indexed_table_add_their_groups_and_positions():
    # q (2, 16, 5, 32) and k (2, 2, 5, 32) bf16 indexing a (100, 16, 2) table by position:
    # 8 heads a program -> q 2 groups, k 1; each group reads its rows and its int64 positions
    q = torch.empty(2, 16, 5, 32, dtype=torch.bfloat16)
    k = torch.empty(2, 2, 5, 32, dtype=torch.bfloat16)
    cs = (torch.empty(100, 16, 2), torch.zeros(2, 5, dtype=torch.long))
    plan = rope_triton.plan([(q, cs, _new(q)), (k, cs, _new(k))])
    assert (plan.grid, plan.groups, plan.heads_per, plan.block_s) == ((1, 3, 2), (2, 1), 8, 8)
    copy = 2 * 2 * 16 * 5 * 32 * 2 + 2 * 2 * 2 * 5 * 32 * 2  # 20480 + 2560
    assert plan.copy_bound == copy
    table = 2 * 5 * (2 + 1) * 2 * 16 * 4  # 3840
    positions = 2 * 5 * (2 + 1) * 8  # 240
    assert plan.bytes_issued == copy + table + positions


def test_the_kernel_reads_the_callers_rows_without_a_copy_unless_it_must():
    x4 = torch.empty(2, 4, 6, 16)
    cs = torch.randn(1, 1, 6, 8, 2)  # contiguous: read where it is
    rows, pos = rope_triton._table(x4, cs)
    assert pos is None and rows.data_ptr() == cs.data_ptr() and rows.shape == (2, 6, 8, 2)
    shared = torch.randn(8, 2).expand(1, 1, 6, 8, 2)  # one row for every position: not
    rows, _ = rope_triton._table(x4, shared)  # contiguous, yet each row is one block
    assert rows.data_ptr() == shared.data_ptr() and rows.stride() == (0, 0, 2, 1)
    strided = torch.randn(1, 1, 6, 2, 8).transpose(-1, -2)  # pairs not adjacent: copied
    rows, _ = rope_triton._table(x4, strided)
    assert rows.data_ptr() != strided.data_ptr() and torch.equal(rows[0], strided[0, 0])
    assert rows.stride()[-2:] == (2, 1)
    per_head = torch.randn(1, 4, 6, 8, 2)
    with raises_exactly("the [cos, sin] rows must be shared by the heads, got (1, 4, 6, 8, 2)"):
        rope_triton._table(x4, per_head)


class _Spy:
    """Stands in for the kernel: records each launch's grid and arguments, then runs it."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.real[grid](*args, **kwargs)

        return run


def _launched(monkeypatch, pairs, interleaved=False):
    spy = _Spy(rope_triton._rope_fwd)
    monkeypatch.setattr(rope_triton, "_rope_fwd", spy)
    rope_triton.launch(pairs, interleaved)
    (grid, args, kwargs), = spy.calls  # fmt: skip
    return grid, args, kwargs


@pytest.mark.parametrize(
    ("width", "inplace", "tail"),
    [(8, False, 0), (12, False, 4), (12, True, 0)],  # in place, the tail stays put: no copy
    ids=["whole head", "partial, new out", "partial, in place"],
)
def test_one_tensor_launches_its_plan_with_an_empty_second_slot(monkeypatch, width, inplace, tail):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, width)
    cs = torch.randn(1, 1, 3, 4, 2)  # 4 pairs: 8 rotated dims
    out = x if inplace else torch.empty_like(x)
    plan = rope_triton.plan([(x, cs, out)])
    grid, args, kw = _launched(monkeypatch, [(x, cs, out)])
    assert grid == plan.grid
    assert args[3] is args[2]  # gathered rows: the positions' pointer is the table's, unused
    assert args[4:8] == args[0:4] and args[20:32] == args[8:20]  # k's slots repeat q's
    assert args[18:20] == (0, 0)  # no positions: no position strides
    assert args[32:37] == (2, 0, plan.groups[0], 3, 0)  # q heads, k heads, q groups, seqs
    assert kw["TAIL"] == tail and kw["BLOCK_T"] == max(1, tail) and kw["HALF"] == 4
    assert kw["Q_INDEXED"] is kw["K_INDEXED"] is False
    assert (kw["BLOCK_S"], kw["BLOCK_H"], kw["HEADS_PER"]) == (plan.block_s, plan.block_h,
                                                               plan.heads_per)  # fmt: skip
    assert kw["num_warps"] == plan.warps and kw["enable_fp_fusion"] is False  # no FMA


def test_an_indexed_table_passes_its_positions_and_their_strides(monkeypatch):
    x = torch.randn(2, 2, 3, 8)
    table, pos = torch.randn(10, 4, 2), torch.tensor([[4, 5, 6]])
    grid, args, kw = _launched(monkeypatch, [(x, (table, pos), torch.empty_like(x))])
    assert args[3] is pos  # the positions themselves: batch row 1 read with stride 0
    assert args[16:18] == (0, 8) and args[18:20] == (0, 1)  # table rows; positions (b, s)
    assert kw["Q_INDEXED"] is kw["K_INDEXED"] is True


def test_q_indexed_and_k_gathered_share_a_launch_each_with_its_own_flag(monkeypatch):
    torch.manual_seed(1)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    table, pos = torch.randn(10, 4, 2), torch.tensor([[4, 5, 6]])
    rows = table[pos]  # (1, 3, 4, 2): the same rows, gathered
    _, _, kw = _launched(monkeypatch, [(q, (table, pos), torch.empty_like(q)),
                                       (k, rows, torch.empty_like(k))])  # fmt: skip
    assert (kw["Q_INDEXED"], kw["K_INDEXED"]) == (True, False)
    monkeypatch.undo()
    qo, ko = rope_triton.launch([(q, (table, pos), torch.empty_like(q)),
                                 (k, rows, torch.empty_like(k))], False)  # fmt: skip
    want_q, want_k = (rope_triton.launch([(t, rows, torch.empty_like(t))], False)[0]
                      for t in (q, k))  # fmt: skip
    torch.testing.assert_close(qo, want_q, rtol=0, atol=0)
    torch.testing.assert_close(ko, want_k, rtol=0, atol=0)


def test_rotate_hands_the_kernel_the_table_and_positions_not_gathered_rows(monkeypatch):
    # plain inference with tensor positions: the kernel indexes the table itself (no
    # gathered copy), and rotates as the eager kernel does with the rows gathered
    from posenc.torch.kernels import TableRows, cos_sin, rotate, rotate_qk

    table = cos_sin(torch.arange(16), torch.tensor([1.0, 0.1]), 1.0, torch.float32)  # (16, 2, 2)
    pos = torch.tensor([[3, 1, 4], [1, 5, 9]])  # (batch, seq)
    x = torch.randn(2, 2, 3, 4, generator=torch.Generator().manual_seed(0))
    seen = []
    real = rope_triton.launch
    monkeypatch.setattr(
        rope_triton,
        "launch",
        lambda pairs, *a: seen.append([p[1] for p in pairs]) or real(pairs, *a),
    )
    rows = TableRows(table, pos)
    got = rotate(x, rows, "half", impl="triton")
    got_q, got_k = rotate_qk(x, x.flip(1), rows, rows, "half", impl="triton")  # one launch
    assert len(seen) == 2 and [len(s) for s in seen] == [1, 2]
    for cs in seen[0] + seen[1]:
        assert isinstance(cs, tuple) and cs[0] is table and torch.equal(cs[1], pos)
    want = rotate(x, rows, "half", impl="eager")
    for g in (got, got_q):
        torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        got_k, rotate(x.flip(1), rows, "half", impl="eager"), rtol=1e-6, atol=1e-6
    )


# --- the launch prepared once per layout: a repeated call reads only the addresses -------


def _numpy_rope(x, cs):
    """float64 rotation of the half pairing by gathered rows ``cs`` (1, 1, s, r // 2, 2)."""
    x, c, s = x.double(), cs[..., 0].double(), cs[..., 1].double()  # c, s: (1, 1, s, r // 2)
    a, b = x[..., : c.shape[-1]], x[..., c.shape[-1] : 2 * c.shape[-1]]
    return torch.cat([a * c - b * s, b * c + a * s, x[..., 2 * c.shape[-1] :]], -1)


@pytest.mark.parametrize("blocked", [True, False], ids=["rows as blocks", "rows copied"])
def test_a_kept_layout_reads_each_calls_own_tensors(blocked):
    # same shapes and strides, new values each call: the kept plan must not keep the
    # first call's addresses (nor, where the rows had to be copied, its copy)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(2, 3, 5, 10, generator=gen)  # partial: 8 of 10 dims rotated
        cs = torch.randn(1, 1, 5, 2, 4, generator=gen)  # (.., [cos, sin], pairs)
        cs = cs.transpose(-1, -2) if not blocked else cs.reshape(1, 1, 5, 4, 2)
        (got,) = rope_triton.launch([(x, cs, torch.empty_like(x))], False)
        torch.testing.assert_close(got.double(), _numpy_rope(x, cs), rtol=0, atol=1e-6)
    assert len(rope_triton._PREPARED) >= 1


def test_a_new_layout_of_the_same_shape_is_prepared_again():
    # a transposed view has q's shape but other strides: a plan kept for the contiguous
    # tensor would read it in the wrong order
    gen = torch.Generator().manual_seed(4)
    cs = torch.randn(1, 1, 6, 4, 2, generator=gen)
    x = torch.randn(2, 3, 6, 8, generator=gen)
    y = torch.randn(2, 6, 3, 8, generator=gen).transpose(1, 2)  # (2, 3, 6, 8), strided
    for t in (x, y, x):
        (got,) = rope_triton.launch([(t, cs, torch.empty_like(t))], False)
        torch.testing.assert_close(got.double(), _numpy_rope(t, cs), rtol=0, atol=1e-6)
    inplace = x.clone()  # in place: the same shapes and strides, another key
    rope_triton.launch([(inplace, cs, inplace)], False)
    torch.testing.assert_close(inplace.double(), _numpy_rope(x, cs), rtol=0, atol=1e-6)


def test_the_eager_gradient_is_the_inverse_rotation_and_differentiable_again():
    # y = R x: dL/dx = R^T g; then d/dg of (R^T g . h) = R h (the double backward)
    from posenc.torch import kernels

    gen = torch.Generator().manual_seed(5)
    cs = torch.randn(1, 1, 4, 4, 2, generator=gen)
    x = torch.randn(1, 2, 4, 8, generator=gen, requires_grad=True)
    g = torch.randn(1, 2, 4, 8, generator=gen, requires_grad=True)
    h = torch.randn(1, 2, 4, 8, generator=gen)
    y = kernels.rotate(x, cs, "half", impl="triton")
    (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
    inverse = cs * torch.tensor([1.0, -1.0])  # [cos, -sin]
    torch.testing.assert_close(gx.double(), _numpy_rope(g.detach(), inverse), rtol=0, atol=1e-6)
    (gg,) = torch.autograd.grad((gx * h).sum(), g)
    torch.testing.assert_close(gg.double(), _numpy_rope(h, cs), rtol=0, atol=1e-6)
