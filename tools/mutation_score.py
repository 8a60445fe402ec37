"""Print the mutation score of the last ``mutmut run``, per module, and list the survivors.

Reads mutmut's per-file ``.meta`` results under ``mutants/``. Score = killed / (killed +
survived + not covered - equivalent), with timeouts counted as killed. Survivors judged
equivalent (they cannot change any result) are listed with their reason in
``tools/mutation_equivalent.json`` (``{"mutant name": "reason"}``) and left out of the score.

``--json PATH`` also writes, per module, the counts, the equivalent survivors used, the
other survivors' names (so a later session can re-run just those: ``mutmut run NAME ...``)
and the git commit of the code that was run to ``PATH`` (the committed record is
``benchmarks/results/mutation.json``). A module of which this run executed no mutant keeps
its entry from that file, so a run module by module accumulates one record.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

# mutmut 3 exit codes per mutant
TIMEOUT = {-24, 152}  # killed for running too long: counted as killed
KILLED = {1, 3, 255} | TIMEOUT  # a test failed
SURVIVED = {0}
NO_TESTS = {33}
EQUIVALENT = Path(__file__).with_name("mutation_equivalent.json")


def module_of(name: str) -> str:
    """``posenc.torch.cache.kv.x_KVCache__begin__mutmut_3`` -> ``posenc.torch.cache.kv``."""
    return name.split(".x_")[0] if ".x_" in name else name.rsplit(".", 1)[0]


def collect(root=Path("mutants")):
    """Per-module Counter of outcomes and the list of (name, outcome) survivors."""
    counts, survivors = defaultdict(Counter), []
    for meta in sorted(root.rglob("*.meta")):
        data = json.loads(meta.read_text())
        for name, code in data.get("exit_code_by_key", {}).items():
            c = counts[module_of(name)]
            if code is None:
                c["not run"] += 1
            elif code in SURVIVED:
                c["survived"] += 1
                survivors.append((name, "survived"))
            elif code in NO_TESTS:
                c["not covered"] += 1
                survivors.append((name, "not covered"))
            else:
                c["killed"] += 1
                c["timeouts"] += code in TIMEOUT
    return counts, survivors


def score(c: Counter, equivalent: int) -> float:
    total = c["killed"] + c["survived"] + c["not covered"] - equivalent
    return c["killed"] / total if total > 0 else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write per-module results here")
    args = parser.parse_args(argv)
    equivalent = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    counts, survivors = collect()
    record = {}
    for module, c in sorted(counts.items()):
        eq = {n: r for n, r in equivalent.items() if module_of(n) == module}
        eq = {n: r for n, r in eq.items() if (n, "survived") in survivors
              or (n, "not covered") in survivors}  # fmt: skip
        s = score(c, len(eq))
        rounded = None if math.isnan(s) else round(s, 4)  # JSON has no NaN: a module not run
        print(f"{module:<40} {dict(c)}; equivalent {len(eq)}; score {s:.1%}")
        left = sorted(n for n, _ in survivors if module_of(n) == module and n not in eq)
        record[module] = {**{k: c[k] for k in ("killed", "survived", "not covered", "timeouts",
                                               "not run")},
                          "equivalent": eq, "survivors": left, "score": rounded}  # fmt: skip
    for name, outcome in survivors:
        if name not in equivalent:
            print(f"  {outcome}: {name}")
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else {}
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        head = commit.stdout.strip() or None
        modules = old.get("modules", {})
        for module, entry in record.items():
            ran = entry["killed"] + entry["survived"] + entry["not covered"]
            if ran or module not in modules:  # a module this run did not reach keeps its entry
                modules[module] = {"commit": head, **entry}
        args.json.write_text(json.dumps({"commit": head, "modules": dict(sorted(modules.items()))},
                                        indent=1) + "\n")  # fmt: skip
        print(f"{len(record)} modules -> {args.json}")


if __name__ == "__main__":
    main()
