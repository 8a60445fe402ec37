"""Running the text study: jobs (an encoding and a seed) in processes, rows as they finish.

Like the grid (:mod:`~posenc.experiments.grid`): every finished job's rows are appended
to a JSON-lines file at once, so a run that stops resumes where it stopped (only into a
file of the same config and commit); ``shard=(i, n)`` runs every ``n``-th job and
:func:`~posenc.experiments.merge` joins the shards. Rows have ``task = "text"``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
from dataclasses import replace
from pathlib import Path

from posenc.experiments.provenance import machine, stamp
from posenc.experiments.results import _key, check_out, load, write_sorted
from posenc.experiments.text_extend import extend_names, run_extend_job
from posenc.experiments.text_passkey import run_passkey_job
from posenc.experiments.text_study import TEXT_ENCODINGS, TextConfig, result_names, run_text_job
from posenc.experiments.text_today import run_today_job, today_names

__all__ = ["TEXT_SEEDS", "HELD_OUT", "STUDIES", "text_jobs", "run_text", "quick_text_config"]

TEXT_SEEDS = (0, 1, 2, 3, 4)  # 0-2 draw the verdicts, 3-4 check them (held out)
HELD_OUT = (3, 4)


def text_jobs(encodings, seeds, shard=(1, 1)) -> list[tuple]:
    """``(encoding, seed)`` jobs, RoPE's first (its extensions make it the longest), sharded.

    Examples
    --------
    >>> text_jobs(["alibi", "rope"], [0, 1], shard=(1, 2))
    [('rope', 0), ('rope', 1)]
    """
    for name in encodings:
        if name not in TEXT_ENCODINGS:
            raise ValueError(f"encoding must be one of {sorted(TEXT_ENCODINGS)}, got {name!r}")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    i, n = shard
    if not 1 <= i <= n:
        raise ValueError(f"shard must be i/n with 1 <= i <= n, got {i}/{n}")
    order = sorted(encodings, key=lambda e: e != "rope")
    return [(e, s) for s in seeds for e in order][i - 1 :: n]


# study -> (the rows' task, result names of an encoding's job, the job)
STUDIES = {
    "text": ("text", result_names, run_text_job),
    "extend": ("text-extend", lambda encoding: extend_names(), run_extend_job),
    "passkey": ("text-passkey", lambda name: [name], run_passkey_job),
    "today": ("text-today", today_names, run_today_job),
}


def _worker(args):
    (encoding, seed), config, study = args
    return encoding, seed, STUDIES[study][2](encoding, seed, config)


def run_text(jobs, config: TextConfig, out, *, processes=2, command=None, progress=True,
             study="text"):  # fmt: skip
    """Run the jobs not yet in ``out``, appending each job's rows when it finishes.

    Parameters
    ----------
    jobs : list of tuple
        From :func:`text_jobs`.
    config : TextConfig
        Model, budget and evaluation.
    out : str or Path
        JSON-lines results file (resumed if its rows have this config and code).
    processes : int
        Worker processes, one thread each.
    command : str, optional
        Recorded with every row (default: this process's command line).
    progress : bool
        A progress bar over the jobs.
    study : {"text", "extend", "passkey", "today"}
        The text study, the extension of its RoPE model to matched targets
        (:mod:`~posenc.experiments.text_extend`; jobs ``("rope", seed)``), passkey
        retrieval through training (:mod:`~posenc.experiments.text_passkey`; jobs from
        :func:`~posenc.experiments.text_passkey.passkey_jobs`), or today's schedules
        (:mod:`~posenc.experiments.text_today`; jobs from
        :func:`~posenc.experiments.text_today.today_jobs`).

    Returns
    -------
    list of dict
        Every row of ``out`` after the run, sorted.
    """
    from tqdm import tqdm

    if study not in STUDIES:
        raise ValueError(f"study must be one of {sorted(STUDIES)}, got {study!r}")
    task, names, _ = STUDIES[study]
    out, code = Path(out), stamp()
    check_out(out, config, code)
    done = {_key(r) for r in load(out)}
    todo = [j for j in jobs if any((task, n, j[1]) not in done for n in names(j[0]))]
    meta = machine(command or " ".join([Path(sys.executable).name, *sys.argv])) | code
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=f"{study} study", unit="run",
               disable=not progress)  # fmt: skip
    work = [(j, config, study) for j in todo]
    if processes > 1 and len(todo) > 1:
        pool = mp.get_context("spawn").Pool(processes)  # torch is not fork-safe
        results = pool.imap_unordered(_worker, work)
    else:
        pool, results = None, map(_worker, work)
    try:
        for encoding, seed, rows in results:
            with out.open("a") as f:
                f.writelines(
                    json.dumps(r | {"task": task, "seed": seed, "config": config.as_dict()}
                               | meta, sort_keys=True) + "\n"
                    for r in rows
                )  # fmt: skip
            bar.update(1)
            bar.set_postfix_str(f"{encoding}/seed {seed}")
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    write_sorted(out, load(out))
    return load(out)


def quick_text_config(config: TextConfig) -> TextConfig:
    """A miniature for ``--quick`` and the tests: a few steps, two lengths, little text."""
    return replace(config, steps=30, finetune_steps=5, multiples=(1, 2), eval_bytes=2048,
                   trials=4)  # fmt: skip
