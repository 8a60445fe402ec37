"""Command line: ``python -m posenc.experiments {run,merge,table} ...`` (``--help`` on each)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace

from posenc.experiments.grid import ENCODINGS, jobs_of, merge, quick_config, run_grid
from posenc.experiments.summary import table
from posenc.experiments.tasks import TASKS
from posenc.experiments.train import Config

DEFAULT_OUT = "benchmarks/results/length_generalisation.jsonl"
QUICK = {"encodings": ["nope", "rope", "alibi"], "seeds": [0]}
ORDER = list(ENCODINGS) + ["rope+pi", "rope+ntk", "rope+dynamic", "rope+yarn"]


def _shard(text):
    i, n = (int(v) for v in text.split("/"))
    return i, n


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m posenc.experiments", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a grid of training runs")
    run.add_argument("--encodings", nargs="+", default=list(ENCODINGS), choices=list(ENCODINGS))
    run.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--jobs", type=int, default=1, help="local worker processes")
    run.add_argument("--shard", type=_shard, default=(0, 1), help="i/n: every n-th job from i")
    run.add_argument("--out", default=None, help=f"results file (default {DEFAULT_OUT})")
    run.add_argument(
        "--quick", action="store_true", help="miniature: 3 encodings, 1 seed, 300 steps"
    )
    run.add_argument("--no-progress", action="store_true")
    defaults = Config()
    for f in fields(Config):
        value = getattr(defaults, f.name)
        if isinstance(value, tuple):
            run.add_argument(f"--{f.name.replace('_', '-')}", nargs="+", type=int, default=None)
        else:
            run.add_argument(f"--{f.name.replace('_', '-')}", type=type(value), default=None)
    mer = sub.add_parser("merge", help="join result files (shards) into one")
    mer.add_argument("out")
    mer.add_argument("inputs", nargs="+")
    tab = sub.add_parser("table", help="print the tables of a results file")
    tab.add_argument("path", nargs="?", default=DEFAULT_OUT)
    tab.add_argument("--metric", choices=["exact", "token"], default="exact")
    args = parser.parse_args(argv)

    if args.command == "merge":
        rows = merge(args.out, args.inputs)
        print(f"{len(rows)} rows -> {args.out}")
        return 0
    if args.command == "table":
        from posenc.experiments.grid import load

        print(table(load(args.path), args.metric, ORDER))
        return 0
    config = quick_config(defaults) if args.quick else defaults
    given = {f.name: getattr(args, f.name) for f in fields(Config)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v is not None}
    config = replace(config, **given)
    encodings, seeds = args.encodings, args.seeds
    if args.quick:
        encodings = QUICK["encodings"] if args.encodings == list(ENCODINGS) else encodings
        seeds = QUICK["seeds"] if args.seeds == [0, 1, 2] else seeds
    out = args.out or ("benchmarks/results/quick.jsonl" if args.quick else DEFAULT_OUT)
    jobs = jobs_of(encodings, args.tasks, seeds, args.shard)
    command = "python -m posenc.experiments " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = run_grid(jobs, config, out, processes=args.jobs, command=command,
                    progress=not args.no_progress)  # fmt: skip
    print(table(rows, "exact", ORDER))
    print(f"\n{len(rows)} rows in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
