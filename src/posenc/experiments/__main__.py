"""Command line: ``python -m posenc.experiments {run,text,merge,table,compare,rerun} ...``.

Every bad argument is answered with a usage message (exit status 2) before any training.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import fields, replace

from posenc.experiments.grid import ENCODINGS, VARIANTS, check_grid, jobs_of, quick_config, run_grid
from posenc.experiments.results import check_out, load, merge
from posenc.experiments.stats import paired
from posenc.experiments.summary import table
from posenc.experiments.tasks import TASKS
from posenc.experiments.train import Config

DEFAULT_OUT = "benchmarks/results/length_generalisation.jsonl"
TEXT_OUT = "benchmarks/results/text_study.jsonl"
TEXT_OUTS = {"text": TEXT_OUT, "extend": "benchmarks/results/text_extend.jsonl",
             "passkey": "benchmarks/results/text_passkey.jsonl",
             "today": "benchmarks/results/text_today.jsonl"}  # fmt: skip
SEEDS = [0, 1, 2, 3, 4]
QUICK = {"encodings": ["nope", "rope", "alibi"], "seeds": [0]}
ORDER = list(ENCODINGS) + list(VARIANTS)


def _shard(text):
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be i/n (e.g. 1/4), got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"must be i/n with 1 <= i <= n, got {text!r}")
    return i, n


def _natural(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return value


def _positive(text):
    value = _natural(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _parser(defaults):
    parser = argparse.ArgumentParser(prog="python -m posenc.experiments", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a grid of training runs")
    run.add_argument("--encodings", nargs="+", default=list(ENCODINGS), choices=list(ENCODINGS))
    run.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    run.add_argument("--seeds", nargs="+", type=_natural, default=None,
                     help=f"distinct seeds (default {' '.join(map(str, SEEDS))})")  # fmt: skip
    run.add_argument("--jobs", type=_positive, default=1, help="local worker processes")
    run.add_argument("--shard", type=_shard, default=(1, 1),
                     help="i/n, 1 <= i <= n: run the i-th of n shares of the grid (every n-th "
                          "job from the i-th); shards 1/n .. n/n together run it all")  # fmt: skip
    run.add_argument("--out", default=None,
                     help=f"results file, resumed if it holds rows of the same config and "
                          f"commit (default {DEFAULT_OUT}; with --quick a new temporary "
                          f"file)")  # fmt: skip
    run.add_argument("--quick", action="store_true",
                     help="miniature: 3 encodings, 1 seed, 300 steps")  # fmt: skip
    run.add_argument("--no-progress", action="store_true")
    for f in fields(Config):
        value = getattr(defaults, f.name)
        kind = int if isinstance(value, tuple) else type(value)
        run.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None,
                         nargs="+" if isinstance(value, tuple) else None)  # fmt: skip
    _text_parser(sub)
    mer = sub.add_parser("merge", help="join result files (shards) into one")
    mer.add_argument("out")
    mer.add_argument("inputs", nargs="+")
    tab = sub.add_parser("table", help="print the tables of a results file")
    tab.add_argument("path", nargs="?", default=DEFAULT_OUT)
    tab.add_argument(
        "--metric",
        choices=["exact", "token"],
        default="exact",
        help="tabulated metric; 'learned' is judged by exact match either way",
    )
    cmp = sub.add_parser("compare", help="paired comparison of two encodings, seed by seed")
    cmp.add_argument("a", choices=ORDER)
    cmp.add_argument("b", choices=ORDER)
    cmp.add_argument("--task", required=True, choices=list(TASKS))
    cmp.add_argument("--path", default=DEFAULT_OUT)
    cmp.add_argument("--metric", choices=["exact", "token"], default="exact")
    cmp.add_argument(
        "--all-seeds",
        action="store_true",
        help="pair every seed, not only those where both learned the task",
    )
    rer = sub.add_parser("rerun", help="train a row's job again and compare its numbers "
                                       "(exit status 1 on any difference)")  # fmt: skip
    rer.add_argument("path")
    rer.add_argument("--row", type=_positive, help="line number in the file, from 1")
    rer.add_argument("--encoding", choices=ORDER)
    rer.add_argument("--task", choices=list(TASKS))
    rer.add_argument("--seed", type=_natural)
    return parser


def _text_parser(sub):
    from posenc.experiments.text_run import TEXT_SEEDS
    from posenc.experiments.text_study import TEXT_ENCODINGS, TextConfig

    text = sub.add_parser("text", help="run (or resume) the text study")
    text.add_argument("--study", choices=list(TEXT_OUTS), default="text",
                      help="the text study; its RoPE model extended to matched targets; "
                      "passkey retrieval through training (default seeds 0 1 2); or today's "
                      "schedules (Part 8)")  # fmt: skip
    text.add_argument("--encodings", nargs="+", default=None, choices=list(TEXT_ENCODINGS),
                      help="default: all (with --study extend: rope, the only one)")  # fmt: skip
    text.add_argument("--seeds", nargs="+", type=_natural, default=None,
                      help=f"default {list(TEXT_SEEDS)}")  # fmt: skip
    text.add_argument("--jobs", type=_positive, default=2, help="local worker processes")
    text.add_argument("--shard", type=_shard, default=(1, 1), help="i/n: as for run")
    text.add_argument("--out", default=None, help=f"results file (default {TEXT_OUT}; with "
                      "--quick a new temporary file)")  # fmt: skip
    text.add_argument("--quick", action="store_true", help="miniature: a few steps")
    text.add_argument("--no-progress", action="store_true")
    for f in fields(TextConfig):
        value = getattr(TextConfig(), f.name)
        kind = int if isinstance(value, tuple) else type(value)
        text.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None,
                          nargs="+" if isinstance(value, tuple) else None)  # fmt: skip


def _text(parser, args, argv):
    from posenc.experiments.text_passkey import PASSKEY_SEEDS, passkey_jobs
    from posenc.experiments.text_run import TEXT_SEEDS, quick_text_config, run_text, text_jobs
    from posenc.experiments.text_today import today_jobs
    from posenc.experiments.text_study import TEXT_ENCODINGS, TextConfig

    given = {f.name: getattr(args, f.name) for f in fields(TextConfig)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v is not None}
    try:
        config = replace(quick_text_config(TextConfig()) if args.quick else TextConfig(), **given)
        default = ["rope"] if args.study == "extend" else list(TEXT_ENCODINGS)
        encodings = args.encodings or default
        if args.study == "extend" and encodings != ["rope"]:
            raise ValueError(f"--study extend extends RoPE only, got --encodings {encodings}")
        if args.study in ("passkey", "today"):
            if args.encodings:
                raise ValueError(f"--study {args.study} runs its own models: give no "
                                 "--encodings")  # fmt: skip
            seeds = args.seeds or list(PASSKEY_SEEDS if args.study == "passkey" else TEXT_SEEDS)
            text_jobs([], seeds, args.shard)  # the same checks of seeds and shard
            i, n = args.shard
            make = passkey_jobs if args.study == "passkey" else today_jobs
            jobs = make(seeds)[i - 1 :: n]
        else:
            jobs = text_jobs(encodings, args.seeds or list(TEXT_SEEDS), args.shard)
        out = args.out or (
            os.path.join(tempfile.mkdtemp(prefix="posenc-quick-"), "text.jsonl")
            if args.quick
            else TEXT_OUTS[args.study]
        )
        check_out(out, config)
    except ValueError as err:
        parser.error(str(err))
    rows = run_text(jobs, config, out, processes=args.jobs, progress=not args.no_progress,
                    command="python -m posenc.experiments " + " ".join(argv),
                    study=args.study)  # fmt: skip
    print(f"{len(rows)} rows in {out}")
    return 0


def _file(parser, path):
    rows = load(path) if os.path.isfile(path) else None
    if not rows:
        parser.error(f"{path}: no such results file, or no rows in it")
    return rows


def main(argv=None):
    defaults = Config()
    parser = _parser(defaults)
    args = parser.parse_args(argv)
    if args.command == "merge":
        try:
            rows = merge(args.out, args.inputs)
        except ValueError as err:
            parser.error(str(err))
        print(f"{len(rows)} rows -> {args.out}")
        return 0
    if args.command == "table":
        print(table(_file(parser, args.path), args.metric, ORDER))
        return 0
    if args.command == "compare":
        rows = _file(parser, args.path)
        sizes = sorted(rows[0]["exact"], key=int)
        for n in sizes:
            print(paired(rows, args.task, args.a, args.b, n, args.metric,
                         learned_only=not args.all_seeds))  # fmt: skip
        return 0
    if args.command == "rerun":
        return _rerun(parser, args)
    if args.command == "text":
        return _text(parser, args, sys.argv[1:] if argv is None else argv)
    return _run(parser, args, defaults, sys.argv[1:] if argv is None else argv)


def _rerun(parser, args):
    from posenc.experiments.reproduce import rerun

    if args.row is None and None in (args.encoding, args.task, args.seed):
        parser.error("rerun needs --row, or all of --encoding, --task and --seed")
    _file(parser, args.path)
    try:
        result = rerun(args.path, row=args.row, encoding=args.encoding, task=args.task,
                       seed=args.seed)  # fmt: skip
    except ValueError as err:
        parser.error(str(err))
    job = result.job
    print(f"reran {job.encoding}/{job.task}/seed {job.seed}; compared {', '.join(result.compared)}")
    for note in result.notes:
        print("note:", note)
    if result.same:
        print(f"same numbers: every value of {', '.join(result.fields)} is equal")
        return 0
    print("DIFFERENT:\n  " + "\n  ".join(result.differences))
    return 1


def _run(parser, args, defaults, argv):
    config = quick_config(defaults) if args.quick else defaults
    given = {f.name: getattr(args, f.name) for f in fields(Config)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v is not None}
    encodings, seeds = args.encodings, args.seeds
    if args.quick:
        encodings = QUICK["encodings"] if args.encodings == list(ENCODINGS) else encodings
        seeds = QUICK["seeds"] if seeds is None else seeds
    seeds = SEEDS if seeds is None else seeds
    try:
        config = replace(config, **given)
        jobs = jobs_of(encodings, args.tasks, seeds, args.shard)
        check_grid(jobs, config)
        if config.device != "cpu":
            import torch

            if not torch.cuda.is_available():
                raise ValueError(f"device must be available, got {config.device!r} (no CUDA)")
        out = args.out or (
            os.path.join(tempfile.mkdtemp(prefix="posenc-quick-"), "quick.jsonl")
            if args.quick
            else DEFAULT_OUT
        )
        check_out(out, config)
    except ValueError as err:
        parser.error(str(err))
    command = "python -m posenc.experiments " + " ".join(argv)
    rows = run_grid(jobs, config, out, processes=args.jobs, command=command,
                    progress=not args.no_progress)  # fmt: skip
    print(table(rows, "exact", ORDER))
    print(f"\n{len(rows)} rows in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
