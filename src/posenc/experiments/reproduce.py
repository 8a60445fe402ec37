"""Rerun one row of a results file with its own config and compare the numbers exactly.

Training is deterministic on CPU as the harness runs it (one thread, the model seeded
with ``torch.manual_seed(seed)``, the data with a generator of its own), so a row rerun
with the code of its commit, on the same CPU kind and torch build, gives the same
accuracies, final loss and PoPE deltas bit for bit. Elsewhere it is one more sample:
float sums differ between AVX2 and AVX-512 kernels and training amplifies them, so
:func:`rerun` names a CPU capability, BLAS or torch that differs as the likely cause.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from posenc.experiments.grid import ENCODINGS, VARIANTS, Job, run_job
from posenc.experiments.provenance import machine_notes, stamp
from posenc.experiments.results import load
from posenc.experiments.train import Config

__all__ = ["Rerun", "find_row", "rerun"]

COMPARED = ("exact", "token", "final_loss", "extras")


@dataclass(frozen=True)
class Rerun:
    """The outcome of :func:`rerun`.

    Parameters
    ----------
    job : Job
        The job trained again (RoPE's for a ``rope+...`` row).
    differences : tuple of str
        One line per differing value (result name, field, committed and fresh).
    compared : tuple of str
        The result names compared (every row of the job present in the file).
    fields : tuple of str
        The values compared: those of ``exact``, ``token``, ``final_loss`` and ``extras``
        that the file's rows record (older rows have no final loss).
    notes : tuple of str
        What may explain a difference: another commit, a dirty tree, a row without one.
    """

    job: Job
    differences: tuple
    compared: tuple
    fields: tuple
    notes: tuple

    @property
    def same(self) -> bool:
        """Whether every compared number is equal."""
        return not self.differences


def find_row(rows, *, row=None, encoding=None, task=None, seed=None) -> dict:
    """A row by its 1-based line number, or by encoding, task and seed (``ValueError`` if none).

    Parameters
    ----------
    rows : list of dict
        The rows of a file, in file order.
    row : int, optional
        Line number, from 1.
    encoding, task : str, optional
        With ``seed``: the row's key.
    seed : int, optional
        The row's seed.

    Returns
    -------
    dict
        The row.

    Examples
    --------
    >>> rows = [{"task": "copy", "encoding": "rope", "seed": 0}]
    >>> find_row(rows, row=1) is find_row(rows, encoding="rope", task="copy", seed=0)
    True
    """
    if row is not None:
        if not 1 <= row <= len(rows):
            raise ValueError(f"row must be in 1..{len(rows)} (a line of the file), got {row}")
        return rows[row - 1]
    if None in (encoding, task, seed):
        raise ValueError("give row, or all of encoding, task and seed")
    for r in rows:
        if (r["encoding"], r["task"], r["seed"]) == (encoding, task, seed):
            return r
    raise ValueError(f"no row for encoding={encoding!r}, task={task!r}, seed={seed!r}")


def _config(row):
    names = {f.name for f in fields(Config)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in row["config"].items()}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ValueError(f"the row's config has fields this code lacks: {unknown}")
    return Config(**given)


def rerun(path, *, row=None, encoding=None, task=None, seed=None, progress=None) -> Rerun:
    """Train a row's job again with the row's config and compare every number of the job.

    Parameters
    ----------
    path : str or Path
        Results file.
    row, encoding, task, seed
        Which row (see ``find_row``).
    progress : callable, optional
        Passed to the training loop.

    Returns
    -------
    Rerun
        ``.same`` is true when the fresh numbers equal the file's exactly.
    """
    rows = load(path)
    target = find_row(rows, row=row, encoding=encoding, task=task, seed=seed)
    name = "rope" if target["encoding"] in VARIANTS else target["encoding"]
    if name not in ENCODINGS:
        raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, got {name!r}")
    job = Job(name, target["task"], target["seed"])
    notes = []
    here = stamp()
    if target.get("commit") is None:
        notes.append("the row records no commit: it may come from any version of the code")
    elif target["commit"] != here["commit"] or target.get("source") != here["source"]:
        notes.append(f"the row was made at commit {target['commit']}"
                     f"{' (dirty)' if target.get('dirty') else ''}; this code is "
                     f"{here['commit']}{' (dirty)' if here['dirty'] else ''}")  # fmt: skip
    notes += machine_notes(target)
    fresh = {r["encoding"]: r for r in run_job(job, _config(target), progress)}
    committed = {r["encoding"]: r for r in rows if _key_of(r) == _key_of(target)}
    differences, checked = [], set()
    for result, old in committed.items():
        new = fresh[result]
        for field in COMPARED:
            if field in old:
                checked.add(field)
            if field in old and old[field] != new.get(field):
                differences.append(f"{result} {field}: {_diff(old[field], new.get(field))}")
    checked = tuple(f for f in COMPARED if f in checked)
    return Rerun(job, tuple(differences), tuple(committed), checked, tuple(notes))


def _diff(old, new):
    """The differing values, compactly: per test size, or the largest change of a list."""
    if isinstance(old, dict) and isinstance(new, dict) and set(old) == set(new):
        parts = [f"{k}: {_diff(old[k], new[k])}" for k in old if old[k] != new[k]]
        return "{" + ", ".join(parts) + "}"
    flat_old, flat_new = _flat(old), _flat(new)
    if flat_old is not None and flat_new is not None and len(flat_old) == len(flat_new) > 1:
        change = max(abs(a - b) for a, b in zip(flat_old, flat_new, strict=True))
        return f"{len(flat_old)} values, largest change {change:.3g}"
    return f"{old} in the file, {new} now"


def _flat(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        parts = [_flat(v) for v in value]
        return None if None in parts else [x for p in parts for x in p]
    return None


def _key_of(row):  # the job a row belongs to
    name = "rope" if row["encoding"] in VARIANTS else row["encoding"]
    return (row["task"], name, row["seed"])
