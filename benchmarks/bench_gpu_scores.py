"""Benchmark on a CUDA GPU: score biases through FlexAttention, and compiled decoding.

Run with ``python benchmarks/bench_gpu_scores.py --sections attention_sdpa`` (issue 16; the
RoPE half of the GPU benchmark is ``bench_gpu.py``); ``--plan`` lists the sections with an
estimate of their minutes on an H100 (each at most 8), and each appends its rows, the
device and the commit to ``benchmarks/results/gpu_scores.json``. Without CUDA it says so
and exits 0, writing nothing (``--smoke --out PATH`` runs every section at toy sizes on
the CPU, to check the script; its numbers mean nothing).

All in bfloat16, medians of ``triton.testing.do_bench`` (decoding: the median wall time of
whole greedy loops); every compiled configuration runs in a fresh process:

* ``attention_sdpa``: causal attention with ALiBi, T5, KERPLE and FIRE at each shape
  through ``attend(backend="sdpa")`` (one float mask per call), forward and forward +
  backward, over SDPA's own causal kernel (the floor);
* ``attention_flex``: the same through ``backend="flex"`` (also what ``"auto"``, the
  default, picks for score biases on CUDA), one encoding and shape per process, beside a
  hand-written ``torch.compile(flex_attention)`` with an ALiBi ``score_mod`` and a causal
  block mask built once (the issue's reference);
* ``alibi_flex``: the ALiBi rows of ``attention_flex`` alone (issue 39's comparison);
* ``end_to_end``: a GPT-2-small-sized ``TransformerLM`` (12 layers, width 768, 12 heads,
  8 x 1024 tokens) with ALiBi over the same model with NoPE, default backend, per AdamW
  training step and per inference forward, each timed over at least a second;
* ``decode``: greedy tokens/s at batch 1 and 16 (a 128-token prompt, 128 new tokens),
  posenc eager with the growing ``KVCache`` and with ``StaticKVCache``, beside HF
  ``LlamaForCausalLM.generate`` of the same size (dynamic and static cache);
* ``decode_compiled``: ``torch.compile(lm, fullgraph=True)`` over the static cache, default
  mode and ``"reduce-overhead"`` (CUDA graphs), with the graphs dynamo compiled and
  whether the tokens equal eager decoding's, one configuration per process.
"""

from __future__ import annotations

import statistics
import time

import torch
from _gpu import Section, bench, fresh, main
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
DECODERS = {"RoPE": lambda cfg: RotaryEmbedding(cfg["dim"] // cfg["heads"], max_len=4096),
            "ALiBi": lambda cfg: ALiBi(cfg["heads"])}  # fmt: skip


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


def _passes(fn, q, k, v, train):
    passes = {"forward": lambda: fn(q, k, v)}
    if train:
        passes["forward+backward"] = fwd_bwd(fn, q, k, v)
    return passes


def _timed(row, call, p):
    try:  # one failing configuration must not stop the run
        with torch.no_grad() if p == "forward" else torch.enable_grad():
            return {**row, "ms": bench(call)}
    except Exception as err:
        return {**row, "error": f"{type(err).__name__}: {err}"[:300]}


def attention_sdpa_section(dev, smoke):
    """posenc's SDPA backend per encoding at each shape, over the floor."""
    import torch.nn.functional as F

    train, rows = dev == "cuda", []  # FlexAttention and SDPA masks: backward on CUDA only
    for shape in SMOKE["attn"] if smoke else ATTN_SHAPES:
        q, k, v = (torch.randn(shape, device=dev, dtype=DT) for _ in range(3))
        sdpa = F.scaled_dot_product_attention
        floor = bench(lambda q=q, k=k, v=v, sdpa=sdpa: sdpa(q, k, v, is_causal=True))
        rows.append({"shape": list(shape), "impl": "SDPA causal, no bias (floor)",
                     "pass": "forward", "ms": floor, "ratio_floor": 1.0})  # fmt: skip
        for name, cls in ENCODINGS.items():
            enc = cls(shape[1]).to(dev)

            def fn(q, k, v, enc=enc):
                return attend(q, k, v, enc, backend="sdpa")

            for p, call in _passes(fn, q, k, v, train).items():
                row = _timed({"shape": list(shape), "impl": f"posenc {name}, backend='sdpa'",
                              "pass": p}, call, p)  # fmt: skip
                rows.append(row | ({"ratio_floor": row["ms"] / floor} if "ms" in row else {}))
    return rows


def attention_flex_section(dev, smoke, names=("hand-written ALiBi", *ENCODINGS)):
    rows = []
    for shape in SMOKE["attn"] if smoke else ATTN_SHAPES:
        for name in names:
            rows.append(fresh(__file__, {"kind": "flex", "shape": list(shape), "encoding": name,
                                         "smoke": smoke}))  # fmt: skip
    return rows


def _flex_one(config, dev):
    import torch.nn.functional as F

    shape, name = tuple(config["shape"]), config["encoding"]
    q, k, v = (torch.randn(shape, device=dev, dtype=DT) for _ in range(3))
    floor = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    if name == "hand-written ALiBi":
        fn = hand_written_alibi(shape, dev)
    else:
        enc = ENCODINGS[name](shape[1]).to(dev)

        def fn(q, k, v):
            return attend(q, k, v, enc, backend="flex")

    out = {}
    for p, call in _passes(fn, q, k, v, dev == "cuda").items():
        row = _timed({}, call, p)
        out[f"{p} ms"] = row.get("ms")
        if "ms" in row:
            out[f"{p} ratio_floor"] = row["ms"] / floor
        else:
            out[f"{p} error"] = row["error"]
    return {**config, "floor_ms": floor, **out}


def end_to_end_section(dev, smoke):
    """ALiBi over NoPE, default backend: per AdamW step and per inference forward (>= 1 s)."""
    cfg, train = SMOKE["lm"] if smoke else LM, dev == "cuda"
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=dev)
    out = {}
    for name, enc in (("NoPE", NoPE()), ("ALiBi", ALiBi(cfg["heads"]))):
        torch.manual_seed(0)
        lm = TransformerLM(cfg["vocab"], cfg["dim"], cfg["depth"], cfg["heads"], encoding=enc)
        lm = lm.to(dev, DT)
        torch._dynamo.reset()
        with torch.no_grad():
            out[f"{name} forward"] = bench(lambda lm=lm: lm(idx), 1000)
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

            out[f"{name} train step"] = bench(step, 1000)
    for kind in ("forward", "train step"):
        if f"ALiBi {kind}" in out:
            out[f"ALiBi / NoPE {kind}"] = out[f"ALiBi {kind}"] / out[f"NoPE {kind}"]
    return [out]


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


def _decoder(cfg, name, dev):
    torch.manual_seed(0)
    return TransformerLM(cfg["vocab"], cfg["dim"], cfg["depth"], cfg["heads"],
                         encoding=DECODERS[name](cfg)).to(dev, DT).eval()  # fmt: skip


def _decode(step, lm, b, dec, prompt, static):
    cache = lm.new_cache(b, dec["prompt"] + dec["new"], static=static)
    with torch.no_grad():
        ms = wall_ms(lambda: greedy(step, cache, prompt, dec["new"]))
        return ms, greedy(step, cache, prompt, dec["new"])


def decode_section(dev, smoke):
    """Greedy tokens/s, eager: the growing and the static cache; HF Llama beside them."""
    cfg, dec = (SMOKE["lm"], SMOKE["decode"]) if smoke else (LM, DECODE)
    rows = []
    for b in dec["batches"]:
        prompt = torch.randint(0, cfg["vocab"], (b, dec["prompt"]), device=dev,
                               generator=torch.Generator(dev).manual_seed(b))  # fmt: skip
        for name in DECODERS:
            lm = _decoder(cfg, name, dev)
            for label, static in (("KVCache", False), ("StaticKVCache", True)):
                ms, _ = _decode(lm, lm, b, dec, prompt, static)
                rows.append({"batch": b, "encoding": name, "impl": f"posenc eager, {label}",
                             "tokens_per_s": b * dec["new"] / ms * 1e3})  # fmt: skip
        rows += hf_rows(cfg, dec, prompt, dev)
    return rows


def decode_compiled_section(dev, smoke):
    dec = SMOKE["decode"] if smoke else DECODE
    modes = ["default", "reduce-overhead"] if dev == "cuda" else ["default"]
    return [fresh(__file__, {"kind": "decode", "batch": b, "encoding": name, "mode": mode,
                             "smoke": smoke})
            for b in dec["batches"] for name in DECODERS for mode in modes]  # fmt: skip


def _decode_one(config, dev):
    cfg, dec = (SMOKE["lm"], SMOKE["decode"]) if config["smoke"] else (LM, DECODE)
    b = config["batch"]
    prompt = torch.randint(0, cfg["vocab"], (b, dec["prompt"]), device=dev,
                           generator=torch.Generator(dev).manual_seed(b))  # fmt: skip
    lm = _decoder(cfg, config["encoding"], dev)
    _, eager = _decode(lm, lm, b, dec, prompt, True)
    counters.clear()
    step = torch.compile(lm, fullgraph=True, mode=config["mode"])
    ms, toks = _decode(step, lm, b, dec, prompt, True)
    return {**config, "impl": f"posenc compiled fullgraph {config['mode']}, StaticKVCache",
            "tokens_per_s": b * dec["new"] / ms * 1e3,
            "graphs": counters["stats"]["unique_graphs"],
            "same_tokens_as_eager": bool((toks == eager).all())}  # fmt: skip


def one(config):
    """One compiled configuration, in this (fresh) process."""
    dev = "cpu" if config["smoke"] else "cuda"
    return _flex_one(config, dev) if config["kind"] == "flex" else _decode_one(config, dev)


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


SECTIONS = [
    Section("attention_sdpa", "score biases through SDPA's float mask", 1.5,
            attention_sdpa_section),
    Section("attention_flex", "score biases through FlexAttention, a process each", 7.0,
            attention_flex_section),
    Section("alibi_flex", "ALiBi through FlexAttention and by hand, a process each", 2.0,
            lambda dev, smoke: attention_flex_section(dev, smoke, ("hand-written ALiBi", "ALiBi"))),
    Section("end_to_end", "a GPT-2-small LM, ALiBi over NoPE", 3.0, end_to_end_section),
    Section("decode", "greedy decoding, eager posenc and HF generate", 3.0, decode_section),
    Section("decode_compiled", "compiled decoding over the static cache, a process each",
            7.0, decode_compiled_section),
]  # fmt: skip

if __name__ == "__main__":
    raise SystemExit(main(SECTIONS, description=__doc__.splitlines()[0],
                          out="benchmarks/results/gpu_scores.json", one=one))  # fmt: skip
