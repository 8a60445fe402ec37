"""Synthetic tasks of the length-generalisation study: every one needs position to solve.

A task draws a batch of ``n``-token problems as ``(x, y)``: int64 ``(batch, seq)`` inputs
and targets, ``y = -100`` where nothing is scored. The vocabulary is shared:

====================  =========================================================
ids                   tokens
====================  =========================================================
0, 1, 2               PAD, BOS, SEP
3 .. 10               ``K1 .. K8``: "look back k" markers (lookback)
11 .. 18              ``O-4 .. O-1, O1 .. O4``: offsets (indirect indexing)
19 .. 19 + C - 1      ``C`` content tokens (default 64)
====================  =========================================================

Targets are scored under teacher forcing: exact match (every scored token of a problem
right) and token accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, BOS, SEP = 0, 1, 2
LOOK = 3  # K1 = 3 .. K8 = 10
OFFSET = 11  # O-4 = 11 .. O-1 = 14, O1 = 15 .. O4 = 18
CONTENT = 19
OFFSETS = (-4, -3, -2, -1, 1, 2, 3, 4)
IGNORE = -100

__all__ = ["Task", "Copy", "Reverse", "Lookback", "IndirectIndexing", "TASKS", "vocab_size"]


def vocab_size(content: int = 64) -> int:
    """Vocabulary of the study: specials, markers, offsets and ``content`` tokens."""
    return CONTENT + content


@dataclass(frozen=True)
class Task:
    """Base class of the tasks.

    Parameters
    ----------
    content : int
        Number of content tokens.
    """

    content: int = 64

    name = "task"

    def batch(self, n, size, generator):
        """``size`` problems of size ``n``.

        Parameters
        ----------
        n : int
            Problem size (the number of content tokens of the input).
        size : int
            Number of problems.
        generator : torch.Generator
            Source of randomness.

        Returns
        -------
        x : torch.Tensor
            Int64 inputs ``(size, length(n))``.
        y : torch.Tensor
            Int64 targets, same shape; ``-100`` where nothing is scored.
        """
        raise NotImplementedError

    def length(self, n):
        """Sequence length of the inputs for problems of size ``n``.

        Parameters
        ----------
        n : int
            Problem size.

        Returns
        -------
        int
            ``x.shape[1]`` of :meth:`batch`.
        """
        raise NotImplementedError

    def _tokens(self, n, size, generator):
        return CONTENT + torch.randint(0, self.content, (size, n), generator=generator)


@dataclass(frozen=True)
class Copy(Task):
    """Copy: a sequence, a separator, then the same sequence predicted token by token.

    ``BOS c_1 .. c_n SEP`` then the same ``n`` tokens.

    Parameters
    ----------
    content : int
        Number of content tokens.
    """

    name = "copy"

    def _answer(self, c):
        return c

    def batch(self, n, size, generator):
        c = self._tokens(n, size, generator)  # (size, n)
        bos = torch.full((size, 1), BOS)
        sep = torch.full((size, 1), SEP)
        seq = torch.cat([bos, c, sep, self._answer(c)], 1)  # (size, 2n + 2)
        x, y = seq[:, :-1], seq[:, 1:].clone()  # next-token prediction
        y[:, : n + 1] = IGNORE  # only the answer is scored
        return x, y

    def length(self, n):
        return 2 * n + 1


@dataclass(frozen=True)
class Reverse(Copy):
    """Reverse: a sequence, a separator, then the sequence backwards.

    ``BOS c_1 .. c_n SEP`` then ``c_n .. c_1``.

    Parameters
    ----------
    content : int
        Number of content tokens.
    """

    name = "reverse"

    def _answer(self, c):
        return c.flip(1)


@dataclass(frozen=True)
class Lookback(Task):
    """At every token, the token ``k`` places back (part 2's lag task, ``k`` in context).

    ``BOS K_k c_1 .. c_n``: the target at :math:`c_t` is :math:`c_{t-k}` for
    :math:`t > k`; ``k`` is drawn from ``1 .. min(max_k, n - 1)`` per problem. With a
    fixed ``k`` the input is just ``c_1 .. c_n`` with tokens ``0 .. content - 1`` (no
    specials, vocabulary ``content``), as in Parts 2 and 3.

    Parameters
    ----------
    content : int
        Number of content tokens.
    k : int, optional
        A fixed lag (no markers); default: drawn per problem.
    max_k : int
        Largest lag drawn.
    """

    k: int | None = None
    max_k: int = 8

    name = "lookback"

    def batch(self, n, size, generator):
        c = self._tokens(n, size, generator)  # (size, n)
        if self.k is not None:
            c = c - CONTENT  # no special tokens: ids 0 .. content - 1
            y = torch.roll(c, self.k, dims=1)
            y[:, : self.k] = IGNORE
            return c, y
        top = min(self.max_k, n - 1)  # every problem keeps a scored token
        k = torch.randint(1, top + 1, (size, 1), generator=generator)  # (size, 1)
        t = torch.arange(n)[None]  # (1, n)
        back = c.gather(1, (t - k).clamp(min=0))  # c_{t-k}
        y = torch.where(t >= k, back, IGNORE)  # (size, n)
        x = torch.cat([torch.full((size, 1), BOS), LOOK - 1 + k, c], 1)  # (size, n + 2)
        return x, torch.cat([torch.full((size, 2), IGNORE), y], 1)

    def length(self, n):
        return n if self.k is not None else n + 2


@dataclass(frozen=True)
class IndirectIndexing(Task):
    """The PoPE paper's indirect indexing: find a query token, answer the one at an offset.

    ``BOS c_1 .. c_n SEP q O_o`` with distinct ``c`` and ``q = c_i``; the answer is
    :math:`c_{i+o}`, predicted at the last position. Offsets ``o`` in ``{-4..-1, 1..4}``
    (those with ``|o| < n``).

    Parameters
    ----------
    content : int
        Number of content tokens; at least the largest problem size.
    """

    name = "indirect"

    def batch(self, n, size, generator):
        if n > self.content:
            raise ValueError(f"n must be <= content={self.content} (distinct tokens), got {n}")
        c = torch.rand(size, self.content, generator=generator).argsort(1)[:, :n] + CONTENT
        allowed = torch.tensor([v for v in OFFSETS if abs(v) < n])  # an answer must exist
        o = allowed[torch.randint(0, len(allowed), (size,), generator=generator)]
        lo, hi = (-o).clamp(min=0), n - 1 - o.clamp(min=0)  # valid query slots
        i = lo + (torch.rand(size, generator=generator) * (hi - lo + 1)).long()  # (size,)
        rows = torch.arange(size)
        q, ans = c[rows, i], c[rows, i + o]
        off = OFFSET + torch.tensor([OFFSETS.index(v) for v in o.tolist()])
        x = torch.cat([torch.full((size, 1), BOS), c, torch.full((size, 1), SEP),
                       q[:, None], off[:, None]], 1)  # fmt: skip
        y = torch.full_like(x, IGNORE)
        y[:, -1] = ans
        return x, y

    def length(self, n):
        return n + 4


TASKS = {t.name: t for t in (Copy(), Reverse(), Lookback(), IndirectIndexing())}
