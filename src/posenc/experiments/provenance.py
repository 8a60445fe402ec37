"""Where a result comes from: the code (git commit, dirty flag, source hash) and the machine.

Every row of a results file carries a *stamp*: ``commit`` (the git commit of the checkout
``posenc`` is imported from, ``None`` outside a git checkout), ``dirty`` (``True`` when
``src/`` differs from that commit: modified or untracked files; the results files
elsewhere do not count) and ``source`` (SHA-256 of every ``.py`` file of the imported
package, so that two dirty trees are told apart). Rows agree on their code when the three
agree; :func:`mismatch` names what differs.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path

__all__ = ["STAMP", "stamp", "machine", "mismatch"]

STAMP = ("commit", "dirty", "source")  # the row keys that identify the code
PACKAGE = Path(__file__).resolve().parents[1]  # .../src/posenc


def _git(*args):
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE), *args], capture_output=True, text=True)
    except OSError:  # no git on this machine
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_hash(package=PACKAGE) -> str:
    """SHA-256 of the package's Python files (relative path and bytes, in sorted order).

    Parameters
    ----------
    package : Path
        The package directory (default: the imported ``posenc``).

    Returns
    -------
    str
        64 hex digits.

    Examples
    --------
    >>> len(source_hash())
    64
    """
    digest = hashlib.sha256()
    for path in sorted(Path(package).rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def stamp() -> dict:
    """The code's identity: ``{"commit": str | None, "dirty": bool | None, "source": str}``.

    ``commit`` and ``dirty`` are ``None`` when ``posenc`` is not imported from the
    ``src/posenc`` of a git checkout (an installed wheel).

    Examples
    --------
    >>> sorted(stamp()) == sorted(STAMP)
    True
    """
    top = _git("rev-parse", "--show-toplevel")
    commit = dirty = None
    if top is not None and Path(top, "src", "posenc").resolve() == PACKAGE:
        commit = _git("rev-parse", "HEAD")
        status = _git("status", "--porcelain", "--", ":/src")  # from the top, not the cwd
        dirty = None if status is None else bool(status)
    return {"commit": commit, "dirty": dirty, "source": source_hash()}


def machine(command) -> dict:
    """Machine, versions and command of a run, stored with every row (not compared)."""
    import torch

    import posenc

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return {
        "machine": {
            "cpu": cpu,
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "blas": _blas(),
        },  # fmt: skip
        "versions": {
            "posenc": posenc.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },  # fmt: skip
        "command": command,
    }


def _blas() -> str | None:
    """The BLAS torch was built with (``BLAS_INFO`` of ``torch.__config__.show()``)."""
    import re

    import torch

    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return found.group(1) if found else None


def machine_notes(row) -> list[str]:
    """Why a rerun here may differ from ``row`` although the code is the same: another CPU
    capability (float sums differ between AVX2 and AVX-512 kernels, and training amplifies
    them), another BLAS, torch or CPU.

    Examples
    --------
    >>> machine_notes({"machine": {}})  # an older row that records no capability
    ['the row records no CPU capability: a rerun on another CPU kind may differ']
    """
    import torch

    here = machine(None)
    row_machine, notes = row.get("machine") or {}, []
    if row_machine.get("capability") is None:
        notes.append("the row records no CPU capability: a rerun on another CPU kind may differ")
    elif row_machine["capability"] != here["machine"]["capability"]:
        notes.append(
            f"the row ran with {row_machine['capability']} kernels, this machine runs "
            f"{here['machine']['capability']}: float sums differ with the SIMD width and "
            "training amplifies them (the likely cause of any difference)"
        )
    for key in ("blas", "cpu"):
        if row_machine.get(key) not in (None, here["machine"][key]):
            notes.append(f"{key}: {row_machine[key]} in the row, {here['machine'][key]} here")
    torch_row = (row.get("versions") or {}).get("torch")
    if torch_row not in (None, torch.__version__):
        notes.append(f"torch: {torch_row} in the row, {torch.__version__} here")
    return notes


def mismatch(row, expected) -> list[str]:
    """What of ``expected`` (config and stamp keys) a row does not match, in words.

    Parameters
    ----------
    row : dict
        A result row.
    expected : dict
        ``{"config": dict, "commit": ..., "dirty": ..., "source": ...}`` (any subset).

    Returns
    -------
    list of str
        One entry per differing key (config fields one by one); empty when all agree.

    Examples
    --------
    >>> mismatch({"config": {"steps": 300}, "commit": "a"}, {"config": {"steps": 2000},
    ...                                                      "commit": "a"})
    ['config.steps: 300 in the row, 2000 here']
    >>> mismatch({"commit": None}, {"commit": "a"})
    ['commit: None in the row, a here']
    """
    out = []
    for key, want in expected.items():
        got = row.get(key)
        if key == "config" and isinstance(got, dict):
            for field in sorted(set(got) | set(want)):
                if got.get(field) != want.get(field):
                    out.append(
                        f"config.{field}: {got.get(field)} in the row, {want.get(field)} here"
                    )
        elif got != want:
            out.append(f"{key}: {got} in the row, {want} here")
    return out
