"""Benchmark: the cost of PoPE's 2*head_dim-wide queries and keys, against RoPE, in one run.

Run with ``nox -s bench -- pope`` or ``python benchmarks/bench_pope.py --out
benchmarks/results/pope.json``. For each shape ``(batch, heads, seq, head_dim)`` in
float32, causal, forward (inference):

* ``encode``: the encoding's query/key hook alone (RoPE rotates in place; PoPE builds new
  tensors twice as wide);
* ``attention``: the hook plus SDPA (:func:`posenc.torch.attend`);
* the bytes of the encoded q and k, and the multiply-adds of ``Q K^T`` (``2 d`` wide for
  PoPE) and of ``P V`` (``d`` wide for both), counted.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from _common import machine, timeit

from posenc.torch import PoPE, RotaryEmbedding, attend

SHAPES = [(1, 32, 2048, 128), (4, 8, 1024, 64)]


def measure(enc, q, k, v):
    """Times of the hook and of attention, bytes of the encoded q and k, multiply-adds."""
    b, h, s, d = q.shape
    pos = range(s)
    qq, kk = q.clone(), k.clone()  # the attention core hands over fresh projections
    encode_ms = timeit(lambda: enc.encode_qk(qq, kk, pos, pos, inplace=True))
    attention_ms = timeit(lambda: attend(q, k, v, enc))
    eq, ek = enc.encode_qk(q, k, pos, pos)
    width = eq.shape[-1]
    return {
        "encode_ms": encode_ms,
        "attention_ms": attention_ms,
        "qk_bytes": (eq.numel() + ek.numel()) * eq.element_size(),
        "attention_macs": b * h * s * s * (width + d) // 2,  # causal halves of QK^T and PV
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/pope.json")
    args = parser.parse_args()
    rows = []
    print(f"machine: {machine()}")
    with torch.no_grad():
        for shape in SHAPES:
            b, h, s, d = shape
            gen = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
            for name, enc in (("RoPE", RotaryEmbedding(d, max_len=s)), ("PoPE", PoPE(d, h))):
                rows.append({"shape": list(shape), "encoding": name, **measure(enc, q, k, v)})
            rope, pope = rows[-2], rows[-1]
            print(f"\n{shape} float32, causal:")
            for r in (rope, pope):
                print(f"  {r['encoding']}: encode {r['encode_ms']:8.1f} ms, attention "
                      f"{r['attention_ms']:8.1f} ms, q+k {r['qk_bytes'] / 2**20:6.0f} MiB, "
                      f"{r['attention_macs'] / 1e9:6.1f} G multiply-adds")  # fmt: skip
            for key in ("attention_ms", "qk_bytes", "attention_macs"):
                print(f"  PoPE / RoPE {key}: {pope[key] / rope[key]:.2f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "results": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
