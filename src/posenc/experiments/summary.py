"""Summaries of a results file: mean +- sd over seeds, and how many seeds learned each task.

"Learned" is judged per seed by exact match at the smallest test size, whatever metric
is tabulated (:func:`posenc.experiments.stats.learned_seeds`); a cell is ranked only
where every seed learned.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from posenc.experiments.stats import LEARNED

__all__ = ["summarise", "table", "LEARNED"]


def summarise(rows, metric="exact"):
    """Mean and spread over seeds of each (task, encoding)'s accuracy at every test size.

    Parameters
    ----------
    rows : list of dict
        Result rows (see :func:`posenc.experiments.load`).
    metric : {"exact", "token"}
        Exact match or token accuracy (of ``mean`` and ``sd``; never of ``learned``).

    Returns
    -------
    dict
        Keyed by ``(task, encoding)``, each value a dict with ``mean`` and ``sd`` (dicts
        from test size to accuracy), ``seeds`` (int), ``learned_seeds`` (int: the seeds
        whose exact match at the smallest test size is at least ``LEARNED``, 0.9) and
        ``learned`` (bool: every seed learned).

    Examples
    --------
    >>> rows = [{"task": "copy", "encoding": "rope", "seed": s, "exact": {"16": a},
    ...          "token": {"16": 0.99}} for s, a in [(0, 1.0), (1, 0.95), (2, 0.13)]]
    >>> s = summarise(rows, "token")[("copy", "rope")]
    >>> s["seeds"], s["learned_seeds"], s["learned"]
    (3, 2, False)
    """
    if metric not in ("exact", "token"):
        raise ValueError(f"metric must be 'exact' or 'token', got {metric!r}")
    groups = defaultdict(list)
    for row in rows:
        groups[(row["task"], row["encoding"])].append(row)
    out = {}
    for key, group in groups.items():
        accs = [r[metric] for r in group]
        sizes = sorted(accs[0], key=int)
        mean = {n: statistics.fmean(a[n] for a in accs) for n in sizes}
        sd = {n: statistics.stdev(a[n] for a in accs) if len(accs) > 1 else 0.0 for n in sizes}
        learned = sum(r["exact"][min(r["exact"], key=int)] >= LEARNED for r in group)
        out[key] = {
            "mean": mean,
            "sd": sd,
            "seeds": len(accs),
            "learned_seeds": learned,
            "learned": learned == len(accs),
        }
    return out


def table(rows, metric="exact", order=None):
    """A plain-text table per task: encodings x test sizes, mean +- sd over seeds (percent).

    Parameters
    ----------
    rows : list of dict
        Result rows.
    metric : {"exact", "token"}
        Exact match or token accuracy; "learned" is judged by exact match either way.
    order : list of str, optional
        Order of the encodings.

    Returns
    -------
    str
        The tables; a row ends with "did not learn the task (0/3 seeds)" or "learned by
        2/3 seeds" unless every seed learned.
    """
    summary = summarise(rows, metric)
    lines = []
    for task in sorted({t for t, _ in summary}):
        names = [e for (t, e) in summary if t == task]
        if order:
            names = sorted(names, key=lambda e: order.index(e) if e in order else len(order))
        sizes = sorted(summary[(task, names[0])]["mean"], key=int)
        what = "exact match" if metric == "exact" else "token accuracy"
        lines.append(f"\n{task} ({what}, % mean +- sd over seeds; n = problem size)")
        lines.append(f"{'encoding':<14}" + "".join(f"{'n=' + n:>13}" for n in sizes))
        for name in names:
            s = summary[(task, name)]
            cells = "".join(f"{100 * s['mean'][n]:7.1f} +-{100 * s['sd'][n]:4.1f}" for n in sizes)
            k, seeds = s["learned_seeds"], s["seeds"]
            flag = "" if s["learned"] else f"   learned by {k}/{seeds} seeds"
            if k == 0:
                flag = f"   did not learn the task (0/{seeds} seeds)"
            lines.append(f"{name:<14}{cells}{flag}")
    return "\n".join(lines)
