"""Timing and machine description shared by the benchmark scripts."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

import torch


def timeit(fn, min_time=0.4, min_reps=7, max_reps=50, warmup=3):
    """Median wall time in ms of ``fn()`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < min_reps or (
        time.perf_counter() - start < min_time and len(times) < max_reps
    ):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def machine():
    """CPU model, cores, torch threads, versions, today's date, and the code measured.

    ``code`` is the git commit, a dirty flag (uncommitted changes under ``src/``) and a hash
    of the package source (:func:`posenc.experiments.provenance.stamp`); ``command`` is the
    command line, so a committed result says what produced it.
    """
    from posenc.experiments.provenance import stamp

    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "code": stamp(),
        "command": " ".join(["python", *sys.argv]),
    }
