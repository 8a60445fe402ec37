"""The study harness: tasks, resuming an interrupted sweep, shards + merge, summaries."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from posenc.experiments import (
    TASKS,
    Config,
    Copy,
    IndirectIndexing,
    Lookback,
    Reverse,
    jobs_of,
    load,
    merge,
    run_grid,
    summarise,
)
from posenc.experiments.tasks import BOS, CONTENT, IGNORE, LOOK, OFFSET, OFFSETS, SEP

TINY = Config(dim=16, depth=1, heads=2, steps=3, batch=8, lengths=(4, 6), eval_size=8)
GRID = {"encodings": ["nope", "rope"], "tasks": ["copy", "lookback"], "seeds": [0]}
VOLATILE = ("seconds", "command", "machine", "versions")


def _stable(rows):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def test_tasks_hold_what_they_promise():
    gen = torch.Generator().manual_seed(0)
    x, y = Copy().batch(5, 3, gen)
    assert x.shape == (3, Copy().length(5)) and (x[:, 0] == BOS).all() and (x[:, 6] == SEP).all()
    assert torch.equal(y[:, 6:], x[:, 1:6]) and (y[:, :6] == IGNORE).all()  # copy of the input
    x, y = Reverse().batch(5, 3, gen)
    assert torch.equal(y[:, 6:], x[:, 1:6].flip(1))
    x, y = Lookback().batch(10, 4, gen)
    k = x[:, 1] - LOOK + 1  # the marker says k
    for row in range(4):
        t = torch.arange(10)
        scored = y[row, 2:] != IGNORE
        assert torch.equal(scored, t >= k[row])
        assert torch.equal(y[row, 2:][scored], x[row, 2:][t[scored] - k[row]])
    x, y = Lookback(k=3).batch(8, 2, gen)  # Parts 2-3: fixed lag, no markers
    assert x.shape == (2, 8) and torch.equal(y[:, 3:], x[:, :5]) and (y[:, :3] == IGNORE).all()
    x, y = IndirectIndexing().batch(12, 64, gen)
    c = x[:, 1:13]
    assert all(len(set(row.tolist())) == 12 for row in c)  # distinct tokens
    for row in range(64):
        o = OFFSETS[int(x[row, -1]) - OFFSET]
        i = (c[row] == x[row, -2]).nonzero().item()  # where the query sits
        assert y[row, -1] == c[row, i + o] and (y[row, :-1] == IGNORE).all()
    assert x.min() >= 0 and (x[:, 1:13] >= CONTENT).all()


def test_training_learns_an_easy_task_and_a_job_reports_every_size():
    from posenc.experiments import evaluate, make_model, run_job, train
    from posenc.experiments.grid import ENCODINGS, Job

    torch.manual_seed(0)
    config = replace(TINY, dim=32, heads=2, depth=2)
    task = Lookback(k=1, content=8)  # the previous token, 8 symbols: chance 1/8
    lm = make_model(ENCODINGS["rope"](config), config)
    log = train(lm, task, steps=200, batch=32, sizes=(8, 8))
    assert sum(log["losses"][-20:]) / 20 < 0.5 * sum(log["losses"][:20]) / 20
    assert evaluate(lm, task, [8], size=128)[8]["token"] > 0.9
    rows = run_job(Job("rope", "lookback", 0), TINY)
    names = [r["encoding"] for r in rows]
    assert names == ["rope", "rope+pi", "rope+ntk", "rope+dynamic", "rope+yarn"]
    assert all(set(r["exact"]) == set(r["token"]) == {"4", "6"} for r in rows)


def test_shards_and_merge_give_the_file_of_one_run(tmp_path):
    whole = run_grid(jobs_of(**GRID), TINY, tmp_path / "whole.jsonl", progress=False)
    for i in range(2):
        run_grid(jobs_of(**GRID, shard=(i + 1, 2)), TINY, tmp_path / f"s{i}.jsonl", progress=False)
    merged = merge(tmp_path / "merged.jsonl", [tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"])
    assert len(whole) == 2 * (1 + 5) and _stable(merged) == _stable(whole)


def test_an_interrupted_sweep_resumes_without_redoing_finished_runs(tmp_path):
    out = tmp_path / "grid.jsonl"
    slow = replace(TINY, steps=60)
    args = [sys.executable, "-m", "posenc.experiments", "run", "--encodings", "nope", "rope",
            "--tasks", "copy", "lookback", "--seeds", "0", "--dim", "16", "--depth", "1",
            "--heads", "2", "--steps", "60", "--batch", "8", "--lengths", "4", "6",
            "--eval-size", "8", "--out", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(load(out)) == 0):
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)  # midway: at least one job written, not all
    proc.wait()
    first = load(out)
    assert 0 < len(first) < 12
    calls = []
    import posenc.experiments.grid as grid

    original = grid.run_job

    def counting(job, config, progress=None):
        calls.append(job)
        return original(job, config, progress)

    grid.run_job = counting
    try:
        rows = run_grid(jobs_of(**GRID), slow, out, progress=False)
    finally:
        grid.run_job = original
    done_before = {(r["task"], r["encoding"]) for r in first}
    assert all((j.task, j.encoding) not in done_before for j in calls)  # nothing redone
    assert len(rows) == 12
    kept = {(r["task"], r["encoding"], r["seed"]): r["seconds"] for r in first}
    for r in rows:  # finished rows are the same rows, untouched
        key = (r["task"], r["encoding"], r["seed"])
        if key in kept:
            assert r["seconds"] == kept[key]


def test_rows_carry_provenance_and_summary_marks_unlearned_cells(tmp_path):
    rows = run_grid(jobs_of(["nope"], ["copy"], [0, 1]), TINY, tmp_path / "g.jsonl",
                    command="python -m posenc.experiments run (test)", progress=False)  # fmt: skip
    row = rows[0]
    assert row["command"].startswith("python -m posenc.experiments")
    assert {"torch", "posenc", "python"} <= set(row["versions"]) and row["machine"]["cores"] >= 1
    assert json.loads(json.dumps(row)) == row
    summary = summarise(rows)[("copy", "nope")]
    assert summary["seeds"] == 2 and summary["learned"] is False  # 3 steps learn nothing


def test_bad_grid_input():
    with pytest.raises(ValueError, match="encoding must be one of"):
        jobs_of(["rotary"], ["copy"], [0])
    with pytest.raises(ValueError, match="task must be one of"):
        jobs_of(["rope"], ["sort"], [0])
    with pytest.raises(ValueError, match="shard must be i/n with 1 <= i <= n, got 3/2"):
        jobs_of(["rope"], ["copy"], [0], shard=(3, 2))
    assert set(TASKS) == {"copy", "reverse", "lookback", "indirect"}
