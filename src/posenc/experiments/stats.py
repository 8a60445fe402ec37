"""Per-seed statistics of the study: which seeds learned a task, and paired comparisons.

*Learned* is judged per seed and by one metric whatever is tabulated: a seed learned a
task when its exact match at the smallest test size (in distribution: the study tests
from ``n = 16``, the largest training size) is at least ``LEARNED`` (0.9).

Comparisons are *paired by seed*: for one seed, every encoding trains on the same stream
of problems (the data generator is seeded by the seed alone) and every model is tested on
the same problems (seeded by the size alone), so the per-seed difference removes the
variance that the data share. "X beats Y" is *resolved* only when the 95 % t-interval of
the mean per-seed difference excludes 0 **and** no seed goes the other way; anything
else is reported as not resolved. NumPy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["LEARNED", "Comparison", "per_seed", "learned_seeds", "paired", "beats", "t_quantile",
           "interval"]  # fmt: skip

LEARNED = 0.9  # a seed with in-distribution exact match below this did not learn the task

# two-sided 95 % quantiles t_{0.975, df}, df = 1..30 (any table of Student's t)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t_quantile(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (95 % two-sided).

    A table for ``df <= 30``; above, the Cornish-Fisher expansion around the normal
    quantile 1.95996 (error below 1e-4 there).

    Parameters
    ----------
    df : int
        Degrees of freedom, at least 1.

    Returns
    -------
    float
        The quantile.

    Examples
    --------
    >>> t_quantile(4)
    2.776
    >>> round(t_quantile(1000), 3)
    1.962
    """
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an int >= 1, got {df!r}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def interval(values) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean and 95 % t-interval of ``values`` (sequence of float),
    one per seed; ``nan`` bounds for fewer than two.

    Examples
    --------
    >>> [round(v, 3) for v in interval([0.4, 0.3, 0.3])]
    [0.333, 0.19, 0.477]
    """
    d = np.asarray(values, dtype=np.float64)  # (seeds,)
    mean = float(d.mean()) if len(d) else math.nan
    if len(d) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d))
    return mean, mean - half, mean + half


def per_seed(rows, task, encoding, size, metric="exact") -> dict:
    """``{seed: accuracy}`` of one encoding on one task at one test size.

    Parameters
    ----------
    rows : list of dict
        Result rows.
    task, encoding : str
        The cell.
    size : int or str
        Test problem size.
    metric : {"exact", "token", "passkey", "-loss"}
        Exact match or token accuracy (the grid); passkey accuracy or the loss per byte,
        negated so that higher is better here too (the text study).

    Returns
    -------
    dict
        Seed to value, sorted by seed.

    Examples
    --------
    >>> rows = [{"task": "copy", "encoding": "rope", "seed": 1, "exact": {"16": 0.5}}]
    >>> per_seed(rows, "copy", "rope", 16)
    {1: 0.5}
    >>> per_seed([{"task": "text", "encoding": "rope", "seed": 0, "loss": {"128": 1.5}}],
    ...          "text", "rope", 128, "-loss")
    {0: -1.5}
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    sign, key = (-1.0, metric[1:]) if metric.startswith("-") else (1.0, metric)
    found = {r["seed"]: sign * r[key][str(size)] for r in rows
             if r["task"] == task and r["encoding"] == encoding}  # fmt: skip
    return dict(sorted(found.items()))


METRICS = ("exact", "token", "passkey", "-loss")


def learned_seeds(rows, task, encoding) -> list:
    """The seeds that learned the task: exact match >= ``LEARNED`` at the smallest size.

    Parameters
    ----------
    rows : list of dict
        Result rows.
    task, encoding : str
        The cell.

    Returns
    -------
    list of int
        Sorted seeds.

    Examples
    --------
    >>> rows = [{"task": "copy", "encoding": "rope", "seed": s,
    ...          "exact": {"16": a, "32": 0.0}} for s, a in [(0, 1.0), (1, 0.13), (2, 0.95)]]
    >>> learned_seeds(rows, "copy", "rope")
    [0, 2]
    """
    out = []
    for r in rows:
        if r["task"] == task and r["encoding"] == encoding:
            smallest = min(r["exact"], key=int)
            if r["exact"][smallest] >= LEARNED:
                out.append(r["seed"])
    return sorted(out)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison of encodings ``a`` and ``b`` (``a - b``, per seed).

    Parameters
    ----------
    task, a, b, metric : str
        What was compared.
    size : int
        Test problem size.
    seeds : tuple of int
        The seeds paired (both ran; with ``learned_only``, both learned).
    diffs : tuple of float
        ``a - b`` per seed, in the order of ``seeds``.
    mean, low, high : float
        Mean difference and its 95 % t-interval (``nan`` with fewer than 2 seeds).
    wins, losses, ties : int
        Seeds where ``a`` is above, below, equal to ``b``.
    dropped : tuple of int
        Seeds left out because one of the two did not learn the task (or did not run).
    """

    task: str
    a: str
    b: str
    size: int
    metric: str
    seeds: tuple
    diffs: tuple
    mean: float
    low: float
    high: float
    wins: int
    losses: int
    ties: int
    dropped: tuple

    @property
    def winner(self):
        """``a`` or ``b`` where resolved (interval excludes 0, no seed against), else None."""
        if len(self.seeds) < 2:
            return None
        if self.low > 0 and self.losses == 0:
            return self.a
        if self.high < 0 and self.wins == 0:
            return self.b
        return None

    @property
    def resolved(self) -> bool:
        """Whether the pairing tells the two apart (see ``winner``)."""
        return self.winner is not None

    def __str__(self):
        verdict = f"{self.winner} better" if self.resolved else "not resolved"
        if self.dropped:
            left = ", ".join(map(str, self.dropped))
            verdict += f" (seeds {left} left out: not learned or missing)"
        return (f"{self.task} n={self.size} {self.metric}: {self.a} - {self.b} = "
                f"{100 * self.mean:+.1f} pts (95% CI {100 * self.low:+.1f} .. "
                f"{100 * self.high:+.1f}), seeds {self.wins}+ {self.losses}- {self.ties}= "
                f"of {len(self.seeds)}: {verdict}")  # fmt: skip


def paired(rows, task, a, b, size, metric="exact", *, learned_only=True) -> Comparison:
    """Compare ``a`` with ``b`` on ``task`` at ``size``, paired by seed.

    Parameters
    ----------
    rows : list of dict
        Result rows.
    task : str
        The task.
    a, b : str
        Encodings (result names, e.g. ``"rope+yarn"``).
    size : int or str
        Test problem size.
    metric : {"exact", "token"}
        The accuracy compared ("learned" is always judged by exact match).
    learned_only : bool
        Pair only the seeds where both learned the task (default): an encoding that did
        not learn is not ranked on extrapolation.

    Returns
    -------
    Comparison
        Differences, interval, sign count and verdict.

    Examples
    --------
    >>> def row(e, s, a):
    ...     return {"task": "copy", "encoding": e, "seed": s, "exact": {"16": 1.0, "32": a}}
    >>> rows = [row("x", s, a) for s, a in enumerate([0.9, 0.8, 0.7])]
    >>> rows += [row("y", s, a) for s, a in enumerate([0.5, 0.5, 0.4])]
    >>> c = paired(rows, "copy", "x", "y", 32)
    >>> [round(d, 2) for d in c.diffs], round(c.low, 3), round(c.high, 3), c.winner
    ([0.4, 0.3, 0.3], 0.19, 0.477, 'x')
    """
    xa, xb = per_seed(rows, task, a, size, metric), per_seed(rows, task, b, size, metric)
    seeds = sorted(set(xa) & set(xb))
    if learned_only:
        both = set(learned_seeds(rows, task, a)) & set(learned_seeds(rows, task, b))
        seeds = [s for s in seeds if s in both]
    dropped = tuple(sorted((set(xa) | set(xb)) - set(seeds)))
    d = np.array([xa[s] - xb[s] for s in seeds], dtype=np.float64)  # (seeds,)
    mean, low, high = interval(d)
    return Comparison(task=task, a=a, b=b, size=int(size), metric=metric, seeds=tuple(seeds),
                      diffs=tuple(d.tolist()), mean=mean, low=low, high=high,
                      wins=int((d > 0).sum()), losses=int((d < 0).sum()),
                      ties=int((d == 0).sum()), dropped=dropped)  # fmt: skip


def beats(rows, task, a, b, size, metric="exact", *, learned_only=True) -> bool:
    """Whether "``a`` beats ``b`` on ``task`` at ``size``" is resolved by the pairing.

    Parameters
    ----------
    rows : list of dict
        Result rows.
    task, a, b : str
        Task and encodings.
    size : int or str
        Test problem size.
    metric : {"exact", "token"}
        The accuracy compared.
    learned_only : bool
        As in :func:`paired`.

    Returns
    -------
    bool
        True only when :func:`paired` resolves the comparison in ``a``'s favour; False
        when ``b`` wins *or* nothing is resolved (``beats(b, a)`` tells which).

    Examples
    --------
    >>> def row(e, s, a):
    ...     return {"task": "copy", "encoding": e, "seed": s, "exact": {"16": 1.0, "32": a}}
    >>> rows = [row("x", s, a) for s, a in enumerate([0.9, 0.4, 0.7])]
    >>> rows += [row("y", s, 0.5) for s in range(3)]
    >>> beats(rows, "copy", "x", "y", 32), beats(rows, "copy", "y", "x", 32)
    (False, False)
    """
    return paired(rows, task, a, b, size, metric, learned_only=learned_only).winner == a
