"""Context parallelism: one sequence split across the ranks of a ``torch.distributed`` group.

Each rank holds ``2 / world`` of the tokens, cut head-tail: the sequence is split into
``2 * world`` chunks and rank ``r`` takes chunks ``r`` and ``2 * world - 1 - r``, so every
rank gets the same amount of causal work (TransformerEngine's, Megatron's and
torchtitan's balance). The positions (and document ids) are sharded with the tokens, so
each rank encodes its queries and keys at their global positions; in every attention
layer the ranks all-gather the encoded keys and values (torch's own collective, with a
backward that sums the gradients back to their owners) and attend under a mask built from
the tokens' global indices. torch's ring-attention ``context_parallel`` needs CUDA and
DTensor; the all-gather runs anywhere, the gloo backend on the CPU included.

Shape legend: ``idx`` ``(batch, seq)`` whole sequences on every rank; logits ``(batch,
seq_local, vocab)`` of the rank's tokens, in :func:`shard_index` order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from posenc.torch.documents import check_agree, check_documents, positions_of
from posenc.torch.positions import position_arg

__all__ = ["shard_index", "causal_work", "context_parallel_forward", "Context"]


def shard_index(seq: int, rank: int, world: int, *, balanced: bool = True) -> torch.Tensor:
    """Global indices of the tokens one rank holds.

    Parameters
    ----------
    seq : int
        Sequence length, a multiple of ``2 * world``.
    rank : int
        The rank, in ``[0, world)``.
    world : int
        Ranks in the group.
    balanced : bool
        Head-tail chunks ``rank`` and ``2 * world - 1 - rank`` (default), or one
        contiguous piece.

    Returns
    -------
    torch.Tensor
        Int64 ``(seq // world,)``, increasing.

    Examples
    --------
    >>> from posenc.torch.model.parallel import shard_index
    >>> shard_index(8, 0, 2).tolist(), shard_index(8, 1, 2).tolist()  # chunks 0, 3 | 1, 2
    ([0, 1, 6, 7], [2, 3, 4, 5])
    """
    if world < 1 or not 0 <= rank < world or seq % (2 * world):
        raise ValueError(
            f"seq must be a multiple of 2 * world = {2 * world} and rank in [0, {world}), "
            f"got seq={seq}, rank={rank}"
        )
    if not balanced:
        size = seq // world
        return torch.arange(rank * size, (rank + 1) * size)
    chunk = seq // (2 * world)
    head = torch.arange(rank * chunk, (rank + 1) * chunk)
    tail = torch.arange((2 * world - 1 - rank) * chunk, (2 * world - rank) * chunk)
    return torch.cat([head, tail])


def causal_work(seq: int, world: int, *, balanced: bool = True) -> list:
    """Query-key pairs each rank scores under a causal mask: its share of the work.

    Parameters
    ----------
    seq : int
        Sequence length, a multiple of ``2 * world``.
    world : int
        Ranks in the group.
    balanced : bool
        Head-tail shards (default) or contiguous ones.

    Returns
    -------
    list of int
        One count per rank.

    Examples
    --------
    >>> from posenc.torch.model.parallel import causal_work
    >>> causal_work(8, 2, balanced=False), causal_work(8, 2)
    ([10, 26], [18, 18])
    """
    return [int((shard_index(seq, r, world, balanced=balanced) + 1).sum()) for r in range(world)]


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence dim (2); backward: sum every rank's gradient, keep ours."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.n = group, x.shape[2]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)  # (b, h, world * n, ·)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)  # all_reduce writes in place
        dist.all_reduce(grad, group=ctx.group)  # every rank's queries used our keys
        rank = dist.get_rank(ctx.group)
        return grad.narrow(2, rank * ctx.n, ctx.n), None


@dataclass
class Context:
    """What every attention layer of a context-parallel step shares.

    ``q_index`` ``(n_local,)`` and ``k_index`` ``(n_all,)``: the global indices of this
    rank's tokens and of every rank's, in all-gather order; ``k_positions`` and
    ``k_documents`` of every rank's tokens in that order.
    """

    group: object
    q_index: torch.Tensor
    k_index: torch.Tensor
    k_positions: torch.Tensor
    k_documents: torch.Tensor | None

    def gather(self, k, v):
        """Every rank's keys and values ``(b, kv_heads, n_all, ·)``, differentiable."""
        return _GatherSeq.apply(k, self.group), _GatherSeq.apply(v, self.group)

    def placed(self, placed, q_documents):
        """A rank's :class:`~posenc.torch.cache.step.Placed`, its keys made every rank's."""
        docs = None if q_documents is None else (q_documents, self.k_documents)
        return replace(placed, k_positions=self.k_positions, documents=docs, context=self)


def context_parallel_forward(lm, idx, *, positions=None, documents=None, group=None,
                             balanced=True):  # fmt: skip
    """The logits of this rank's tokens, the sequence split across the ranks of a group.

    Every rank passes the whole batch (same ``idx``, ``positions``, ``documents``) and gets
    the logits of its own tokens. Gradients of a loss on them, summed over the ranks
    (``all_reduce`` of each parameter's ``.grad``), are the unsharded model's.

    Parameters
    ----------
    lm : TransformerLM
        The same weights on every rank.
    idx : torch.Tensor
        Token ids ``(batch, seq)``; ``seq`` a multiple of ``2 * world``.
    positions : torch.Tensor, optional
        Global positions ``(batch|1, seq)`` (or grid coordinates); default ``0 .. seq - 1``,
        or restarting at each document.
    documents : torch.Tensor, optional
        Packed document ids ``(batch, seq)``.
    group : object, optional
        A ``torch.distributed`` process group; default: the world.
    balanced : bool
        Head-tail chunks (default) or contiguous ones.

    Returns
    -------
    torch.Tensor
        Logits ``(batch, seq // world, vocab)`` of the tokens :func:`shard_index` gives.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    b, n = idx.shape
    q_index = shard_index(n, rank, world, balanced=balanced).to(idx.device)
    k_index = torch.cat([shard_index(n, r, world, balanced=balanced) for r in range(world)])
    k_index = k_index.to(idx.device)
    axes = lm.blocks[0].attn.encoding.position_axes
    docs = None if documents is None else check_documents(documents, b, n)
    if positions is None:
        positions = range(n) if docs is None else positions_of(docs)
    pos = position_arg(positions, b, n, axes=axes)
    if isinstance(pos, range):  # its own values: a range need not start at 0
        pos = torch.arange(pos.start, pos.stop, device=idx.device)[None]
    if docs is not None:
        pos = check_agree(pos, docs)
    ctx = Context(group, q_index, k_index, pos[:, k_index],
                  None if docs is None else docs[:, k_index])  # fmt: skip
    return lm(idx[:, q_index], pos[:, q_index], context=ctx,
              documents=None if docs is None else docs[:, q_index])  # fmt: skip
