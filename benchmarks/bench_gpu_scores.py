"""Benchmark on a CUDA GPU: score biases through FlexAttention, and compiled decoding, one run.

Run with ``python benchmarks/bench_gpu_scores.py --out benchmarks/results/gpu_scores.json``
(issue 16; the RoPE half of the GPU benchmark is ``bench_gpu.py``). Without CUDA it says so
and exits 0, writing nothing (``--smoke --out PATH`` runs every section at toy sizes on the
CPU, to check the script; its numbers mean nothing).

All in bfloat16, medians of ``triton.testing.do_bench`` (decoding: the median wall time
of whole greedy loops), every ratio from this one run:

* ``attention``: causal attention with ALiBi, T5, KERPLE and FIRE at each shape --
  posenc ``attend`` with ``backend="sdpa"`` (one float mask per call), ``"flex"`` and
  ``"auto"`` (the default), forward and forward + backward, over a hand-written
  ``torch.compile(flex_attention)`` with an ALiBi ``score_mod`` and a causal block mask
  built once (the issue's reference), and over SDPA's own causal kernel (the floor);
* ``end_to_end``: a GPT-2-small-sized ``TransformerLM`` (12 layers, width 768, 12 heads,
  8 x 1024 tokens) with ALiBi over the same model with NoPE, default backend, per AdamW
  training step and per inference forward;
* ``decode``: greedy tokens/s at batch 1 and 16 (a 128-token prompt, 128 new tokens) --
  posenc eager with the growing ``KVCache`` and with ``StaticKVCache``, and
  ``torch.compile(lm, fullgraph=True)`` over the static cache (default mode and
  ``"reduce-overhead"``, i.e. CUDA graphs), with the number of graphs dynamo compiled;
  beside HF ``LlamaForCausalLM.generate`` of the same size, dynamic cache and
  ``cache_implementation="static"``.

Each compiled configuration starts from ``torch._dynamo.reset()`` (the recompile limit is
shared within a process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from _common import machine, timeit
from torch._dynamo.utils import counters

from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    NoPE,
    RotaryEmbedding,
    T5RelativeBias,
    TransformerLM,
    attend,
)

ATTN_SHAPES = [(1, 32, 4096, 128), (8, 16, 1024, 64)]
LM = {"vocab": 50257, "dim": 768, "depth": 12, "heads": 12, "batch": 8, "seq": 1024}
DECODE = {"batches": [1, 16], "prompt": 128, "new": 128}
SMOKE = {
    "attn": [(1, 2, 64, 16)],
    "lm": {"vocab": 97, "dim": 32, "depth": 2, "heads": 2, "batch": 2, "seq": 64},
    "decode": {"batches": [1, 2], "prompt": 8, "new": 8},
}
DT = torch.bfloat16
ENCODINGS = {"ALiBi": ALiBi, "T5": T5RelativeBias, "KERPLE": KERPLE, "FIRE": FIRE}


def bench(fn):
    """Median ms: ``triton.testing.do_bench`` on CUDA, wall clock on the CPU (smoke)."""
    if torch.cuda.is_available():
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median")
    return timeit(fn, min_time=0.05, min_reps=3, warmup=1)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hand_written_alibi(shape, dev):
    """The issue's reference: compiled ``flex_attention``, ALiBi ``score_mod``, causal mask
    built once. Returns ``fwd(q, k, v)``."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, h, s, d = shape
    slopes = ALiBi(h).slopes.float().to(dev)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    mask = create_block_mask(causal, None, None, s, s, device=dev)
    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: flex(q, k, v, score_mod=alibi, block_mask=mask)


def fwd_bwd(fn, q, k, v):
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    grad = torch.randn_like(q)
    return lambda: torch.autograd.backward(fn(qg, kg, vg), grad)


def attention_rows(shape, dev, train):
    """posenc's backends per encoding at ``shape`` over the hand-written ALiBi and the floor."""
    import torch.nn.functional as F

    q, k, v = (torch.randn(shape, device=dev, dtype=DT) for _ in range(3))
    floor = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    ref = hand_written_alibi(shape, dev)
    base = {"forward": bench(lambda: ref(q, k, v))}
    if train:
        base["forward+backward"] = bench(fwd_bwd(ref, q, k, v))
    rows = [{"shape": list(shape), "impl": "SDPA causal, no bias (floor)", "pass": "forward",
             "ms": floor}]  # fmt: skip
    rows += [{"shape": list(shape), "impl": "hand-written compiled flex ALiBi", "pass": p,
              "ms": ms} for p, ms in base.items()]  # fmt: skip
    for name, cls in ENCODINGS.items():
        enc = cls(shape[1]).to(dev)
        for backend in ("sdpa", "flex", "auto"):
            torch._dynamo.reset()

            def fn(q, k, v, enc=enc, backend=backend):
                return attend(q, k, v, enc, backend=backend)

            passes = {"forward": lambda fn=fn: fn(q, k, v)}
            if train:
                passes["forward+backward"] = fwd_bwd(fn, q, k, v)
            for p, call in passes.items():
                row = {"shape": list(shape), "impl": f"posenc {name}, backend={backend!r}",
                       "pass": p}  # fmt: skip
                try:
                    with torch.no_grad() if p == "forward" else torch.enable_grad():
                        row["ms"] = bench(call)
                except Exception as err:  # one failing configuration must not stop the run
                    row["error"] = f"{type(err).__name__}: {err}"[:300]
                rows.append(row)
    for row in (r for r in rows if "ms" in r):
        row["ratio_floor"] = row["ms"] / floor
        if row["pass"] in base:
            row["ratio_hand_written"] = row["ms"] / base[row["pass"]]
    return rows


def end_to_end(cfg, dev, train):
    """ALiBi over NoPE, default backend: per AdamW step and per inference forward."""
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=dev)
    out = {}
    for name, enc in (("NoPE", NoPE()), ("ALiBi", ALiBi(cfg["heads"]))):
        torch.manual_seed(0)
        lm = TransformerLM(cfg["vocab"], cfg["dim"], cfg["depth"], cfg["heads"], encoding=enc)
        lm = lm.to(dev, DT)
        torch._dynamo.reset()
        with torch.no_grad():
            out[f"{name} forward"] = bench(lambda lm=lm: lm(idx))
        if train:
            opt = torch.optim.AdamW(lm.parameters(), lr=1e-4)

            def step(lm=lm, opt=opt):
                logits = lm(idx[:, :-1])
                loss = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1).float(), idx[:, 1:].flatten()
                )
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            out[f"{name} train step"] = bench(step)
    for kind in ("forward", "train step"):
        if f"ALiBi {kind}" in out:
            out[f"ALiBi / NoPE {kind}"] = out[f"ALiBi {kind}"] / out[f"NoPE {kind}"]
    return out


def greedy(step, cache, prompt, new):
    """Prefill then ``new - 1`` one-token steps through ``step``; returns the tokens. The
    cache is reused (reset), so CUDA graphs see the same buffers in every run."""
    cache.reset()
    logits = step(prompt, cache=cache)
    toks = [logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new - 1):
        logits = step(toks[-1], cache=cache)
        toks.append(logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(toks, 1)


def wall_ms(fn, reps=3):
    fn()  # warm-up (compiles)
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def decode_rows(cfg, dec, dev):
    """Greedy decoding tokens/s: posenc eager and compiled, HF Llama beside it."""
    rows = []
    encs = {"RoPE": lambda: RotaryEmbedding(cfg["dim"] // cfg["heads"], max_len=4096),
            "ALiBi": lambda: ALiBi(cfg["heads"])}  # fmt: skip
    for b in dec["batches"]:
        prompt = torch.randint(0, cfg["vocab"], (b, dec["prompt"]), device=dev)
        for name, make in encs.items():
            torch.manual_seed(0)
            lm = TransformerLM(cfg["vocab"], cfg["dim"], cfg["depth"], cfg["heads"],
                               encoding=make()).to(dev, DT).eval()  # fmt: skip
            runs = {"eager, KVCache": (lm, False), "eager, StaticKVCache": (lm, True)}
            for mode in ("default", "reduce-overhead"):
                runs[f"compiled fullgraph {mode}, StaticKVCache"] = (mode, True)
            reference = None
            for label, (fn, static) in runs.items():
                graphs = None
                if isinstance(fn, str):
                    if fn == "reduce-overhead" and not torch.cuda.is_available():
                        continue
                    torch._dynamo.reset()
                    counters.clear()
                    fn = torch.compile(lm, fullgraph=True, mode=fn)

                cache = lm.new_cache(b, dec["prompt"] + dec["new"], static=static)

                def run(fn=fn, cache=cache, prompt=prompt):
                    return greedy(fn, cache, prompt, dec["new"])

                row = {"batch": b, "encoding": name, "impl": f"posenc {label}"}
                try:
                    with torch.no_grad():
                        ms = wall_ms(run)
                        toks = run()
                except Exception as err:  # e.g. a CUDA graph that cannot be captured
                    rows.append(row | {"error": f"{type(err).__name__}: {err}"[:300]})
                    continue
                if fn is not lm:
                    graphs = counters["stats"]["unique_graphs"]
                reference = toks if reference is None else reference
                same = bool((toks == reference).all())
                tps = b * dec["new"] / ms * 1e3
                rows.append(row | {"tokens_per_s": tps, "graphs": graphs, "same_tokens": same})
        rows += hf_rows(cfg, dec, prompt, dev)
    return rows


def hf_rows(cfg, dec, prompt, dev):
    """HF ``LlamaForCausalLM.generate`` of the same size: dynamic and static cache."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:
        return [{"batch": prompt.shape[0], "impl": "HF generate", "error": str(err)}]
    conf = LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["dim"],
                       intermediate_size=4 * cfg["dim"], num_hidden_layers=cfg["depth"],
                       num_attention_heads=cfg["heads"], max_position_embeddings=4096)  # fmt: skip
    model = LlamaForCausalLM(conf).to(dev, DT).eval()
    rows = []
    for label, kw in (("dynamic cache", {}), ("static cache", {"cache_implementation": "static"})):
        torch._dynamo.reset()

        def gen(kw=kw):
            return model.generate(prompt, max_new_tokens=dec["new"], min_new_tokens=dec["new"],
                                  do_sample=False, **kw)  # fmt: skip

        try:
            ms = wall_ms(gen)
            rows.append({"batch": prompt.shape[0], "encoding": "RoPE",
                         "impl": f"HF LlamaForCausalLM.generate, {label}",
                         "tokens_per_s": prompt.shape[0] * dec["new"] / ms * 1e3})  # fmt: skip
        except Exception as err:  # a version without it: say so in the results
            rows.append({"batch": prompt.shape[0], "impl": f"HF generate, {label}",
                         "error": f"{type(err).__name__}: {err}"[:300]})  # fmt: skip
    return rows


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/gpu_scores.json")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU")
    parser.add_argument("--sections", default="attention,end_to_end,decode")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        print("bench_gpu_scores: no CUDA device here; nothing measured (--smoke to check it)")
        return 0
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    train = dev == "cuda"  # FlexAttention has no backward on the CPU
    shapes = SMOKE["attn"] if args.smoke else ATTN_SHAPES
    cfg, dec = (SMOKE["lm"], SMOKE["decode"]) if args.smoke else (LM, DECODE)
    sections = args.sections.split(",")
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)"
    result = {"machine": machine(), "commit": commit(), "dtype": "bfloat16", "device": name}
    if "attention" in sections:
        result["attention"] = [r for s in shapes for r in attention_rows(s, dev, train)]
    if "end_to_end" in sections:
        result["end_to_end"] = end_to_end(cfg, dev, train)
    if "decode" in sections:
        result["decode"] = decode_rows(cfg, dec, dev)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
