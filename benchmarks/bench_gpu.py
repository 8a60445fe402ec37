"""Benchmark on a CUDA GPU: the rotation family against its peers and the copy bound.

Run with ``nox -s bench -- gpu`` or ``python benchmarks/bench_gpu.py --sections rope``;
``--plan`` lists the sections with an estimate of their minutes on an H100 (each at most
8), and each appends its rows, the device and the commit to ``benchmarks/results/gpu.json``.
Without CUDA it says so and exits 0, writing nothing (``--smoke --out PATH`` runs every
section at toy sizes on the CPU, to check the script). All in bfloat16, medians of
``triton.testing.do_bench``; every ratio is taken within one section's run:

* ``rope``: RoPE on q and k per shape and pairing -- posenc (new output, ``out=``, in
  place, forward+backward), HF ``apply_rotary_pos_emb`` (forward, forward+backward),
  Meta's complex formulation (interleaved), liger-kernel's Triton RoPE if installed --
  over the copy bound (a measured device-to-device copy of q and k's bytes); with a
  decode-step shape (one token, per-row positions) beside the prefill ones;
* ``rope_compiled``: the same under ``torch.compile``, each configuration in a fresh
  process (dynamo's recompile limit is shared within a process);
* ``precision``: the share of bf16 outputs equal to the correctly rounded float64 result,
  and the CUDA kernels per RoPE call (profiler);
* ``attention``: :func:`posenc.torch.attend` with RoPE over (SDPA causal + one copy bound),
  PoPE's over RoPE's;
* ``end_to_end``: a GPT-2-small-sized ``TransformerLM`` (12 layers, width 768, 12 heads,
  vocabulary 32,000, 8 x 1024 tokens), RoPE over NoPE, per AdamW training step and per
  inference forward, each timed over at least a second;
* ``end_to_end_compiled``: the same under ``torch.compile(lm)``, each encoding in a fresh
  process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _gpu import Section, bench, fresh, main

import posenc
from posenc.torch import NoPE, PoPE, RotaryEmbedding, TransformerLM, apply_rope, attend
from posenc.torch.kernels import cos_sin

ROPE_SHAPES = [(1, 32, 4096, 128), (4, 32, 4096, 128), (8, 8, 2048, 64)]
DECODE_SHAPES = [(64, 32, 1, 128)]  # one token per row at its own position (a KV cache step)
ATTN_SHAPES = [(1, 32, 4096, 128), (8, 16, 1024, 64)]
# vocabulary 32,000 (Llama's): at 50,257 the float LM head makes NoPE's step GPU-bound, which
# hides the host time RoPE adds (../shared/notes/gpu.md; issue 39 measures at 32,000)
LM = {"vocab": 32000, "dim": 768, "depth": 12, "heads": 12, "batch": 8, "seq": 1024}
SMOKE = {  # toy sizes for --smoke on the CPU
    "rope": [(1, 2, 64, 16)],
    "decode": [(4, 2, 1, 16)],
    "attn": [(1, 2, 64, 16)],
    "lm": {"vocab": 97, "dim": 32, "depth": 2, "heads": 2, "batch": 2, "seq": 64},
}
DT = torch.bfloat16


def meta_complex(xq, xk, freqs_cis):
    """Meta's Llama reference: pairs as complex numbers (interleaved)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    out = (torch.view_as_real(t * freqs_cis).flatten(-2) for t in (xq_, xk_))
    return tuple(o.type_as(x) for o, x in zip(out, (xq, xk), strict=True))


def hf_cos_sin(positions, d, dev):
    """HF Llama's cos and sin ``(b, s, d)`` in bf16 (float32 angles, as HF computes them)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=d, num_attention_heads=1, head_dim=d,
                      max_position_embeddings=int(positions.max()) + 1,
                      rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})  # fmt: skip
    x = torch.empty(1, device=dev, dtype=DT)
    return LlamaRotaryEmbedding(cfg).to(dev)(x, positions)


def _inputs(shape, dev):
    """q, k and the positions of a shape: ``0 .. s - 1``, or per row for a decode step."""
    b, h, s, d = shape
    q, k = (torch.randn(shape, device=dev, dtype=DT) for _ in range(2))
    decode = s == 1
    pos = torch.randint(0, 4096, (b, 1), device=dev) if decode else range(s)
    return q, k, pos


def _tensor(pos, dev):
    return torch.arange(pos.start, pos.stop, device=dev)[None] if isinstance(pos, range) else pos


def rope_impls(shape, dev, compiled_only=False):
    """name -> (fn, args) for every RoPE of q and k at ``shape`` (both pairings)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, h, s, d = shape
    q, k, pos = _inputs(shape, dev)
    cos, sin = hf_cos_sin(_tensor(pos, dev), d, dev)
    inv = torch.from_numpy(posenc.rope_frequencies(d)[0]).to(dev)
    fc = torch.view_as_complex(cos_sin(_tensor(pos, dev), inv, 1.0, torch.float32))[:, None]
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    grads = (torch.randn_like(q), torch.randn_like(k))

    def fwd_bwd(fn):
        return lambda: torch.autograd.backward(fn(qg, kg), grads)

    impls = {}
    for pairing in ("half", "interleaved"):
        rot = RotaryEmbedding(d, max_len=4096, pairing=pairing).to(dev)
        impls[f"posenc {pairing}"] = lambda rot=rot: rot.rope(q, k, pos)
        impls[f"posenc {pairing}, fwd+bwd"] = fwd_bwd(lambda a, b, rot=rot: rot(a, b, pos))
        if compiled_only:
            continue
        outs, qi, ki = (torch.empty_like(q), torch.empty_like(k)), q.clone(), k.clone()
        impls[f"posenc {pairing}, out="] = lambda rot=rot, o=outs: rot.rope(q, k, pos, out=o)
        impls[f"posenc {pairing}, in place"] = lambda rot=rot, a=qi, b=ki: rot.encode_qk(
            a, b, pos, pos, inplace=True
        )
    hf = lambda a, b: apply_rotary_pos_emb(a, b, cos, sin)  # noqa: E731
    impls["HF apply_rotary_pos_emb (half)"] = lambda: hf(q, k)
    impls["HF apply_rotary_pos_emb (half), fwd+bwd"] = fwd_bwd(hf)
    impls["Meta complex (interleaved)"] = lambda: meta_complex(q, k, fc)
    if dev == "cuda" and not compiled_only:  # liger's Triton kernel: CUDA tensors only
        try:
            from liger_kernel.ops.rope import LigerRopeFunction

            impls["liger-kernel (half)"] = lambda: LigerRopeFunction.apply(q, k, cos, sin)
        except ImportError:
            pass
    return impls


def copy_bound(numel, dev):
    """ms of a device-to-device copy of ``numel`` bf16 elements (read + write, like RoPE)."""
    src = torch.randn(numel, device=dev, dtype=DT)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def _shapes(smoke):
    return (SMOKE["rope"] + SMOKE["decode"]) if smoke else (ROPE_SHAPES + DECODE_SHAPES)


def rope_section(dev, smoke):
    rows = []
    for shape in _shapes(smoke):
        bound = copy_bound(2 * torch.Size(shape).numel(), dev)
        with torch.no_grad():
            for name, fn in rope_impls(shape, dev).items():
                with torch.enable_grad() if "fwd+bwd" in name else torch.no_grad():
                    ms = bench(fn)
                rows.append({"shape": list(shape), "impl": name, "ms": ms,
                             "copy_bound_ms": bound, "ratio_copy_bound": ms / bound})  # fmt: skip
    return rows


def rope_compiled_section(dev, smoke):
    rows = []
    for shape in _shapes(smoke):
        for name in rope_impls(shape, dev, compiled_only=True):
            rows.append(fresh(__file__, {"shape": list(shape), "impl": name, "smoke": smoke}))
    return rows


def one(config):
    """One compiled configuration, in this (fresh) process: a RoPE call (ms and ratio to the
    copy bound) or a whole model's training step and forward (``kind="lm"``)."""
    dev = "cpu" if config["smoke"] else "cuda"
    if config.get("kind") == "lm":
        return _lm_one(config, dev)
    shape = tuple(config["shape"])
    fn = rope_impls(shape, dev, compiled_only=True)[config["impl"]]
    step = torch.compile(fn, dynamic=False)
    with torch.enable_grad() if "fwd+bwd" in config["impl"] else torch.no_grad():
        ms = bench(step)
    bound = copy_bound(2 * torch.Size(shape).numel(), dev)
    return {**config, "impl": config["impl"] + " compiled", "ms": ms, "copy_bound_ms": bound,
            "ratio_copy_bound": ms / bound}  # fmt: skip


def precision_section(dev, smoke):
    """Share of bf16 RoPE outputs equal to the float64 result rounded once; CUDA kernels per
    RoPE call on q and k."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    s, d = (64, 16) if smoke else (4096, 128)
    x = torch.randn(1, 8, s, d, device=dev, dtype=DT)
    exact = apply_rope(x.double()).to(DT)  # float64 tables and arithmetic, one rounding
    cos, sin = hf_cos_sin(torch.arange(s, device=dev)[None], d, dev)
    hf, _ = apply_rotary_pos_emb(x, x, cos, sin)
    with torch.no_grad():
        ours = RotaryEmbedding(d, max_len=s).to(dev)(x, x)[0]
    row = {"posenc_correctly_rounded": (ours == exact).double().mean().item(),
           "hf_correctly_rounded": (hf == exact).double().mean().item()}  # fmt: skip
    if dev == "cuda":
        q, k = (torch.randn(1, 32, s, d, device=dev, dtype=DT) for _ in range(2))
        for pairing in ("half", "interleaved"):
            rot = RotaryEmbedding(d, max_len=s, pairing=pairing).to(dev)
            rot.rope(q, k)
            acts = [torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                rot.rope(q, k)
                torch.cuda.synchronize()
            cuda = torch.autograd.DeviceType.CUDA
            row[f"kernels per call ({pairing})"] = sum(
                e.count for e in prof.key_averages() if e.device_type == cuda
            )
    return [row]


def _attention_row(shape, dev):
    b, h, s, d = shape
    bound = copy_bound(2 * torch.Size(shape).numel(), dev)
    q, k, v = (torch.randn(shape, device=dev, dtype=DT) for _ in range(3))
    rope = RotaryEmbedding(d, max_len=s).to(dev)
    pope = PoPE(d, h).to(dev, DT)
    with torch.no_grad():
        t = {
            "sdpa_causal": bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            "attend_rope": bench(lambda: attend(q, k, v, rope)),
            "attend_pope": bench(lambda: attend(q, k, v, pope)),
        }
    return {"shape": list(shape), **{f"{n}_ms": ms for n, ms in t.items()},
            "copy_bound_ms": bound,
            "rope_over_floor": t["attend_rope"] / (t["sdpa_causal"] + bound),
            "pope_over_rope": t["attend_pope"] / t["attend_rope"]}  # fmt: skip


def attention_section(dev, smoke):
    return [_attention_row(shape, dev) for shape in (SMOKE["attn"] if smoke else ATTN_SHAPES)]


def _lm_timings(name, cfg, dev, compiled=False):
    """ms per AdamW training step and per inference forward of one encoding (>= 1 s each)."""
    tokens = torch.randint(cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), device=dev,
                           generator=torch.Generator(dev).manual_seed(0))  # fmt: skip
    x, y = tokens[:, :-1], tokens[:, 1:]  # (batch, seq) each
    head_dim = cfg["dim"] // cfg["heads"]
    enc = NoPE() if name == "NoPE" else RotaryEmbedding(head_dim, max_len=cfg["seq"])
    torch.manual_seed(0)
    lm = TransformerLM(cfg["vocab"], cfg["dim"], cfg["depth"], cfg["heads"], encoding=enc)
    lm = lm.to(dev, DT)
    fwd = torch.compile(lm) if compiled else lm
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-4)

    def step():
        loss = F.cross_entropy(fwd(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        with torch.no_grad():
            fwd(x)

    # an 80 ms step repeated over >= 1 s: enough repeats for a 1.05x comparison
    return {"train_step_ms": bench(step, 1000), "inference_ms": bench(infer, 1000)}


def _ratios(out):
    for key in ("train_step_ms", "inference_ms"):
        out[f"rope_over_nope_{key[:-3]}"] = out["RoPE"][key] / out["NoPE"][key]
    return [out]


def end_to_end_section(dev, smoke):
    """RoPE over NoPE, eager, per AdamW training step and per inference forward."""
    cfg = SMOKE["lm"] if smoke else LM
    return _ratios({**cfg, **{n: _lm_timings(n, cfg, dev) for n in ("NoPE", "RoPE")}})


def _lm_one(config, dev):
    cfg = SMOKE["lm"] if config["smoke"] else LM
    return _lm_timings(config["encoding"], cfg, dev, compiled=True)


def end_to_end_compiled_section(dev, smoke):
    """The same under ``torch.compile(lm)`` (the optimizer eager), a fresh process each."""
    cfg = SMOKE["lm"] if smoke else LM
    runs = {n: fresh(__file__, {"kind": "lm", "encoding": n, "smoke": smoke})
            for n in ("NoPE", "RoPE")}  # fmt: skip
    if any("error" in r for r in runs.values()):
        return [{**cfg, **runs}]
    return _ratios({**cfg, "compiled": "torch.compile(lm)", **runs})


SECTIONS = [
    Section("rope", "RoPE of q and k, eager, per shape, over the copy bound", 2.0, rope_section),
    Section("rope_compiled", "RoPE under torch.compile, a fresh process each", 7.0,
            rope_compiled_section),
    Section("precision", "correctly rounded share; kernels per call", 0.5, precision_section),
    Section("attention", "attend with RoPE and PoPE over SDPA", 1.0, attention_section),
    Section("end_to_end", "a GPT-2-small LM, RoPE over NoPE", 2.0, end_to_end_section),
    Section("end_to_end_compiled", "the same compiled, a fresh process each", 3.0,
            end_to_end_compiled_section),
]  # fmt: skip

if __name__ == "__main__":
    raise SystemExit(main(SECTIONS, description=__doc__.splitlines()[0],
                          out="benchmarks/results/gpu.json", one=one))  # fmt: skip
