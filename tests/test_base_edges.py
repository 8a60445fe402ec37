"""The encoding base class at its edges: the default ``score_mod`` indexes the bias by batch
and head exactly as broadcasting would (shared or per-head, shared or per-row), moves
(``to``, ``to_empty(recurse=False)``) keep the work dtype and the module tree as asked,
and ``check_qk`` names the tensor and quotes both shapes.
"""

from __future__ import annotations

import torch
from expect import raises_exactly

import posenc
from posenc.torch import ALiBi, PositionalEncoding, T5RelativeBias
from posenc.torch.encodings.checks import check_qk
from posenc.torch.encodings.scores.learned_bias import FIRE


class _FixedBias(PositionalEncoding):
    """A bias given outright, (b|1, h|1, sq, sk): the default score_mod indexes it."""

    def __init__(self, bias):
        super().__init__()
        self.bias = bias

    def score_bias(self, q_positions, k_positions, *, out=None):
        return self.bias


def _apply_score_mod(enc, batch, heads, sq, sk):
    f = enc.score_mod(range(sq), range(sk))
    got = torch.empty(batch, heads, sq, sk)
    for b in range(batch):
        for h in range(heads):
            for i in range(sq):
                for j in range(sk):
                    t = torch.tensor  # flex passes 0-d int tensors
                    got[b, h, i, j] = f(torch.tensor(0.0), t(b), t(h), t(i), t(j))
    return got


def test_default_score_mod_indexes_shared_and_per_head_biases_like_broadcasting():
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 2, 3, 4), (2, 1, 3, 4), (1, 1, 3, 4), (2, 2, 3, 4)]:
        bias = torch.randn(*shape, generator=g)
        got = _apply_score_mod(_FixedBias(bias), 2, 2, 3, 4)
        torch.testing.assert_close(got, bias.expand(2, 2, 3, 4), rtol=0, atol=0)


def test_a_device_move_keeps_the_work_dtype_even_under_a_float64_default():
    alibi = ALiBi(2)  # built under float32: work dtype float32
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        alibi.to("cpu")  # a move, not a cast
    finally:
        torch.set_default_dtype(old)
    assert alibi.work_dtype == torch.float32


def test_to_empty_without_recurse_leaves_the_children_alone():
    with torch.device("meta"):
        fire = FIRE(2, hidden=4)
    fire.to_empty(device="cpu", recurse=False)
    assert fire.log_c.device.type == "cpu"  # its own parameters moved
    assert fire.mlp[0].weight.device.type == "meta"  # the MLP child not


def test_check_qk_names_the_tensor_and_quotes_both_shapes():
    q = torch.zeros(2, 4, 3, 8)
    with raises_exactly("k must have shape (batch, heads, seq, head_dim=8), got (2, 2, 3, 6)"):
        check_qk(q, torch.zeros(2, 2, 3, 6), 8)
    msg = "q and k must share batch and k's heads must divide q's, got (2, 4, 3, 8) and"
    with raises_exactly(f"{msg} (1, 2, 3, 8)"):  # batch differs, heads divide
        check_qk(q, torch.zeros(1, 2, 3, 8), 8)
    with raises_exactly(f"{msg} (2, 3, 3, 8)"):  # same batch, 3 does not divide 4
        check_qk(q, torch.zeros(2, 3, 3, 8), 8)
    check_qk(q, torch.zeros(2, 1, 3, 8), 8)  # one key head for all: accepted


def test_tables_rebuilt_after_meta_init_follow_the_module_not_the_default_device():
    with torch.device("meta"):
        alibi = ALiBi(3)
        alibi.to_empty(device="cpu")  # the slopes are recomputed on the CPU, not on meta
    assert alibi.slopes.device.type == "cpu"
    torch.testing.assert_close(alibi.slopes, torch.from_numpy(posenc.alibi_slopes(3)))


def test_a_table_left_on_meta_by_assign_loading_is_built_where_the_weights_are():
    with torch.device("meta"):
        t5 = T5RelativeBias(2, num_buckets=8, max_distance=16)
    weight = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    t5.load_state_dict({"weight": weight}, assign=True)  # bucket table still on meta
    with torch.device("meta"):  # range positions carry no device: the weights decide
        bias = t5.score_bias(range(3), range(3))
    assert t5.bucket.device.type == "cpu" and bias.device.type == "cpu"
    rel = torch.arange(3)[None, :] - torch.arange(3)[:, None]  # key - query, as T5
    buckets = torch.from_numpy(posenc.t5_buckets(rel.numpy(), bidirectional=False,
                                                 num_buckets=8, max_distance=16))  # fmt: skip
    torch.testing.assert_close(bias[0], weight[buckets].permute(2, 0, 1))
