"""Results files: JSON lines, one row per (task, encoding, seed); load, merge, resume checks.

A row holds the accuracies (``exact`` and ``token``: test size to fraction), the final
training loss, the config, the code's stamp (``commit``, ``dirty``, ``source``: see
:mod:`posenc.experiments.provenance`), timings, machine, versions and command. One
file is one grid: every row of it has the same config and stamp (:func:`check_out`,
:func:`merge` refuse anything else).
"""

from __future__ import annotations

import json
from pathlib import Path

from posenc.experiments.provenance import STAMP, mismatch, stamp
from posenc.experiments.train import Config

__all__ = ["load", "merge", "check_out", "same_code", "write_sorted"]


def _key(row):
    return (row["task"], row["encoding"], row["seed"])


def load(path) -> list[dict]:
    """The result rows of a JSON-lines file (missing file: none).

    A last line cut short (the process was killed while writing it) is dropped: its job
    runs again.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    list of dict
        The rows.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise
    return rows


def write_sorted(path, rows):
    rows = sorted({_key(r): r for r in rows}.values(), key=_key)  # one row per key, sorted
    Path(path).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


RESULT = ("exact", "token", "final_loss", "extras", "config", *STAMP)  # what must agree


def same_code(rows, where):
    """Raise unless every row has the first row's config and code stamp."""
    if not rows:
        return
    first = {k: rows[0].get(k) for k in ("config", *STAMP)}
    for row in rows[1:]:
        diff = mismatch(row, first)
        if diff:
            raise ValueError(
                f"{where}: rows of one grid must share config and commit; "
                f"{_name(row)} differs from {_name(rows[0])}: {'; '.join(diff)}"
            )


def _name(row):
    return f"{row['task']}/{row['encoding']}/seed {row['seed']}"


def merge(out, inputs) -> list[dict]:
    """Join result files (shards) into ``out``: one row per (task, encoding, seed), sorted.

    Refuses (``ValueError``, nothing written) a missing input, two rows of one job that
    disagree (numbers, config or code stamp; timings and machine may differ), and rows
    of different configs or commits: a merged file is one grid, made by one commit.

    Parameters
    ----------
    out : str or Path
        The merged file (overwritten).
    inputs : list of str or Path
        Shard files.

    Returns
    -------
    list of dict
        The merged rows.
    """
    missing = [str(p) for p in inputs if not Path(p).is_file()]
    if missing:
        raise ValueError(f"inputs must be existing results files, missing: {', '.join(missing)}")
    seen = {}
    for path in inputs:
        for row in load(path):
            key = _key(row)
            if key in seen:
                old = seen[key]
                diff = [k for k in RESULT if old[1].get(k) != row.get(k)]
                if diff:
                    raise ValueError(f"conflicting rows for {_name(row)} in {old[0]} and "
                                     f"{path}: they differ in {', '.join(diff)}")  # fmt: skip
            else:
                seen[key] = (path, row)
    rows = [row for _, row in seen.values()]
    same_code(rows, "merge")
    write_sorted(out, rows)
    return load(out)


def check_out(out, config: Config, stamp_=None):
    """Raise ``ValueError`` unless ``out`` can be written and resumed into.

    ``out`` must be a writable file path (its directory is created); rows already in it
    must have ``config`` and this code's stamp (commit, dirty flag, source hash), else
    resuming would mix two experiments and report the old rows as this run's result.

    Parameters
    ----------
    out : str or Path
        JSON-lines results file.
    config : Config
        The run's config.
    stamp_ : dict, optional
        The code's stamp (default: ``provenance.stamp()``).
    """
    out = Path(out)
    if out.is_dir():
        raise ValueError(f"out must be a file path, got the directory {out}")
    existed = out.exists()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a"):
            pass
    except OSError as err:
        raise ValueError(f"out must be writable, got {out}: {err.strerror}") from None
    if not existed:
        out.unlink()
        return
    expected = {"config": config.as_dict(), **(stamp_ or stamp())}
    for i, row in enumerate(load(out), 1):
        diff = mismatch(row, expected)
        if diff:
            raise ValueError(
                f"{out} holds rows of another run (row {i}, {_name(row)}: {'; '.join(diff)}); "
                "resume only into a file of the same config and commit: choose another "
                "out, or check that commit out (python -m posenc.experiments rerun "
                "reproduces a row)"
            )
