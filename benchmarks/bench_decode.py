"""Benchmark: greedy decoding with and without the KV cache, beside a tiny HF Llama.

Run with ``nox -s bench`` or ``python benchmarks/bench_decode.py --out
benchmarks/results/decode.json``. A randomly initialised ``TransformerLM`` (RoPE,
grouped-query attention) generates ``--new`` tokens after a ``--prompt``-token prompt
(1024 tokens in all by default), once with the cache (one forward of one token per step)
and once re-running the whole sequence every step; an HF ``LlamaForCausalLM`` of the same
width, depth and heads does the same through ``generate``. Reported: tokens per second.
The two posenc runs must produce the same tokens (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from _common import machine

from posenc.torch import RotaryEmbedding, TransformerLM

VOCAB, DIM, DEPTH, HEADS, KV_HEADS = 1000, 256, 4, 8, 2


def posenc_model(max_len):
    torch.manual_seed(0)
    rope = RotaryEmbedding(DIM // HEADS, max_len=max_len)
    return TransformerLM(VOCAB, DIM, DEPTH, HEADS, kv_heads=KV_HEADS, encoding=rope).eval()


def hf_model(max_len):
    """Llama of the same shape; its gated MLP's width 683 gives our MLP's parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=683,  # 3 * 256 * 683 ~ 2 * 256 * 1024
        num_hidden_layers=DEPTH,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=max_len,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/decode.json")
    parser.add_argument("--prompt", type=int, default=24)
    parser.add_argument("--new", type=int, default=1000)
    args = parser.parse_args()
    total = args.prompt + args.new
    prompt = torch.randint(0, VOCAB, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    rows = {}
    lm = posenc_model(total)
    with torch.no_grad():
        lm.generate(prompt, 8)  # warm-up
        cached, t_cached = timed(lambda: lm.generate(prompt, args.new))
        plain, t_plain = timed(lambda: lm.generate(prompt, args.new, use_cache=False))
    if not torch.equal(cached, plain):
        raise SystemExit("posenc: cached and uncached generation disagree")
    rows["posenc TransformerLM, KV cache"] = t_cached
    rows["posenc TransformerLM, no cache"] = t_plain
    try:
        hf = hf_model(total)
    except ImportError:
        print("transformers not installed: HF rows skipped")
    else:
        kw = {"max_new_tokens": args.new, "min_new_tokens": args.new, "do_sample": False}
        with torch.no_grad():
            hf.generate(prompt, max_new_tokens=8, do_sample=False)  # warm-up
            _, rows["HF LlamaForCausalLM, KV cache"] = timed(
                lambda: hf.generate(prompt, use_cache=True, **kw)
            )
            _, rows["HF LlamaForCausalLM, no cache"] = timed(
                lambda: hf.generate(prompt, use_cache=False, **kw)
            )
    print(f"machine: {machine()}")
    print(f"greedy decoding of {args.new} tokens after {args.prompt} ({total} in all), batch 1:")
    results = []
    for name, seconds in rows.items():
        tps = args.new / seconds
        results.append({"impl": name, "seconds": seconds, "tokens_per_s": tps})
        print(f"  {name:<34} {seconds:8.2f} s  {tps:9.1f} tokens/s")
    speedup = rows["posenc TransformerLM, no cache"] / rows["posenc TransformerLM, KV cache"]
    print(f"  posenc speed-up from the cache: {speedup:.1f}x")
    model = {"vocab": VOCAB, "dim": DIM, "depth": DEPTH, "heads": HEADS, "kv_heads": KV_HEADS}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {"machine": machine(), "model": model, "prompt": args.prompt, "new": args.new,
             "results": results},
            f,
            indent=1,
        )  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
