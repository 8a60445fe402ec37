"""A seeded random sample of the mutants of changed code, and its mutation score.

A full ``mutmut run`` of every function changed since the last complete record takes days on
2 cores; a uniform random sample, stratified by module, estimates the same score with a
stated uncertainty (mutant sampling: Wong and Mathur 1995; Zhang et al., ICSE 2013).

``draw``: the frame is, per module, the mutants of the functions whose source differs from
the commit of the module's entry in the record (``benchmarks/results/mutation.json``), or all
of the module's mutants where that entry is partial (``not run`` > 0) or missing; ``--fraction``
of each module's frame (at least ``--min``, or all of a smaller frame) is drawn with
``random.Random(--seed)``. Mutant names are read from mutmut's ``mutants/**/*.meta`` (run
``mutmut run`` once, or any run, to generate them). The sample is written to ``--out``.

``score``: reads the sample and mutmut's results for its names (``mutmut run NAME ...``),
counts them as ``tools/mutation_score.py`` does (equivalent survivors, with their reasons in
``tools/mutation_equivalent.json``, leave the score) and writes per-module and overall scores
with a Wilson 95 % interval into the same file. A mutant mutmut did not run, or whose survival
predates the test written for it, counts as killed where the sample's ``killed_by_test`` names
a test seen failing with it (run by hand from ``mutants/``: ``MUTANT_UNDER_TEST=<name>
PYTHONPATH=src pytest <test>``) -- until a ``mutmut run <name>`` gives mutmut's own verdict.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import subprocess
from pathlib import Path

from mutation_score import EQUIVALENT, NO_TESTS, SURVIVED, module_of


def functions(source: str | None) -> dict[str, str]:
    """mutmut's mangled name of each top-level function and method -> its AST dump."""
    out = {}
    for node in ast.parse(source).body if source else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[f"x_{node.name}"] = ast.dump(node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"x\u01c1{node.name}\u01c1{sub.name}"] = ast.dump(sub)
    return out


def source_at(commit: str, path: str) -> str | None:
    r = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def results(root=Path("mutants")) -> dict[str, int | None]:
    out = {}
    for meta in root.rglob("*.meta"):
        out |= json.loads(meta.read_text()).get("exit_code_by_key", {})
    return out


def frame(record: dict) -> dict[str, list[str]]:
    names, out = results(), {}
    for path in sorted(Path("src/posenc").rglob("*.py")):
        module = ".".join(path.with_suffix("").parts[1:]).removesuffix(".__init__")
        mine = sorted(n for n in names if module_of(n) == module)
        entry = record.get(module)
        if entry and not entry["not run"]:
            old = functions(source_at(entry["commit"], str(path)))
            new = functions(path.read_text())
            changed = {f"{module}.{f}" for f in new if old.get(f) != new[f]}
            mine = [n for n in mine if n.split("__mutmut_")[0] in changed]
        if mine:
            out[module] = mine
    return out


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    if n == 0:
        return None
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(mid - half, 4), round(mid + half, 4)]


def score(sample: dict) -> dict:
    codes, equivalent = results(), json.loads(EQUIVALENT.read_text())
    by_test = sample.get("killed_by_test", {})
    modules, total = {}, {"killed": 0, "scored": 0}
    for module, entry in sample["modules"].items():
        c = {"killed": 0, "survived": [], "equivalent": [], "not run": 0}
        for name in entry["sample"]:
            code = codes.get(name)
            if code in SURVIVED | {None} and name in by_test:
                c["killed"] += 1
            elif code is None:  # (an equivalent judged unrun may name another mutant of old)
                c["not run"] += 1
            elif code in SURVIVED | NO_TESTS:
                c["equivalent" if name in equivalent else "survived"].append(name)
            else:  # a failed test, a timeout or a crash (-11): as mutation_score.py counts
                c["killed"] += 1
        scored = c["killed"] + len(c["survived"])
        total["killed"] += c["killed"]
        total["scored"] += scored
        rate = round(c["killed"] / scored, 4) if scored else None
        modules[module] = {**entry, **c, "score": rate, "interval95": wilson(c["killed"], scored)}
    k, n = total["killed"], total["scored"]
    return {**sample, "modules": modules, "killed": k, "scored": n,
            "score": round(k / n, 4) if n else None, "interval95": wilson(k, n)}  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["draw", "score"])
    parser.add_argument("--record", type=Path, default=Path("benchmarks/results/mutation.json"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mutation_sample.json"))
    parser.add_argument("--fraction", type=float, default=0.12)
    parser.add_argument("--min", type=int, default=12)
    parser.add_argument("--seed", type=int, default=40)
    args = parser.parse_args(argv)
    if args.step == "draw":
        rng, drawn = random.Random(args.seed), {}
        for module, names in sorted(frame(json.loads(args.record.read_text())["modules"]).items()):
            n = (
                len(names)
                if len(names) <= args.min
                else max(args.min, math.ceil(args.fraction * len(names)))
            )
            drawn[module] = {"frame": len(names), "sample": sorted(rng.sample(names, n))}
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        out = {"drawn_at": head, "record": str(args.record), "fraction": args.fraction,
               "min": args.min, "seed": args.seed, "modules": drawn}  # fmt: skip
    else:
        out = score(json.loads(args.out.read_text()))
        for module, e in out["modules"].items():
            print(
                f"{module:45} {e['killed']:3} killed {len(e['survived']):2} survived "
                f"{len(e['equivalent']):2} equivalent {e['not run']:3} not run  {e['score']}"
            )
        print(f"overall {out['killed']}/{out['scored']} = {out['score']}, 95 % {out['interval95']}")
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
