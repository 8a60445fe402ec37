"""Benchmark on a CUDA GPU: the rotation family against its peers and the copy bound, one run.

Run with ``nox -s bench -- gpu`` or ``python benchmarks/bench_gpu.py --out
benchmarks/results/gpu.json``. Without CUDA it says so and exits 0, writing nothing
(``--smoke --out PATH`` runs every section at toy sizes on the CPU, to check the script).

All in bfloat16, medians of ``triton.testing.do_bench``, every ratio from this one run:

* ``rope``: RoPE on q and k per shape and pairing -- posenc (new output, ``out=``, in
  place, autograd forward+backward), HF ``apply_rotary_pos_emb`` eager and under
  ``torch.compile``, Meta's complex formulation (interleaved), liger-kernel's Triton RoPE
  if installed -- over the copy bound: a measured device-to-device copy of q and k's bytes;
* ``precision``: the share of bf16 outputs equal to the correctly rounded float64 result;
* ``launches``: CUDA kernels per RoPE call (profiler);
* ``attention``: :func:`posenc.torch.attend` with RoPE over (SDPA causal + one copy bound),
  PoPE's over RoPE's;
* ``end_to_end``: a GPT-2-small-sized ``TransformerLM`` (12 layers, width 768, 12 heads,
  8 x 1024 tokens), RoPE over NoPE, per AdamW training step and per inference forward.

Each compiled configuration starts from ``torch._dynamo.reset()`` (the recompile limit is
shared within a process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from _common import machine, timeit

import posenc
from posenc.torch import NoPE, PoPE, RotaryEmbedding, TransformerLM, apply_rope, attend
from posenc.torch.kernels import cos_sin

ROPE_SHAPES = [(1, 32, 4096, 128), (4, 32, 4096, 128), (8, 8, 2048, 64)]
ATTN_SHAPES = [(1, 32, 4096, 128), (8, 16, 1024, 64)]
LM = {"vocab": 50257, "dim": 768, "depth": 12, "heads": 12, "batch": 8, "seq": 1024}
SMOKE = {  # toy sizes for --smoke on the CPU
    "rope": [(1, 2, 64, 16)],
    "attn": [(1, 2, 64, 16)],
    "lm": {"vocab": 97, "dim": 32, "depth": 2, "heads": 2, "batch": 2, "seq": 64},
}
DT = torch.bfloat16


def bench(fn):
    """Median ms: ``triton.testing.do_bench`` on CUDA, wall clock on the CPU (smoke)."""
    if torch.cuda.is_available():
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median")
    return timeit(fn, min_time=0.05, min_reps=3, warmup=1)


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def meta_complex(xq, xk, freqs_cis):
    """Meta's Llama reference: pairs as complex numbers (interleaved)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    out = (torch.view_as_real(t * freqs_cis).flatten(-2) for t in (xq_, xk_))
    return tuple(o.type_as(x) for o, x in zip(out, (xq, xk), strict=True))


def hf_cos_sin(s, d, dev):
    """HF Llama's cos and sin ``(1, s, d)`` in bf16 (float32 angles, as HF computes them)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=d, num_attention_heads=1, head_dim=d,
                      max_position_embeddings=s,
                      rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})  # fmt: skip
    x = torch.empty(1, device=dev, dtype=DT)
    return LlamaRotaryEmbedding(cfg).to(dev)(x, torch.arange(s, device=dev)[None])


def rope_rows(shape, dev, bound):
    """Every implementation of RoPE on q and k at ``shape``, both pairings."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, h, s, d = shape
    q, k = (torch.randn(shape, device=dev, dtype=DT) for _ in range(2))
    qi, ki, outs, pos = q.clone(), k.clone(), (torch.empty_like(q), torch.empty_like(k)), range(s)
    cos, sin = hf_cos_sin(s, d, dev)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    impls = {}
    for pairing in ("half", "interleaved"):
        rot = RotaryEmbedding(d, max_len=s, pairing=pairing).to(dev)
        impls |= {
            f"posenc {pairing}": lambda rot=rot: rot.rope(q, k),
            f"posenc {pairing}, out=": lambda rot=rot: rot.rope(q, k, out=outs),
            f"posenc {pairing}, in place": lambda rot=rot: rot.encode_qk(qi, ki, pos, pos,
                                                                         inplace=True),
            f"posenc {pairing}, fwd+bwd": lambda rot=rot: torch.autograd.backward(
                rot(qg, kg), (q, k)),
        }  # fmt: skip
    impls["HF apply_rotary_pos_emb (half) eager"] = lambda: apply_rotary_pos_emb(q, k, cos, sin)
    inv = torch.from_numpy(posenc.rope_frequencies(d)[0]).to(dev)
    fc = torch.view_as_complex(cos_sin(torch.arange(s, device=dev), inv, 1.0, torch.float32))
    impls["Meta complex (interleaved) eager"] = lambda: meta_complex(q, k, fc)
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        impls["liger-kernel (half)"] = lambda: LigerRopeFunction.apply(q, k, cos, sin)
    except ImportError:
        pass
    times = {name: bench(fn) for name, fn in impls.items()}
    for name, fn, args in (
        ("HF apply_rotary_pos_emb (half) compiled", apply_rotary_pos_emb, (q, k, cos, sin)),
        ("Meta complex (interleaved) compiled", meta_complex, (q, k, fc)),
    ):
        c = compiled(fn)
        times[name] = bench(lambda c=c, args=args: c(*args))
    for pairing in ("half", "interleaved"):
        rot = RotaryEmbedding(d, max_len=s, pairing=pairing).to(dev)
        c = compiled(lambda q, k, rot=rot: rot(q, k))
        times[f"posenc {pairing} compiled"] = bench(lambda c=c: c(q, k))
    return [
        {"shape": list(shape), "impl": n, "ms": ms, "ratio_copy_bound": ms / bound}
        for n, ms in times.items()
    ]


def copy_bound(numel, dev):
    """ms of a device-to-device copy of ``numel`` bf16 elements (read + write, like RoPE)."""
    src = torch.randn(numel, device=dev, dtype=DT)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def precision(dev):
    """Share of bf16 RoPE outputs equal to the float64 result rounded once (half pairing)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    s, d = 4096, 128
    x = torch.randn(1, 8, s, d, device=dev, dtype=DT)
    exact = apply_rope(x.double()).to(DT)  # float64 tables and arithmetic, one rounding
    cos, sin = hf_cos_sin(s, d, dev)
    hf, _ = apply_rotary_pos_emb(x, x, cos, sin)
    with torch.no_grad():
        ours = RotaryEmbedding(d, max_len=s).to(dev)(x, x)[0]
    return {
        "posenc_correctly_rounded": (ours == exact).double().mean().item(),
        "hf_correctly_rounded": (hf == exact).double().mean().item(),
    }


def launches(dev):
    """CUDA kernels in one posenc RoPE call on q and k (1, 32, 4096, 128)."""
    if dev != "cuda":
        return {}
    q, k = (torch.randn(1, 32, 4096, 128, device=dev, dtype=DT) for _ in range(2))
    counts = {}
    for pairing in ("half", "interleaved"):
        rot = RotaryEmbedding(128, max_len=4096, pairing=pairing).to(dev)
        rot.rope(q, k)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            rot.rope(q, k)
            torch.cuda.synchronize()
        cuda = torch.autograd.DeviceType.CUDA
        counts[pairing] = sum(e.count for e in prof.key_averages() if e.device_type == cuda)
    return counts


def attention_rows(shape, dev, bound):
    b, h, s, d = shape
    q, k, v = (torch.randn(shape, device=dev, dtype=DT) for _ in range(3))
    rope = RotaryEmbedding(d, max_len=s).to(dev)
    pope = PoPE(d, h).to(dev, DT)
    with torch.no_grad():
        t = {
            "sdpa_causal": bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            "attend_rope": bench(lambda: attend(q, k, v, rope)),
            "attend_pope": bench(lambda: attend(q, k, v, pope)),
        }
    return {
        "shape": list(shape),
        **{f"{n}_ms": ms for n, ms in t.items()},
        "copy_bound_ms": bound,
        "rope_over_floor": t["attend_rope"] / (t["sdpa_causal"] + bound),
        "pope_over_rope": t["attend_pope"] / t["attend_rope"],
    }


def end_to_end(dev, cfg):
    """ms per AdamW training step and per inference forward, RoPE and NoPE."""
    head_dim = cfg["dim"] // cfg["heads"]
    tokens = torch.randint(cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), device=dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    out = {}
    for name, enc in (("NoPE", NoPE()), ("RoPE", RotaryEmbedding(head_dim, max_len=cfg["seq"]))):
        torch.manual_seed(0)
        lm = TransformerLM(cfg["vocab"], cfg["dim"], cfg["depth"], cfg["heads"], encoding=enc)
        lm = lm.to(dev, DT)
        opt = torch.optim.AdamW(lm.parameters(), lr=1e-4)

        def step(lm=lm, opt=opt):
            loss = F.cross_entropy(lm(x).flatten(0, 1).float(), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def infer(lm=lm):
            with torch.no_grad():
                lm(x)

        out[name] = {"train_step_ms": bench(step), "inference_ms": bench(infer)}
    for key in ("train_step_ms", "inference_ms"):
        out[f"rope_over_nope_{key[:-3]}"] = out["RoPE"][key] / out["NoPE"][key]
    return out


def commit():
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True,
                               text=True).stdout.strip()  # fmt: skip
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default benchmarks/results/gpu.json")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU")
    args = parser.parse_args()
    if args.smoke:
        if args.out is None:
            sys.exit("--smoke needs --out (the committed gpu.json holds GPU figures only)")
        dev, shapes, attn, lm = "cpu", SMOKE["rope"], SMOKE["attn"], SMOKE["lm"]
    elif not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured, nothing written")
        return
    else:
        dev, shapes, attn, lm = "cuda", ROPE_SHAPES, ATTN_SHAPES, LM
    out = args.out or "benchmarks/results/gpu.json"
    import triton

    info = {**machine(), "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
            "triton": triton.__version__, "commit": commit()}  # fmt: skip
    print(info)
    rows = []
    for shape in shapes:
        bound = copy_bound(2 * torch.Size(shape).numel(), dev)
        rows += rope_rows(shape, dev, bound)
        print(f"\n{shape} bf16, copy bound {bound:.3f} ms")
        for r in (r for r in rows if r["shape"] == list(shape)):
            print(f"  {r['impl']:<44} {r['ms']:8.3f} ms {r['ratio_copy_bound']:7.2f}x bound")
    result = {"machine": info, "rope": rows, "precision": precision(dev),
              "launches": launches(dev)}  # fmt: skip
    print("\nprecision:", result["precision"], "\nlaunches per call:", result["launches"])
    result["attention"] = []
    for shape in attn:
        bound = copy_bound(2 * torch.Size(shape).numel(), dev)
        result["attention"].append(attention_rows(shape, dev, bound))
        print("attention:", result["attention"][-1])
    result["end_to_end"] = end_to_end(dev, lm)
    print("end to end:", result["end_to_end"])
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
