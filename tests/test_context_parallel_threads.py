"""Context parallelism inside one process: the ranks are threads and the collectives a
small in-memory stand-in (all-gather, sum-all-reduce in rank order).

The gloo test (test_context_parallel.py) runs real process groups; this one runs the same
sharded forward and backward where a test runner sees every line (mutation testing only
picks tests that reach a function in its own process), with a world of 2 and 3 and a
gradient that differs per rank, so the backward's sum and slice are both checked.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.distributed as dist
from test_context_parallel import ENCODINGS, D, H

from posenc.torch import TransformerLM, context_parallel_forward, shard_index
from posenc.torch.model.parallel import _GatherSeq

V, N = 19, 12  # N: a multiple of 2 * world for worlds 2 and 3
ENCODINGS = {k: make for k, make in ENCODINGS.items() if k != "t5"}  # the gloo test's, but T5


class _Threads:
    """A process group whose ranks are threads: each collective meets at a barrier."""

    def __init__(self, world):
        self.world, self.slots = world, [None] * world
        self.barrier, self.local = threading.Barrier(world, timeout=60), threading.local()

    def _exchange(self, t):
        self.slots[self.local.rank] = t.detach().clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read it
        return got

    def all_gather(self, parts, x, group=None):
        assert group is self
        for part, t in zip(parts, self._exchange(x), strict=True):
            part.copy_(t)

    def all_reduce(self, t, group=None):
        assert group is self
        assert t.is_contiguous()  # as gloo and NCCL require
        t.copy_(torch.stack(self._exchange(t)).sum(0))

    def _size(self, group=None):
        assert group is self  # not the default group
        return self.world

    def _rank(self, group=None):
        assert group is self
        return self.local.rank

    def install(self, monkeypatch):
        monkeypatch.setattr(dist, "get_world_size", self._size)
        monkeypatch.setattr(dist, "get_rank", self._rank)
        monkeypatch.setattr(dist, "all_gather", self.all_gather)
        monkeypatch.setattr(dist, "all_reduce", self.all_reduce)

    def run(self, fn):
        """``fn(rank)`` on every rank, each in its own thread; the results in rank order."""
        out, errors = [None] * self.world, []

        def main(rank):
            self.local.rank = rank
            try:
                out[rank] = fn(rank)
            except BaseException as err:  # noqa: BLE001 (re-raised in the test's thread)
                errors.append(err)
                self.barrier.abort()

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


def test_the_gather_sums_every_ranks_gradient_and_keeps_its_own_slice(monkeypatch):
    group = _Threads(3)
    group.install(monkeypatch)
    xs = [torch.randn(1, 2, 4, 3, dtype=torch.float64) for _ in range(3)]
    # gradients as autograd may hand them over: not contiguous
    grads = [torch.randn(1, 12, 2, 3, dtype=torch.float64).transpose(1, 2) for _ in range(3)]

    def rank_step(rank):
        x = xs[rank].clone().requires_grad_()
        y = _GatherSeq.apply(x, group)  # (1, 2, 12, 3): every rank's rows, in rank order
        y.backward(grads[rank])  # must not write into it: grads is summed below
        return y.detach(), x.grad

    for rank, (y, grad) in enumerate(group.run(rank_step)):
        torch.testing.assert_close(y, torch.cat(xs, dim=2), rtol=0, atol=0)
        total = sum(grads)  # every rank's queries used these keys
        torch.testing.assert_close(grad, total[:, :, 4 * rank : 4 * rank + 4], rtol=0, atol=0)


@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_sharded_forward_and_gradients_equal_the_unsharded_model(name, world, balanced,
                                                                 monkeypatch):  # fmt: skip
    docs = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * N])
    _check(name, world, balanced, docs, monkeypatch)


@pytest.mark.parametrize("name", ["rope", "mrope"])
def test_without_documents_and_with_the_default_chunking(name, monkeypatch):
    _check(name, 2, None, None, monkeypatch)


def test_grid_positions(monkeypatch):
    g = torch.Generator().manual_seed(4)
    grid = torch.randint(0, 9, (2, N, 3), generator=g)  # (batch, seq, axes): M-RoPE's (t, h, w)
    _check("mrope", 2, True, None, monkeypatch, positions=grid)


def _check(name, world, balanced, docs, monkeypatch, positions=None):
    torch.manual_seed(0)
    lm = TransformerLM(V, D, 2, H, kv_heads=1, encoding=ENCODINGS[name]()).double()
    idx = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(2))
    loss = torch.nn.functional.cross_entropy
    full = lm(idx, positions, documents=docs)  # (2, N, V): the unsharded model
    loss(full.flatten(0, 1), target.flatten(), reduction="sum").backward()
    group = _Threads(world)
    group.install(monkeypatch)

    def rank_step(rank):
        chunking = {} if balanced is None else {"balanced": balanced}  # None: the default
        mine = shard_index(N, rank, world, **chunking)  # (N / world,)
        model = copy.deepcopy(lm)
        model.zero_grad()
        local = context_parallel_forward(model, idx, positions=positions, documents=docs,
                                         group=group, **chunking)  # (2, N / world, V)  # fmt: skip
        loss(local.flatten(0, 1), target[:, mine].flatten(), reduction="sum").backward()
        return mine, local.detach(), {k: p.grad for k, p in model.named_parameters()}

    results = group.run(rank_step)
    for mine, local, _ in results:
        torch.testing.assert_close(local, full[:, mine].detach(), rtol=0, atol=1e-12)
    for k, p in lm.named_parameters():
        summed = sum(grads[k] for _, _, grads in results)  # every rank's share
        torch.testing.assert_close(summed, p.grad, rtol=0, atol=1e-11)
