"""The study's grid: encodings x tasks x seeds, run in processes, one JSON line per result.

A *job* trains one encoding on one task with one seed and evaluates it at every test
size; the RoPE job also evaluates the trained model with four inference-time scalings
(``rope+pi``, ``rope+ntk``, ``rope+dynamic``, ``rope+yarn``), each its own result. Every
finished job's results are appended to the JSON-lines file at once, so a sweep that stops
resumes where it stopped; ``--shard i/n`` runs every ``n``-th job and ``merge`` joins the
shards' files into the file one run would have written.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from posenc.experiments.provenance import machine, stamp
from posenc.experiments.results import _key, check_out, load, write_sorted
from posenc.experiments.tasks import TASKS
from posenc.experiments.train import Config, evaluate, make_model, train
from posenc.scaling import NTK, DynamicNTK, Linear, YaRN
from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    LearnedEncoding,
    NoPE,
    PoPE,
    RotaryEmbedding,
    SinusoidalEncoding,
    T5RelativeBias,
    XPos,
)

__all__ = ["ENCODINGS", "VARIANTS", "Job", "jobs_of", "check_grid", "run_job", "run_grid",
           "quick_config"]  # fmt: skip

# trained encodings: name -> factory(config)
ENCODINGS = {
    "nope": lambda c: NoPE(),
    "sinusoidal": lambda c: SinusoidalEncoding(c.dim, max_len=c.max_len),
    "learned": lambda c: LearnedEncoding(c.max_len, c.dim),
    "rope": lambda c: RotaryEmbedding(c.dim // c.heads, max_len=c.max_len),
    "xpos": lambda c: XPos(c.dim // c.heads, max_len=c.max_len),
    "alibi": lambda c: ALiBi(c.heads),
    "t5": lambda c: T5RelativeBias(c.heads),
    "kerple": lambda c: KERPLE(c.heads),
    "fire": lambda c: FIRE(c.heads),
    "pope": lambda c: PoPE(c.dim // c.heads, c.heads),
}

# inference-time scalings of the trained RoPE model: name -> scaling(length ratio s, L_train)
VARIANTS = {
    "rope+pi": lambda s, L: Linear(s),
    "rope+ntk": lambda s, L: NTK(s),
    "rope+dynamic": lambda s, L: DynamicNTK(1.0, L),
    "rope+yarn": lambda s, L: YaRN(s, L),
}


@dataclass(frozen=True)
class Job:
    """One training run of the grid: an encoding on a task with a seed.

    Parameters
    ----------
    encoding : str
        A name in ``ENCODINGS``; a trained RoPE job also yields the ``VARIANTS`` rows.
    task : str
        A name in ``posenc.experiments.TASKS``.
    seed : int
        Seed of the initialisation and of the training problems.
    """

    encoding: str
    task: str
    seed: int

    @property
    def names(self):
        """Every result name this job writes."""
        return [self.encoding] + (list(VARIANTS) if self.encoding == "rope" else [])


def jobs_of(encodings, tasks, seeds, shard=(1, 1)):
    """The grid's jobs in a fixed order, then shard ``(i, n)``: every ``n``-th from the ``i``-th.

    Parameters
    ----------
    encodings : list of str
        Names in ``ENCODINGS``.
    tasks : list of str
        Names in ``posenc.experiments.TASKS``.
    seeds : list of int
        Distinct seeds, each ``>= 0``.
    shard : tuple of int
        ``(i, n)`` with ``1 <= i <= n``: this machine's share of the grid; shards
        ``1/n .. n/n`` together run every job once.

    Returns
    -------
    list of Job
        One per (task, encoding, seed), RoPE's inference-time variants included in its jobs.

    Examples
    --------
    >>> [j.seed for j in jobs_of(["rope"], ["copy"], [0, 1, 2, 3, 4], shard=(2, 2))]
    [1, 3]
    """
    for name in encodings:
        if name not in ENCODINGS:
            raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, got {name!r}")
    for name in tasks:
        if name not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {name!r}")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    i, n = shard
    if not 1 <= i <= n:
        raise ValueError(f"shard must be i/n with 1 <= i <= n, got {i}/{n}")
    jobs = [Job(e, t, s) for t in tasks for e in encodings for s in seeds]
    return jobs[i - 1 :: n]


def check_grid(jobs, config: Config):
    """Raise ``ValueError`` (before any training) if a job cannot run with ``config``.

    The position tables of the absolute encodings must hold the longest test sequence,
    and indirect indexing needs as many distinct content tokens as the largest problem.

    Parameters
    ----------
    jobs : list of Job
        From :func:`jobs_of`.
    config : Config
        Model and budget.
    """
    largest = max(config.lengths[-1], config.train_max)
    for job in jobs:
        longest = TASKS[job.task].length(largest)
        if job.encoding in ("sinusoidal", "learned") and longest > config.max_len:
            raise ValueError(f"max_len must hold the longest {job.task} sequence ({longest} "
                             f"tokens at n={largest}), got {config.max_len}")  # fmt: skip
        if job.task == "indirect" and config.content < largest:
            raise ValueError(f"content must be >= {largest} (indirect indexing draws n "
                             f"distinct tokens), got {config.content}")  # fmt: skip


def _rows(job, config, results, seconds, extras, loss):
    rows = []
    for name, accs in results.items():
        row = {
            "encoding": name, "task": job.task, "seed": job.seed,
            "exact": {str(n): a["exact"] for n, a in accs.items()},
            "token": {str(n): a["token"] for n, a in accs.items()},
            "seconds": seconds[name], "config": config.as_dict(), "final_loss": loss,
        }  # fmt: skip
        if name in extras:
            row["extras"] = extras[name]
        rows.append(row)
    return rows


def run_job(job: Job, config: Config, progress=None) -> list[dict]:
    """Train and evaluate one job (plus RoPE's inference-time variants); its result rows.

    Parameters
    ----------
    job : Job
        Encoding, task and seed.
    config : Config
        Model and budget.
    progress : callable, optional
        Passed to :func:`~posenc.experiments.train`.

    Returns
    -------
    list of dict
        One row per result name (the encoding, and RoPE's variants).
    """
    torch.set_num_threads(1)  # models this small train fastest on one thread
    task = TASKS[job.task]
    torch.manual_seed(job.seed)
    lm = make_model(ENCODINGS[job.encoding](config), config)
    log = train(lm, task, steps=config.steps, batch=config.batch, lr=config.lr,
                sizes=(config.train_min, config.train_max), warmup=config.warmup,
                seed=job.seed, device=config.device, progress=progress)  # fmt: skip
    kw = {"size": config.eval_size, "device": config.device}
    results = {job.encoding: evaluate(lm, task, config.lengths, **kw)}
    seconds = {job.encoding: log["seconds"]}
    extras = {}
    if job.encoding == "pope":
        extras["pope"] = {"delta": lm.encoding.delta.detach().cpu().tolist()}
    if job.encoding == "rope":
        trained = task.length(config.train_max)  # the longest sequence seen in training
        for name, make in VARIANTS.items():
            start, accs = time.perf_counter(), {}
            for n in config.lengths:
                s = max(1.0, task.length(n) / trained)
                scaling = make(s, trained) if s > 1 or name == "rope+dynamic" else None
                rope = RotaryEmbedding(config.dim // config.heads, scaling=scaling,
                                       max_len=config.max_len)  # fmt: skip
                variant = make_model(rope, config)
                variant.load_state_dict(lm.state_dict())  # same weights, new rotations
                accs.update(evaluate(variant, task, [n], **kw))
            results[name], seconds[name] = accs, time.perf_counter() - start
    return _rows(job, config, results, seconds, extras, log["losses"][-1])


def _worker(args):
    job, config = args
    return job, run_job(job, config)


def run_grid(jobs, config, out, *, processes=1, command=None, progress=True):
    """Run the jobs not yet in ``out``, appending each job's rows as soon as it finishes.

    Every row records the config, the code's stamp (``commit``, ``dirty``, ``source``;
    see ``posenc.experiments.provenance``), the machine, versions and command.

    Parameters
    ----------
    jobs : list of Job
        From :func:`jobs_of`.
    config : Config
        Model and budget.
    out : str or Path
        JSON-lines results file; its rows (of this config and code: ``check_out``,
        else ``ValueError`` before any training) are kept and their jobs skipped.
    processes : int
        Local worker processes (each on one thread).
    command : str, optional
        Recorded with every row (default: this process's command line).
    progress : bool
        Show a progress bar of the grid (tqdm).

    Returns
    -------
    list of dict
        Every row of ``out`` after the run, sorted.
    """
    out = Path(out)
    code = stamp()
    check_grid(jobs, config)
    check_out(out, config, code)
    done = {_key(r) for r in load(out)}
    todo = [j for j in jobs if any((j.task, n, j.seed) not in done for n in j.names)]
    meta = machine(command or " ".join([Path(sys.executable).name, *sys.argv])) | code
    bar = _bar(len(jobs), len(jobs) - len(todo), progress)
    if processes > 1 and len(todo) > 1:
        ctx = mp.get_context("spawn")  # torch is not fork-safe
        pool = ctx.Pool(processes)
        results = pool.imap_unordered(_worker, [(j, config) for j in todo])
    else:
        pool, results = None, map(_worker, [(j, config) for j in todo])
    try:
        for job, rows in results:
            with out.open("a") as f:  # at once: an interrupted sweep loses at most its running jobs
                f.writelines(json.dumps(r | meta, sort_keys=True) + "\n" for r in rows)
            bar.update(1)
            bar.set_postfix_str(f"{job.encoding}/{job.task}/seed {job.seed}")
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    write_sorted(out, load(out))
    return load(out)


def _bar(total, initial, enabled):
    from tqdm import tqdm  # plain text bar: tqdm.auto warns inside notebooks without ipywidgets

    return tqdm(total=total, initial=initial, desc="grid", unit="run", disable=not enabled)


def quick_config(config: Config) -> Config:
    """The miniature: few steps, three test sizes (for ``--quick``)."""
    return replace(config, steps=300, lengths=(16, 32, 64), eval_size=256)
