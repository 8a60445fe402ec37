"""Print the mutation score of the last ``mutmut run`` and list the survivors.

Reads mutmut's per-file ``.meta`` results under ``mutants/``. Score = killed / (killed +
survived), with timeouts counted as killed and mutants no test covers as survivors.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

# mutmut 3 exit codes per mutant
KILLED = {1, 3, -24, 152, 255}  # test failure, or a timeout/kill
SURVIVED = {0}
NO_TESTS = {33}


def main():
    counts, survivors = Counter(), []
    for meta in sorted(Path("mutants").rglob("*.meta")):
        data = json.loads(meta.read_text())
        for name, code in data.get("exit_code_by_key", {}).items():
            if code is None:
                counts["not run"] += 1
            elif code in SURVIVED:
                counts["survived"] += 1
                survivors.append(name)
            elif code in NO_TESTS:
                counts["no tests"] += 1
                survivors.append(name + "  (no test covers it)")
            else:
                counts["killed"] += 1
    total = counts["killed"] + counts["survived"] + counts["no tests"]
    score = counts["killed"] / total if total else float("nan")
    print(f"mutants: {dict(counts)}; score {score:.1%} ({counts['killed']}/{total})")
    for name in survivors:
        print("  survived:", name)


if __name__ == "__main__":
    main()
