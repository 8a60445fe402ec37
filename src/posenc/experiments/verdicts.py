"""Verdicts from the paired comparisons: every resolved claim among encodings, and held-out checks.

A claim "X beats Y" is drawn from some seeds (:func:`claims`) and checked on others
(:func:`holds`): the page's verdicts come from the first and are confirmed by the second.
NumPy only.
"""

from __future__ import annotations

from posenc.experiments.stats import paired

__all__ = ["claims", "holds"]


def claims(rows, task, names, size, metric="exact", *, learned_only=True) -> list:
    """Every resolved "X beats Y" among ``names`` on ``task`` at ``size`` (one per pair).

    Parameters
    ----------
    rows : list of dict
        Result rows.
    task : str
        The task.
    names : list of str
        Encodings (result names).
    size : int or str
        Test problem size.
    metric : {"exact", "token"}
        The accuracy compared.
    learned_only : bool
        As in :func:`paired`.

    Returns
    -------
    list of Comparison
        The resolved comparisons, each oriented winner first (``c.a == c.winner``).

    Examples
    --------
    >>> def row(e, s, a):
    ...     return {"task": "copy", "encoding": e, "seed": s, "exact": {"16": 1.0, "32": a}}
    >>> rows = [row(e, s, a + s / 100) for e, a in [("x", 0.9), ("y", 0.5), ("z", 0.5)]
    ...         for s in range(3)]
    >>> [(c.a, c.b) for c in claims(rows, "copy", ["x", "y", "z"], 32)]
    [('x', 'y'), ('x', 'z')]
    """
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            c = paired(rows, task, a, b, size, metric, learned_only=learned_only)
            if c.winner == b:
                c = paired(rows, task, b, a, size, metric, learned_only=learned_only)
            if c.resolved:
                out.append(c)
    return out


def holds(claim, rows, *, learned_only=True) -> bool:
    """Whether a claim drawn from some seeds holds on other seeds' rows.

    It holds when, paired on the seeds of ``rows``, at least one seed goes the claim's
    way and none goes against it (a sign count: held-out seeds are few).

    Parameters
    ----------
    claim : Comparison
        A resolved comparison (from :func:`paired` or :func:`claims`).
    rows : list of dict
        Rows of other seeds (the held-out ones).
    learned_only : bool
        As in :func:`paired`.

    Returns
    -------
    bool
        True when the held-out seeds agree with the claim.

    Examples
    --------
    >>> def row(e, s, a):
    ...     return {"task": "copy", "encoding": e, "seed": s, "exact": {"16": 1.0, "32": a}}
    >>> seen = [row(e, s, a + s / 100) for e, a in [("x", 0.9), ("y", 0.5)] for s in range(3)]
    >>> new = [row("x", 5, 0.7), row("y", 5, 0.6), row("x", 6, 0.8), row("y", 6, 0.8)]
    >>> claim = paired(seen, "copy", "x", "y", 32)
    >>> holds(claim, new), holds(claim, new + [row("x", 7, 0.1), row("y", 7, 0.2)])
    (True, False)
    """
    if not claim.resolved:
        raise ValueError(f"claim must be resolved, got {claim}")
    winner, loser = claim.winner, claim.b if claim.winner == claim.a else claim.a
    c = paired(rows, claim.task, winner, loser, claim.size, claim.metric,
               learned_only=learned_only)  # fmt: skip
    return c.wins >= 1 and c.losses == 0
