"""Context parallelism on torch.distributed (gloo, CPU): with 2 and 4 ranks, the sharded
forward and the gradients (summed over ranks) equal the unsharded model in float64, for
RoPE, ALiBi, T5, PoPE and M-RoPE, with packed documents."""

import os
import re
import tempfile
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_mha_edges import _Spy  # an encoding that records its inplace flags

from posenc.torch import (
    ALiBi,
    MRoPE,
    PoPE,
    RotaryEmbedding,
    T5RelativeBias,
    TransformerLM,
    causal_work,
    context_parallel_forward,
    shard_index,
)

V, D, H, HD, N = 23, 16, 2, 8, 16
ENCODINGS = {
    "rope": lambda: RotaryEmbedding(HD, max_len=64),
    "alibi": lambda: ALiBi(H),
    "t5": lambda: T5RelativeBias(H, num_buckets=8, max_distance=16),
    "pope": lambda: PoPE(HD, H, delta_init="uniform"),
    "mrope": lambda: MRoPE(HD, sections=(2, 1, 1), max_len=64),
}
DOCS = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [0] * 16])


@pytest.fixture
def one_rank(tmp_path):
    """A gloo group of one rank in this process, destroyed afterwards."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    yield
    dist.destroy_process_group()


def _run(rank, world, path, out):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    errors = {}
    for name, make in ENCODINGS.items():
        torch.manual_seed(0)
        lm = TransformerLM(V, D, 2, H, kv_heads=1, encoding=make()).double()
        idx = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(1))
        target = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(2))
        full = lm(idx, documents=DOCS)  # the unsharded model, (2, N, V)
        torch.nn.functional.cross_entropy(
            full.flatten(0, 1), target.flatten(), reduction="sum"
        ).backward()
        want = {k: p.grad.clone() for k, p in lm.named_parameters()}
        lm.zero_grad()
        mine = shard_index(N, rank, world)
        local = context_parallel_forward(lm, idx, documents=DOCS)  # (2, N / world, V)
        loss = torch.nn.functional.cross_entropy(local.flatten(0, 1), target[:, mine].flatten(),
                                                 reduction="sum")  # fmt: skip
        loss.backward()
        err = float((local.detach() - full[:, mine].detach()).abs().max())
        for k, p in lm.named_parameters():
            dist.all_reduce(p.grad)  # every rank's share of the gradient
            err = max(err, float((p.grad - want[k]).abs().max()))
        errors[name] = err
    refusal = None
    try:  # coordinates of the wrong width, named by the global shape the caller passed
        context_parallel_forward(lm, idx, positions=torch.zeros(2, N, 2, dtype=torch.long))
    except ValueError as e:
        refusal = str(e)
    short = TransformerLM(V, D, 1, H, encoding=RotaryEmbedding(HD, max_len=64), max_len=N - 4)
    try:  # the model's max_len bounds the whole sequence, not this rank's share of it
        context_parallel_forward(short, idx)
        too_long = None
    except ValueError as e:
        too_long = str(e)
    if rank == 0:
        torch.save((errors, refusal, too_long), out)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_forward_and_gradients_equal_the_unsharded_model(world):
    with tempfile.TemporaryDirectory() as tmp:
        path, out = os.path.join(tmp, "store"), os.path.join(tmp, "errors.pt")
        mp.spawn(_run, args=(world, path, out), nprocs=world, join=True)
        errors, refusal, too_long = torch.load(out)
    assert set(errors) == set(ENCODINGS)
    assert max(errors.values()) < 1e-10, errors
    assert refusal == (  # the last model is M-RoPE's
        f"positions must have shape (seq,) or (batch, seq) = (2, {N}), or "
        f"(batch, seq, n_axes=3) coordinates, got (2, {N}, 2)"
    )
    assert too_long == f"sequence length must be <= max_len={N - 4}, got {N}"


def test_head_tail_chunks_balance_causal_work():
    contiguous, balanced = causal_work(4096, 4, balanced=False), causal_work(4096, 4)
    print(f"causal work per rank, 4 ranks, 4096 tokens: contiguous {contiguous}, "
          f"head-tail {balanced}")  # fmt: skip
    assert max(contiguous) / min(contiguous) > 6  # the last rank does 7x the first's work
    assert max(balanced) == min(balanced)  # every rank the same
    every = torch.cat([shard_index(24, r, 3) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))  # each token on exactly one rank
    with pytest.raises(ValueError, match="seq must be a multiple of 2 \\* world = 6"):
        shard_index(10, 0, 3)


def test_positions_given_as_a_range_keep_their_start(one_rank):
    # one gloo rank in this process: the sharded forward at positions 5.. is the model's
    from posenc.torch import SinusoidalEncoding

    torch.manual_seed(0)
    lm = TransformerLM(V, D, 1, H, encoding=SinusoidalEncoding(D, max_len=64)).double()
    idx = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = context_parallel_forward(lm, idx, positions=range(5, 13))
        want = lm(idx, range(5, 13))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_length_dependent_rope_is_refused_and_qk_are_overwritten_only_outside_autograd(one_rank):
    # dynamic NTK re-rotates every key with each step's table; a rank sees only its keys
    from posenc.scaling import DynamicNTK

    rope = RotaryEmbedding(HD, scaling=DynamicNTK(2.0, 8), max_len=64)
    lm = TransformerLM(V, D, 1, H, encoding=rope)
    why = "RotaryEmbedding rotates keys by the whole length: it cannot run context-parallel"
    with pytest.raises(ValueError, match=f"^{why}$"):
        context_parallel_forward(lm, torch.zeros(1, 8, dtype=torch.long))

    spy = _Spy()  # records whether q, k are handed over to overwrite
    lm = TransformerLM(V, D, 1, H, encoding=spy)
    context_parallel_forward(lm, torch.zeros(1, 8, dtype=torch.long))  # in the graph
    with torch.no_grad():
        context_parallel_forward(lm, torch.zeros(1, 8, dtype=torch.long))  # ours alone
    assert spy.flags == [False, True]


def test_grid_coordinates_given_to_a_sharded_forward(one_rank):
    # one gloo rank: M-RoPE's (batch, seq, 3) coordinates go through as the model takes them
    torch.manual_seed(0)
    lm = TransformerLM(V, 24, 1, H, encoding=MRoPE(12, sections=(2, 2, 2), max_len=32))
    lm = lm.double()
    idx = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(3))
    coords = torch.randint(0, 32, (1, 8, 3), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = context_parallel_forward(lm, idx, positions=coords)
        want = lm(idx, coords)
        assert (want - lm(idx, coords[..., [0, 0, 0]])).abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    why = ("positions must have shape (seq,) or (batch, seq) = (1, 8), or "
           "(batch, seq, n_axes=3) coordinates, got (1, 8, 2)")  # fmt: skip
    with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
        context_parallel_forward(lm, idx, positions=coords[..., :2])


def test_flex_is_refused_by_a_sharded_forward(one_rank):
    lm = TransformerLM(V, D, 1, H, encoding=ALiBi(H), backend="flex")
    why = "backend 'flex' does not run context-parallel steps: use 'sdpa'"
    with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
        context_parallel_forward(lm, torch.zeros(1, 8, dtype=torch.long))


def test_shards_and_work_by_hand():
    # 8 tokens on 2 ranks: chunks of 2, rank 0 holds chunks 0 and 3 (head-tail by default)
    assert shard_index(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert shard_index(8, 1, 2).tolist() == [2, 3, 4, 5]
    contiguous = shard_index(8, 1, 2, balanced=False)
    assert contiguous.tolist() == [4, 5, 6, 7] and contiguous.dtype == torch.int64
    assert shard_index(8, 0, 2, balanced=False).tolist() == [0, 1, 2, 3]
    # causal pairs: token i scores i + 1 keys
    assert causal_work(8, 2, balanced=False) == [1 + 2 + 3 + 4, 5 + 6 + 7 + 8]
    assert causal_work(8, 2) == [1 + 2 + 7 + 8, 3 + 4 + 5 + 6]
    for seq, rank, world in [(8, 2, 2), (8, -1, 2), (8, 0, 0), (6, 0, 2)]:
        why = (f"seq must be a multiple of 2 * world = {2 * world} and rank in [0, {world}), "
               f"got seq={seq}, rank={rank}")  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(why)):
            shard_index(seq, rank, world)


def test_a_sharded_forward_refuses_a_cache_or_a_padding_mask_each_alone():
    # the guard in TransformerLM.forward (context is set only by context_parallel_forward)
    lm = TransformerLM(V, D, 1, H, encoding=RotaryEmbedding(HD, max_len=32))
    idx = torch.zeros(1, 4, dtype=torch.long)
    why = "context parallelism takes no cache and no padding_mask"
    for kw in ({"cache": lm.new_cache(1, 4)}, {"padding_mask": torch.ones(1, 4, dtype=torch.bool)}):
        with pytest.raises(ValueError, match=f"^{why}$"):
            lm(idx, context=SimpleNamespace(k_index=torch.arange(4)), **kw)


def test_a_model_refuses_coordinates_of_the_wrong_width_by_its_encodings_axes():
    lm = TransformerLM(V, 24, 1, H, encoding=MRoPE(12, sections=(2, 2, 2), max_len=32))
    why = (
        "positions must have shape (seq,) or (batch, seq) = (1, 4), or (batch, seq, n_axes=3) "
        "coordinates, got (1, 4, 2)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
        lm(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, 2, dtype=torch.long))
