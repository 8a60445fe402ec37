"""Benchmark: causal attention with ALiBi, posenc's two backends against peers, in one run.

Run with ``nox -s bench -- alibi`` or ``python benchmarks/bench_alibi.py --out
benchmarks/results/alibi.json``. Forward only (inference), ``(batch, heads, seq, head_dim)``
inputs, causal. Every time is the median of repeated calls and includes building the
bias/mask, as a model step does; ratios are to the floor, SDPA's own causal kernel with no
bias at all, measured in the same run:

* ``posenc attend, backend="sdpa"``: one float mask (relative ALiBi bias + causal), then SDPA;
* ``posenc attend, backend="flex"``: FlexAttention with ALiBi as a ``score_mod`` and a
  causal block mask (compiled once; its compile time is reported separately);
* ``HF Bloom eager attention``: the operations of ``BloomAttention``'s eager path --
  ``build_alibi_tensor`` (the ``slope * j`` form, in the input dtype), ``baddbmm``, the
  causal fill, a float32 softmax and the value ``bmm``;
* ``x-transformers ALiBi + SDPA``: ``AlibiPositionalBias`` (its bias is cached after the
  first call) merged with the causal mask, then SDPA;
* ``FlexAttention causal, no bias``: the compiled FlexAttention kernel with the causal
  block mask only (float32, as posenc runs it on the CPU): what the kernel costs before
  any ``score_mod``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from _common import machine, timeit
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from posenc.torch import ALiBi, attend

SHAPES = [(1, 32, 2048, 128), (4, 8, 1024, 64)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def bloom_eager(q, k, v, heads):
    """BloomAttention's eager computation (transformers' modeling_bloom), written out."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    b, h, s, d = q.shape
    ones = torch.ones(b, s, dtype=torch.long)
    alibi = build_alibi_tensor(ones, heads, q.dtype)  # (b * h, 1, s): slope * j
    scores = torch.baddbmm(
        alibi, q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2), alpha=d**-0.5
    )  # (b * h, s, s)
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(causal, torch.finfo(q.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(probs, v.reshape(b * h, s, d)).view(b, h, s, d)


def build(shape, dtype):
    b, h, s, d = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).to(dtype) for _ in range(3))
    alibi = ALiBi(h)
    flex = torch.compile(flex_attention, dynamic=False)
    block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, s, s, device="cpu")
    impls = {
        "SDPA causal, no bias (floor)": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True
        ),
        "FlexAttention causal, no bias": lambda: flex(
            q.float(), k.float(), v.float(), block_mask=block_mask
        ),
        'posenc attend, backend="sdpa"': lambda: attend(q, k, v, alibi),
        'posenc attend, backend="flex"': lambda: attend(q, k, v, alibi, backend="flex"),
        "HF Bloom eager attention": lambda: bloom_eager(q, k, v, h),
    }
    try:
        from x_transformers.x_transformers import AlibiPositionalBias
    except ImportError:
        print("x-transformers not installed: its row is skipped")
    else:
        xt = AlibiPositionalBias(heads=h, total_heads=h)
        causal = torch.ones(s, s, dtype=torch.bool).tril()

        def x_transformers():
            bias = xt(s, s).to(dtype)  # (h, s, s), cached by the module
            mask = bias.masked_fill(~causal, float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        impls["x-transformers ALiBi + SDPA"] = x_transformers
    return impls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/alibi.json")
    args = parser.parse_args()
    rows, compile_s = [], {}
    print(f"machine: {machine()}")
    with torch.no_grad():
        for shape in SHAPES:
            for dname, dtype in DTYPES.items():
                impls = build(shape, dtype)
                t = time.perf_counter()
                impls['posenc attend, backend="flex"']()  # first call compiles
                impls["FlexAttention causal, no bias"]()
                compile_s[f"{shape} {dname}"] = time.perf_counter() - t
                times = {
                    name: timeit(fn, min_time=1.0, min_reps=5, warmup=2)
                    for name, fn in impls.items()
                }
                floor = times["SDPA causal, no bias (floor)"]
                print(f"\n{shape} {dname}: floor {floor:.1f} ms; flex first call (compile) "
                      f"{compile_s[f'{shape} {dname}']:.1f} s")  # fmt: skip
                for name, ms in times.items():
                    rows.append({"shape": list(shape), "dtype": dname, "impl": name, "ms": ms,
                                 "ratio_floor": ms / floor})  # fmt: skip
                    print(f"  {name:<32} {ms:9.1f} ms {ms / floor:7.2f}x floor")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "results": rows, "flex_compile_s": compile_s}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
