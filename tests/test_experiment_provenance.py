"""The study's provenance: stamps, resume refusals, merge refusals, exact reruns, CLI errors."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

import posenc.experiments.__main__ as cli
import posenc.experiments.grid as grid
from posenc.experiments import Config, jobs_of, load, merge, rerun, run_grid
from posenc.experiments.provenance import PACKAGE, stamp

TINY = Config(dim=16, depth=1, heads=2, steps=3, batch=8, lengths=(4, 6), eval_size=8)


@pytest.fixture
def no_training(monkeypatch):
    """Any training attempt fails the test: errors must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("trained before refusing")

    monkeypatch.setattr(grid, "run_job", refuse)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _git(*args, cwd):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def test_stamp_names_the_commit_and_sees_a_dirty_tree(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(PACKAGE, repo / "src" / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".gitignore").write_text("__pycache__/\n")
    _git("init", "-q", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "x", cwd=repo)
    head = _git("rev-parse", "HEAD", cwd=repo)
    module = repo / "src" / "posenc" / "experiments" / "provenance.py"
    code = f"import json, runpy; print(json.dumps(runpy.run_path({str(module)!r})['stamp']()))"

    def stamp_of():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        return json.loads(out.stdout)

    clean = stamp_of()
    assert clean["commit"] == head and clean["dirty"] is False
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "results.jsonl").write_text("{}\n")  # outside src: still clean
    assert stamp_of() == clean
    with (repo / "src" / "posenc" / "scaling.py").open("a") as f:
        f.write("# an edit\n")
    dirty = stamp_of()
    assert dirty["commit"] == head and dirty["dirty"] is True
    assert dirty["source"] != clean["source"]  # two dirty trees are told apart by the hash


def test_rows_record_the_stamp_and_resume_refuses_another_config_or_commit(tmp_path, monkeypatch):
    out = tmp_path / "g.jsonl"
    rows = run_grid(jobs_of(["nope"], ["copy"], [0]), TINY, out, progress=False)
    assert {k: rows[0][k] for k in ("commit", "dirty", "source")} == stamp()
    assert len(rows[0]["source"]) == 64 and isinstance(rows[0]["final_loss"], float)
    monkeypatch.setattr(grid, "run_job", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(ValueError, match=r"row 1, copy/nope/seed 0: config.steps: 3 in the row, "):
        run_grid(jobs_of(["nope"], ["copy"], [0, 1]), replace(TINY, steps=4), out, progress=False)
    for key, value in [("commit", "0" * 40), ("source", "f" * 64), ("commit", None)]:
        _write(out, [rows[0] | {key: value}])
        with pytest.raises(ValueError, match=f"holds rows of another run .*{key}: "):
            run_grid(jobs_of(["nope"], ["copy"], [0, 1]), TINY, out, progress=False)
    legacy = {k: v for k, v in rows[0].items() if k not in ("commit", "dirty", "source")}
    _write(out, [legacy])  # a row of the committed file before rows had stamps
    with pytest.raises(ValueError, match="commit: None in the row"):
        run_grid(jobs_of(["nope"], ["copy"], [0]), TINY, out, progress=False)
    _write(out, rows)  # the same run: nothing left to do, the rows come back
    assert run_grid(jobs_of(["nope"], ["copy"], [0]), TINY, out, progress=False) == rows


def test_a_row_reruns_bit_for_bit_and_a_changed_number_is_caught(tmp_path, capsys):
    out = tmp_path / "g.jsonl"
    config = replace(TINY, steps=40, eval_size=32)
    rows = run_grid(jobs_of(["rope", "pope"], ["lookback"], [1]), config, out, progress=False)
    assert len(rows) == 6
    result = rerun(out, encoding="rope+yarn", task="lookback", seed=1)
    assert result.same and result.job.encoding == "rope" and len(result.compared) == 5
    assert cli.main(["rerun", str(out), "--row", "1"]) == 0  # pope, its deltas compared too
    assert "every value of exact, token, final_loss, extras is equal" in capsys.readouterr().out
    tampered = json.loads(json.dumps(rows))
    tampered[0]["extras"]["delta"][0][0] += 0.5  # pope's learned offsets
    _write(out, tampered)
    assert cli.main(["rerun", str(out), "--row", "1"]) == 1
    assert "largest change 0.5" in capsys.readouterr().out
    tampered = json.loads(json.dumps(rows))
    tampered[1]["final_loss"] += 1e-12  # rope's row: one bit-level change
    _write(out, tampered)
    assert cli.main(["rerun", str(out), "--encoding", "rope", "--task", "lookback",
                     "--seed", "1"]) == 1  # fmt: skip
    said = capsys.readouterr().out
    assert "DIFFERENT" in said and "rope final_loss" in said
    _write(out, [{k: v for k, v in r.items() if k != "commit"} for r in rows])
    assert cli.main(["rerun", str(out), "--row", "1"]) == 0
    assert "records no commit" in capsys.readouterr().out


def test_two_processes_give_the_rows_of_one(tmp_path):
    jobs = jobs_of(["alibi", "kerple"], ["copy"], [0])
    one = run_grid(jobs, TINY, tmp_path / "one.jsonl", progress=False)
    two = run_grid(jobs, TINY, tmp_path / "two.jsonl", processes=2, progress=False)
    keys = ("encoding", "exact", "token", "final_loss", "commit", "source")
    assert [{k: r[k] for k in keys} for r in one] == [{k: r[k] for k in keys} for r in two]


def test_merge_refuses_missing_files_and_conflicting_rows(tmp_path):
    rows = run_grid(jobs_of(["nope"], ["copy"], [0, 1]), TINY, tmp_path / "a.jsonl",
                    progress=False)  # fmt: skip
    _write(tmp_path / "b.jsonl", [rows[0] | {"seconds": 99.0, "machine": {}}])  # same result
    assert len(merge(tmp_path / "m.jsonl", [tmp_path / "a.jsonl", tmp_path / "b.jsonl"])) == 2
    with pytest.raises(ValueError, match="missing: .*nowhere.jsonl"):
        merge(tmp_path / "m.jsonl", [tmp_path / "a.jsonl", tmp_path / "nowhere.jsonl"])
    other = rows[0] | {"exact": {"4": 1.0, "6": 1.0}}
    _write(tmp_path / "b.jsonl", [other])
    with pytest.raises(ValueError, match="conflicting rows for copy/nope/seed 0 .* in exact"):
        merge(tmp_path / "m.jsonl", [tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    _write(tmp_path / "b.jsonl", [rows[0] | {"seed": 7, "commit": "0" * 40}])
    with pytest.raises(ValueError, match="rows of one grid must share config and commit"):
        merge(tmp_path / "m.jsonl", [tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert load(tmp_path / "m.jsonl") == load(tmp_path / "a.jsonl")  # refusals write nothing


BAD = [  # arguments, what the message says
    (["--shard", "0/2"], "must be i/n with 1 <= i <= n, got '0/2'"),
    (["--shard", "3/2"], "must be i/n with 1 <= i <= n, got '3/2'"),
    (["--shard", "1-2"], "must be i/n (e.g. 1/4), got '1-2'"),
    (["--seeds", "-1"], "must be an int >= 0, got '-1'"),
    (["--seeds", "0", "0"], "seeds must be distinct, got [0, 0]"),
    (["--encodings", "rotary"], "invalid choice: 'rotary'"),
    (["--tasks", "sort"], "invalid choice: 'sort'"),
    (["--jobs", "0"], "must be an int >= 1, got '0'"),
    (["--steps", "0"], "steps must be an int >= 1, got 0"),
    (["--dim", "30"], "dim must be a multiple of 2 * heads=8"),
    (["--lengths", "32", "16"], "lengths must be increasing ints >= 2, got (32, 16)"),
    (["--lengths", "24", "32"], "lengths must start in distribution"),
    (["--train-min", "9", "--train-max", "8", "--lengths", "8"], "train_min must be <= train_max"),
    (["--warmup", "1.5"], "warmup must be a fraction in [0, 1), got 1.5"),
    (["--device", "tpu"], "device must be 'cpu' or 'cuda[:i]', got 'tpu'"),
    (["--encodings", "learned", "--max-len", "100"], "max_len must hold the longest copy"),
    (["--tasks", "indirect", "--content", "32"], "content must be >= 64"),
]


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_run_arguments_are_refused_before_training(argv, message, tmp_path, capsys,
                                                        no_training):  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--out", str(tmp_path / "g.jsonl"), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_unwritable_or_foreign_out_is_refused_before_training(tmp_path, capsys, no_training):
    (tmp_path / "file").write_text("")
    for out, message in [(tmp_path / "file" / "g.jsonl", "out must be writable"),
                         (tmp_path, "out must be a file path")]:  # fmt: skip
        with pytest.raises(SystemExit):
            cli.main(["run", "--out", str(out), "--encodings", "nope", "--tasks", "copy"])
        assert message in capsys.readouterr().err
    row = {"task": "copy", "encoding": "nope", "seed": 0, "config": Config().as_dict()}
    _write(tmp_path / "old.jsonl", [row])  # no stamp: made by another version
    with pytest.raises(SystemExit):
        cli.main(["run", "--out", str(tmp_path / "old.jsonl"), "--encodings", "nope"])
    assert "holds rows of another run" in capsys.readouterr().err
    for argv in (["merge", str(tmp_path / "m"), str(tmp_path / "none.jsonl")],
                 ["table", str(tmp_path / "none.jsonl")],
                 ["rerun", str(tmp_path / "old.jsonl")]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2


def test_quick_writes_to_a_temporary_file_not_into_the_tree(monkeypatch):
    seen = {}

    def fake_run_grid(jobs, config, out, **kw):
        seen.update(jobs=jobs, config=config, out=Path(out))
        return []

    monkeypatch.setattr(cli, "run_grid", fake_run_grid)
    monkeypatch.setattr(cli, "table", lambda *a, **k: "")
    monkeypatch.setattr(cli, "check_out", lambda *a, **k: None)  # the committed file is older
    assert cli.main(["run", "--quick", "--no-progress"]) == 0
    assert seen["out"].is_relative_to(tempfile.gettempdir()) and seen["config"].steps == 300
    assert {j.encoding for j in seen["jobs"]} == {"nope", "rope", "alibi"}
    assert {j.seed for j in seen["jobs"]} == {0} and len(seen["jobs"]) == 3 * 4
    assert cli.main(["run", "--no-progress"]) == 0  # the full grid: five seeds by default
    assert {j.seed for j in seen["jobs"]} == {0, 1, 2, 3, 4} and len(seen["jobs"]) == 200
    assert seen["out"] == Path(cli.DEFAULT_OUT)


def test_without_git_the_stamp_still_names_the_source(monkeypatch):
    import posenc.experiments.provenance as provenance

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    assert provenance.stamp() == {"commit": None, "dirty": None, "source": stamp()["source"]}
