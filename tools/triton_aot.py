"""Compile posenc's Triton RoPE kernel for NVIDIA GPUs on a machine without one, and read it.

Triton's driver is replaced by a stand-in that reports the target (sm_80: A100, sm_90:
H100) and never launches, so the launcher specialises and compiles every variant exactly
as on a GPU (Triton's bundled ``ptxas``). For each variant this prints, as JSON: the
registers, stack and local memory per thread (``cuobjdump -res-usage``: spills show as
stack or local bytes), the global loads and stores by width, the float conversions, and
the bytes the programs issue against the copy bound (``rope_triton.plan``).

``python tools/triton_aot.py [--targets 80 90]``; ``tests/test_rope_triton_aot.py`` runs
it in a subprocess (the stand-in driver must not outlive it) and checks the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402

from posenc.torch import RotaryEmbedding  # noqa: E402
from posenc.torch.kernels import rope_triton  # noqa: E402

#: name -> (q shape, k shape, dtype, pairing, rotary_dim, positions, where, conjugate)
#: positions: "range" (the table's rows, sliced) or "indexed" (per-token, in the kernel)
VARIANTS = {
    "bf16 half prefill": ((1, 32, 4096, 128), (1, 32, 4096, 128), "bfloat16", "half", None,
                          "range", "new", False),
    "bf16 interleaved prefill": ((4, 32, 4096, 128), (4, 32, 4096, 128), "bfloat16",
                                 "interleaved", None, "range", "new", False),
    "bf16 half backward": ((1, 32, 4096, 128), (1, 32, 4096, 128), "bfloat16", "half", None,
                           "range", "new", True),
    "f16 half prefill": ((1, 32, 1024, 128), (1, 32, 1024, 128), "float16", "half", None,
                         "range", "new", False),
    "f32 interleaved prefill": ((1, 32, 1024, 128), (1, 32, 1024, 128), "float32",
                                "interleaved", None, "range", "new", False),
    "bf16 GQA head 64": ((8, 32, 2048, 64), (8, 8, 2048, 64), "bfloat16", "half", None,
                         "range", "new", False),
    "bf16 partial rotary": ((1, 32, 1024, 128), (1, 8, 1024, 128), "bfloat16", "half", 64,
                            "range", "new", False),
    "bf16 in place per-token": ((2, 32, 1024, 128), (2, 8, 1024, 128), "bfloat16",
                                "interleaved", None, "indexed", "inplace", False),
    "bf16 decode per-token": ((64, 32, 1, 128), (64, 8, 1, 128), "bfloat16", "half", None,
                              "indexed", "new", False),
}  # fmt: skip


class _Target:
    """Triton's driver as far as compiling needs it: a target, device 0, nothing launched."""

    def __init__(self, capability):
        self.capability = capability

    def get_current_target(self):
        return GPUTarget("cuda", self.capability, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=0):
        return divmod(self.capability, 10)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True

    def map_python_to_cpp_type(self, ty):
        from triton.backends.nvidia.driver import ty_to_cpp

        return ty_to_cpp(ty)


def _pairs(spec):
    """The ``(x, cs, out)`` pairs the launcher receives for a variant (CPU tensors)."""
    q_shape, k_shape, dtype, pairing, rotary, positions, where, _ = spec
    dtype = getattr(torch, dtype)
    d, s = q_shape[-1], q_shape[2]
    rope = RotaryEmbedding(d, rotary_dim=rotary, pairing=pairing, max_len=max(s, 16))
    pairs = []
    for shape in (q_shape, k_shape):
        x = torch.empty(shape, dtype=dtype)
        if positions == "indexed":
            cs = (rope.cos_sin, torch.zeros(shape[0], shape[2], dtype=torch.long))
        else:
            cs = rope.table(range(s))[:, None]  # (1, 1, s, r // 2, 2)
        pairs.append((x, cs, x if where == "inplace" else torch.empty_like(x)))
    return pairs


def _compiled(spec):
    """The launcher's kernel for ``spec``, compiled for the stand-in target, not launched."""
    kernel, got = rope_triton._rope_fwd, {}

    class _Capture:
        def __getitem__(self, grid):
            def run(*args, **kw):
                got["kernel"] = kernel.run(*args, grid=grid, warmup=True, **kw)

            return run

    rope_triton._rope_fwd = _Capture()
    try:
        rope_triton.launch(_pairs(spec), spec[3] == "interleaved", conjugate=spec[7])
    finally:
        rope_triton._rope_fwd = kernel
    return got["kernel"]


def _resources(cubin):
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", f.name],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    return {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out)}


def _widths(ptx, op):
    """Global ``op`` (ld/st) instructions by the bytes each moves per thread: {16: n, ...}."""
    counts = {}
    for inst in re.findall(rf"\b{op}\.global(?:\.[a-z0-9_]+)+", ptx):
        parts = inst.split(".")
        vector = next((int(p[1:]) for p in parts if re.fullmatch(r"v[248]", p)), 1)
        bits = int(re.search(r"\d+$", parts[-1]).group())
        counts[vector * bits // 8] = counts.get(vector * bits // 8, 0) + 1
    return dict(sorted(counts.items()))


def report(capability, name):
    """Everything measured for one variant on one target."""
    spec = VARIANTS[name]
    driver.set_active(_Target(capability))
    rope_triton._rope_fwd.device_caches.clear()
    try:
        kernel = _compiled(spec)
    finally:
        rope_triton._rope_fwd.device_caches.clear()
    ptx = kernel.asm["ptx"]
    plan = rope_triton.plan(_pairs(spec))
    return {
        "target": f"sm_{capability}",
        "variant": name,
        **_resources(kernel.asm["cubin"]),
        "loads": _widths(ptx, "ld"),
        "stores": _widths(ptx, "st"),
        "conversions": sorted(set(re.findall(r"\bcvt\.[\w.]+", ptx))),
        "fma": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
        "bytes_issued": plan.bytes_issued,
        "copy_bound": plan.copy_bound,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", type=int, default=[80, 90])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = parser.parse_args(argv)
    rows = [report(t, v) for t in args.targets for v in args.variants]
    json.dump(rows, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
