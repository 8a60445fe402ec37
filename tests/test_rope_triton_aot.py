"""The Triton RoPE kernel compiled ahead of time for A100 (sm_80) and H100 (sm_90), no GPU.

``tools/triton_aot.py`` compiles every launcher variant (pairings, dtypes, the backward's
conjugate, head sizes, partial rotary, in place, per-token positions indexed in the
kernel, a decode step, GQA) with Triton's bundled ``ptxas``, in a subprocess (its
stand-in driver must not outlive it), and reports what the compiled code does:

* it compiles, without spills (no stack, no local memory);
* prefill rows are read and written with 16-byte global accesses;
* the float32 results are rounded once, to nearest (no ``cvt.rz``/``rm``/``rp``), and
  without fused multiply-adds, so the GPU computes what the interpreter computes;
* the bytes its programs issue are at most 1.25x the copy bound (q and k read and written
  once) at (1, 32, 4096, 128) and (4, 32, 4096, 128) in bfloat16: the heads of a program
  share one read of the ``[cos, sin]`` rows.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")
ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGETS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def compiled():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "triton_aot.py")],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "tools"))
    interpret = os.environ.get("TRITON_INTERPRET")
    import triton_aot  # pops TRITON_INTERPRET (it compiles for the GPU): put it back

    if interpret is not None:
        os.environ["TRITON_INTERPRET"] = interpret

    rows = json.loads(run.stdout)
    return {(r["target"], r["variant"]): r for r in rows}, triton_aot.VARIANTS


def test_every_variant_compiles_for_both_targets_without_spills(compiled):
    rows, variants = compiled
    assert set(rows) == {(t, v) for t in TARGETS for v in variants}
    for key, r in rows.items():
        assert r["stack"] == 0 and r["local"] == 0, (key, r)  # no register spills
        assert 0 < r["reg"] <= 168, (key, r)  # at least 3 warps of 128 threads per SM side


def test_prefill_rows_move_in_16_byte_accesses(compiled):
    rows, variants = compiled
    for (target, name), r in rows.items():
        if "decode" in name:
            continue
        loads, stores = dict(r["loads"]), dict(r["stores"])
        if variants[name][5] == "indexed":
            loads.pop("8")  # the int64 positions: one per row
        assert set(loads) == {"16"} and set(stores) == {"16"}, (target, name, r)


def test_one_rounding_to_nearest_and_the_interpreters_float32_math(compiled):
    rows, variants = compiled
    for key, r in rows.items():
        assert not [c for c in r["conversions"] if c.startswith(("cvt.rz", "cvt.rm", "cvt.rp"))]
        assert r["fma"] == 0, key  # x1 cos - x2 sin: two products and a sum, unfused
        dtype = variants[key[1]][2]
        if dtype == "float16":
            assert any(c.startswith("cvt.rn.f16") for c in r["conversions"]), key


@pytest.mark.parametrize("name", ["bf16 half prefill", "bf16 interleaved prefill"])
def test_bytes_issued_at_most_1_25x_the_copy_bound_at_the_large_shapes(compiled, name):
    rows, variants = compiled
    assert variants[name][0][1:] == (32, 4096, 128) and variants[name][2] == "bfloat16"
    r = rows[("sm_90", name)]
    assert r["bytes_issued"] <= 1.25 * r["copy_bound"], r["bytes_issued"] / r["copy_bound"]
