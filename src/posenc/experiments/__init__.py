"""The length-generalisation study: tasks, training, evaluation and the sweep (torch).

``python -m posenc.experiments run --quick`` runs a miniature; ``nox -s experiments``
the full grid into ``benchmarks/results/length_generalisation.jsonl``. Pages import the
pieces: ``posenc.experiments.tasks`` (the problems),
:mod:`~posenc.experiments.train` (:func:`train`, :func:`evaluate`),
:mod:`~posenc.experiments.grid` (encodings, jobs, the runner),
:mod:`~posenc.experiments.results` (files: load, merge, resume checks),
:mod:`~posenc.experiments.provenance` (the commit and machine of every row),
:mod:`~posenc.experiments.reproduce` (rerun a row and compare),
:mod:`~posenc.experiments.summary` (tables), :mod:`~posenc.experiments.stats`
(per-seed "learned", paired comparisons) and :mod:`~posenc.experiments.verdicts`
(claims and their held-out checks).
"""

from posenc.experiments.grid import ENCODINGS, VARIANTS, Job, jobs_of, run_grid, run_job
from posenc.experiments.reproduce import Rerun, rerun
from posenc.experiments.results import load, merge
from posenc.experiments.stats import Comparison, beats, learned_seeds, paired
from posenc.experiments.summary import summarise, table
from posenc.experiments.tasks import TASKS, Copy, IndirectIndexing, Lookback, Reverse, Task
from posenc.experiments.train import Config, evaluate, make_model, train
from posenc.experiments.verdicts import claims, holds

__all__ = [
    "ENCODINGS",
    "TASKS",
    "VARIANTS",
    "Comparison",
    "Config",
    "Copy",
    "IndirectIndexing",
    "Job",
    "Lookback",
    "Task",
    "beats",
    "claims",
    "holds",
    "learned_seeds",
    "paired",
    "rerun",
    "Rerun",
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
