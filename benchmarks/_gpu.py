"""The harness of the GPU benchmarks: sections that fit a short GPU run, fresh processes.

A benchmark script lists its sections (a name, what it measures, an estimate of its
minutes on an H100, and the function that measures it) and calls :func:`main`:

* ``--plan`` prints the sections and their estimates (each at most 8 minutes) and exits;
* ``--sections a,b`` runs some of them; every section appends one record (its rows, the
  device, the commit, the machine) to the results file, so sections measured in separate
  GPU runs accumulate in one file;
* a compiled configuration runs in a fresh process (:func:`fresh`): dynamo's recompile
  limit is shared by every compiled function of a process, and past it FlexAttention
  falls back to a slow path without a word;
* ``--smoke`` runs every section at toy sizes on the CPU (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import torch
from _common import machine, timeit

MAX_MINUTES = 8


@dataclass(frozen=True)
class Section:
    name: str
    about: str
    minutes: float  # estimated on an H100 (compiles dominate: ~30 s each, measured there)
    run: object  # (dev, smoke) -> list of rows


def bench(fn, rep_ms=100):
    """Median ms: ``triton.testing.do_bench`` over ``rep_ms`` on CUDA, wall clock elsewhere."""
    if torch.cuda.is_available():
        from triton.testing import do_bench

        return do_bench(fn, rep=rep_ms, return_mode="median")
    return timeit(fn, min_time=0.05, min_reps=3, warmup=1)


def fresh(script, config: dict) -> dict:
    """Run ``script --one CONFIG`` in a new process; its last stdout line is a JSON row."""
    cmd = [sys.executable, script, "--one", json.dumps(config)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=20 * 60)
    if run.returncode:
        return {**config, "error": run.stderr.strip().splitlines()[-1][:300]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def device_record(dev):
    """Where the numbers come from: the machine, the GPU, triton, the commit."""
    record = {**machine(), "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    if dev == "cuda":
        record["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    try:
        import triton

        record["triton"] = triton.__version__
    except ImportError:
        record["triton"] = None
    return record


def append(path, record):
    """Add ``record`` to the list in ``path`` (a file from before sections is kept as one)."""
    records = []
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        records = old if isinstance(old, list) else [{"section": "all (before sections)", **old}]
    records.append(record)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


def main(sections, *, description, out, one=None):
    """Parse the arguments of a sectioned benchmark and run it (see the module docstring)."""
    by_name = {s.name: s for s in sections}
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--sections", default=",".join(by_name), help="comma-separated")
    parser.add_argument("--plan", action="store_true", help="print the sections and exit")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU")
    parser.add_argument("--out", default=out)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a fresh process's configuration
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(json.loads(args.one))))
        return 0
    if args.plan:
        for s in sections:
            print(f"{s.name:<16} ~{s.minutes:4.1f} min on an H100  {s.about}")
        print(f"at most {MAX_MINUTES} min per section: --sections picks what fits a run")
        return 0
    names = [n for n in args.sections.split(",") if n]
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        parser.error(f"unknown sections {unknown}; --plan lists them")
    if args.smoke:
        dev = "cpu"
        if args.out == out:
            parser.error("--smoke needs --out (the committed file holds GPU figures only)")
    elif torch.cuda.is_available():
        dev = "cuda"
    else:
        print(f"{description}: no CUDA device here; nothing measured (--smoke to check it)")
        return 0
    info = device_record(dev)
    for name in names:
        rows = by_name[name].run(dev, args.smoke)
        for row in rows:
            print(json.dumps(row))
        append(args.out, {"section": name, **info, "rows": rows})
        print(f"{name}: {len(rows)} rows appended to {args.out}")
    return 0
