"""Summaries of a results file: mean +- sd over seeds, and "did not learn the task" marks."""

from __future__ import annotations

import statistics
from collections import defaultdict

__all__ = ["summarise", "table", "LEARNED"]

LEARNED = 0.9  # in-distribution exact match below this: "did not learn the task"


def summarise(rows, metric="exact"):
    """Mean and spread over seeds of each (task, encoding)'s accuracy at every test size.

    Parameters
    ----------
    rows : list of dict
        Result rows (see :func:`posenc.experiments.load`).
    metric : {"exact", "token"}
        Exact match or token accuracy.

    Returns
    -------
    dict
        Keyed by ``(task, encoding)``, each value a dict with ``mean`` and ``sd`` (dicts
        from test size to accuracy), ``seeds`` (int) and ``learned`` (bool); ``learned``
        is false when the mean accuracy at the smallest test size (the training size) is
        below ``LEARNED`` (0.9).
    """
    groups = defaultdict(list)
    for row in rows:
        groups[(row["task"], row["encoding"])].append(row[metric])
    out = {}
    for key, accs in groups.items():
        sizes = sorted(accs[0], key=int)
        mean = {n: statistics.fmean(a[n] for a in accs) for n in sizes}
        sd = {n: statistics.stdev(a[n] for a in accs) if len(accs) > 1 else 0.0 for n in sizes}
        out[key] = {
            "mean": mean,
            "sd": sd,
            "seeds": len(accs),
            "learned": mean[sizes[0]] >= LEARNED,
        }
    return out


def table(rows, metric="exact", order=None):
    """A plain-text table per task: encodings x test sizes, mean +- sd over seeds (percent).

    Parameters
    ----------
    rows : list of dict
        Result rows.
    metric : {"exact", "token"}
        Exact match or token accuracy.
    order : list of str, optional
        Order of the encodings.

    Returns
    -------
    str
        The tables; unlearned rows end with "did not learn the task".
    """
    summary = summarise(rows, metric)
    lines = []
    for task in sorted({t for t, _ in summary}):
        names = [e for (t, e) in summary if t == task]
        if order:
            names = sorted(names, key=lambda e: order.index(e) if e in order else len(order))
        sizes = sorted(summary[(task, names[0])]["mean"], key=int)
        lines.append(f"\n{task} ({metric} match, % mean +- sd over seeds; n = problem size)")
        lines.append(f"{'encoding':<14}" + "".join(f"{'n=' + n:>13}" for n in sizes))
        for name in names:
            s = summary[(task, name)]
            cells = "".join(f"{100 * s['mean'][n]:7.1f} +-{100 * s['sd'][n]:4.1f}" for n in sizes)
            flag = "" if s["learned"] else "   did not learn the task"
            lines.append(f"{name:<14}{cells}{flag}")
    return "\n".join(lines)
