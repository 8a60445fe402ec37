"""The model atlas: every position scheme of the pinned transformers against posenc.

For every model type whose modeling file has a rotary embedding class (plus the ALiBi and
T5-bucket models), HF's own code runs on the class-default config: its rotary class gives
cos/sin at positions 0..S-1, its ``apply_rotary_pos_emb`` rotates random q and k (one
full forward, then one cached decode step at position S-1 alone), and posenc, built from
the same config by ``posenc.hf``, rotates the same q and k. Each row records the model
type, the scheme, the posenc call, the largest difference, a status and, where posenc
does not reproduce the model, why. M-RoPE classes are also run on image and video
positions (tools/atlas_e2e_mrope.py). Model types with a per-layer scheme, and a sample of
others, are checked end to end (tools/atlas_e2e.py): per layer, HF's own attention on a
tiny float64 model against posenc's ``attend``, in both config layouts; such a row is
exact only if every layer matches.

    python tools/atlas.py [--only llama gemma3 ...] [--no-e2e] [--out benchmarks/results/atlas.json]

``nox -s atlas`` runs it into benchmarks/results/atlas.json; tests/test_atlas.py runs one
model per scheme. transformers is imported here only, never by posenc or the docs build.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
S = 48  # positions 0 .. S - 1; the decode step is the last one
EPS32 = 2.0**-24


def tolerance(max_position, scale=1.0):
    """float32's: HF forms angles in float32, so errors grow with the largest position."""
    return 64 * EPS32 * max(1.0, float(max_position)) * scale + 1e-6


def rotary_classes(module):
    """The rotary embedding classes a modeling module defines itself."""
    return [
        obj for name, obj in vars(module).items()
        if inspect.isclass(obj) and "Rotary" in name and obj.__module__ == module.__name__
        and issubclass(obj, torch.nn.Module)
    ]  # fmt: skip


def config_class_of(cls, module):
    """The config class a rotary class's ``__init__`` is annotated with (or the module's)."""
    sig = inspect.signature(cls.__init__)
    ann = sig.parameters.get("config")
    if ann is not None and inspect.isclass(ann.annotation):
        return ann.annotation
    if ann is not None and isinstance(ann.annotation, str):
        found = getattr(module, ann.annotation.strip("'\""), None)
        if inspect.isclass(found):
            return found
    return None


def modeling_modules():
    """``(directory, module)`` for every modeling file with a rotary class or apply function."""
    import transformers.models as models

    for info in pkgutil.iter_modules(models.__path__):
        path = Path(models.__path__[0]) / info.name / f"modeling_{info.name}.py"
        if not path.exists():
            continue
        text = path.read_text()
        if "Rotary" not in text and "apply_rotary" not in text:
            continue
        try:
            module = importlib.import_module(
                f"transformers.models.{info.name}.modeling_{info.name}"
            )
        except Exception as err:  # an optional dependency is missing
            yield info.name, err
            continue
        yield info.name, module


def hf_cos_sin(rot, config, positions):
    """cos, sin of HF's rotary class at ``positions`` (1-D), float32."""
    x = torch.zeros(1, len(positions), 8)
    pos = torch.tensor(positions)[None]
    try:
        out = rot(x, pos)
    except Exception:
        out = rot(x, pos.expand(3, 1, -1))  # M-RoPE: (3, batch, seq), text positions
    return out if torch.is_tensor(out) else tuple(out)  # (cos, sin), or complex freqs_cis


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="+", help="model directories to run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "atlas.json"))
    parser.add_argument(
        "--no-e2e",
        action="store_true",
        help="skip the end-to-end attention check (rotary classes only)",
    )
    args = parser.parse_args(argv)
    import transformers
    from atlas_cases import run_case  # noqa: E402  (this directory)
    from atlas_e2e import check  # noqa: E402

    transformers.logging.set_verbosity_error()

    rows, start = [], time.perf_counter()
    for name, module in modeling_modules():
        if args.only and name not in args.only:
            continue
        if isinstance(module, Exception):
            rows.append({"directory": name, "status": "hf-fails",
                         "reason": f"the modeling module does not import: {module}"})  # fmt: skip
            continue
        for row in run_case(name, module):
            config = row.pop("_config", None)
            if not args.no_e2e:
                row = check(row, module, config)
            rows.append(row)
            print(f"{row['model_type']:32s} {row['status']:10s} {row.get('error', ''):>10} "
                  f"{row.get('reason', '')[:90]}", flush=True)  # fmt: skip
    from atlas_bias import alibi_rows, t5_rows

    bias = alibi_rows() + t5_rows()
    for row in [r for r in bias if not args.only or r["directory"] in args.only]:
        rows.append(row)
        print(f"{row['model_type']:32s} {row['status']:10s} {row.get('error', ''):>10} "
              f"{row.get('reason', '')[:90]}", flush=True)  # fmt: skip
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    result = {
        "transformers": transformers.__version__, "torch": torch.__version__, "commit": commit,
        "seconds": round(time.perf_counter() - start, 1), "rows": rows,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(counts, f"{result['seconds']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        raise SystemExit(main())
    except Exception:
        traceback.print_exc()
        raise
