"""The length-generalisation study: tasks, training, evaluation and the sweep (torch).

``python -m posenc.experiments run --quick`` runs a miniature; ``nox -s experiments``
the full grid into ``benchmarks/results/length_generalisation.jsonl``. Pages import the
pieces: ``posenc.experiments.tasks`` (the problems),
:mod:`~posenc.experiments.train` (:func:`train`, :func:`evaluate`),
:mod:`~posenc.experiments.grid` (encodings, jobs, the runner) and
:mod:`~posenc.experiments.summary` (tables).
"""

from posenc.experiments.grid import (
    ENCODINGS,
    VARIANTS,
    Job,
    jobs_of,
    load,
    merge,
    run_grid,
    run_job,
)
from posenc.experiments.summary import summarise, table
from posenc.experiments.tasks import TASKS, Copy, IndirectIndexing, Lookback, Reverse, Task
from posenc.experiments.train import Config, evaluate, make_model, train

__all__ = [
    "ENCODINGS",
    "TASKS",
    "VARIANTS",
    "Config",
    "Copy",
    "IndirectIndexing",
    "Job",
    "Lookback",
    "Task",
    "Reverse",
    "evaluate",
    "jobs_of",
    "load",
    "make_model",
    "merge",
    "run_grid",
    "run_job",
    "summarise",
    "table",
    "train",
]
