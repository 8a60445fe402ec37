"""Benchmark: applying RoPE to q and k, posenc against its peers, in one process.

Run with ``nox -s bench`` (installs the peers into the bench session only), or directly:
``python benchmarks/bench_rope.py --out benchmarks/results/rope.json [--no-compile]``.

For each shape ``(batch, heads, seq, head_dim)`` and dtype it times every implementation
on the same inputs (median of repeated runs after warm-up), and reports

* the time in ms for q and k together,
* the ratio to the fastest *eager* peer (not posenc) at that shape and dtype,
* the ratio to the memory-bandwidth bound: the bytes RoPE must move (read q and k,
  write both results) divided by the copy bandwidth measured here, i.e. the time of
  ``dst.copy_(src)`` on a buffer the size of q and k together.

Precision: float32 outputs for positions up to 2**20 against a float64 reference, for
posenc and for HF's float32-angle tables.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from _common import machine, timeit

import posenc
from posenc.torch import RotaryEmbedding, apply_rope

SHAPES = [(1, 32, 2048, 128), (4, 8, 1024, 64), (1, 8, 8192, 64)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BASE = 10_000.0


def hf_config(heads, head_dim, max_pos):
    """A Llama config with default RoPE, for HF's rotary embedding."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters={"rope_type": "default", "rope_theta": BASE},
    )


# -- peers -----------------------------------------------------------------------------------
def meta_complex(xq, xk, freqs_cis):
    """Meta's Llama reference formulation: pairs as complex numbers (interleaved)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(-2)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(-2)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def build_impls(shape, dtype, compile_too):
    b, h, s, d = shape
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=gen).to(dtype)  # (b, h, s, d)
    k = torch.randn(shape, generator=gen).to(dtype)
    eager, compiled, ours = {}, {}, {}

    rot_half = RotaryEmbedding(d, base=BASE, max_len=s)
    rot_inter = RotaryEmbedding(d, base=BASE, max_len=s, pairing="interleaved")
    outs = (torch.empty_like(q), torch.empty_like(k))
    ours["posenc half"] = lambda: rot_half.rope(q, k)
    ours["posenc interleaved"] = lambda: rot_inter.rope(q, k)  # a new output, as Meta's
    ours["posenc half, out="] = lambda: rot_half.rope(q, k, out=outs)
    ours["posenc interleaved, out="] = lambda: rot_inter.rope(q, k, out=outs)
    # what MultiHeadAttention does with its fresh projections (eager, no autograd)
    qi, ki, pos = q.clone(), k.clone(), range(s)
    ours["posenc half, in place"] = lambda: rot_half.encode_qk(qi, ki, pos, pos, inplace=True)
    ours["posenc interleaved, in place"] = lambda: rot_inter.encode_qk(
        qi, ki, pos, pos, inplace=True
    )

    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cos, sin = LlamaRotaryEmbedding(hf_config(h, d, s))(
        q, torch.arange(s)[None]
    )  # (1, s, d), q's dtype
    eager["HF apply_rotary_pos_emb (half)"] = lambda: apply_rotary_pos_emb(q, k, cos, sin)

    inv = torch.from_numpy(posenc.rope_frequencies(d, base=BASE)[0])
    freqs_cis = torch.polar(
        torch.ones(s, d // 2), (torch.arange(s, dtype=torch.float64)[:, None] * inv).float()
    )  # (s, d // 2)
    eager["Meta complex (interleaved)"] = lambda: meta_complex(q, k, freqs_cis)

    from torchtune.modules import RotaryPositionalEmbeddings

    tt = RotaryPositionalEmbeddings(d, max_seq_len=s, base=int(BASE))
    q_bshd, k_bshd = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # its layout
    eager["torchtune (interleaved)"] = lambda: (tt(q_bshd), tt(k_bshd))

    from rotary_embedding_torch import RotaryEmbedding as RET

    ret = RET(dim=d, theta=BASE, cache_if_possible=True, cache_max_seq_len=s)
    eager["rotary-embedding-torch (interleaved)"] = lambda: (
        ret.rotate_queries_or_keys(q),
        ret.rotate_queries_or_keys(k),
    )

    if compile_too:

        def posenc_fn(q, k):
            return rot_half.rope(q, k)

        c_ours = torch.compile(posenc_fn, dynamic=False)
        c_hf = torch.compile(apply_rotary_pos_emb, dynamic=False)
        compiled["posenc half (compiled)"] = lambda: c_ours(q, k)
        compiled["HF apply_rotary_pos_emb (compiled)"] = lambda: c_hf(q, k, cos, sin)

    src = torch.empty(2 * q.numel(), dtype=dtype).normal_()
    dst = torch.empty_like(src)
    bound = timeit(lambda: dst.copy_(src))  # moves read 2N + write 2N bytes, like RoPE on q, k
    return ours, eager, compiled, bound


def precision():
    """Max |error| of float32 RoPE at positions up to 2**20 vs a float64 reference."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    d = 128
    pos = torch.linspace(0, 2**20 - 1, 1024).round().long()  # (1024,)
    x = torch.randn(1, 1, 1024, d, generator=torch.Generator().manual_seed(1))
    ref = posenc.rope(x.double().numpy(), pos.numpy())  # float64
    ours = apply_rope(x, pos).double().numpy()
    cos, sin = LlamaRotaryEmbedding(hf_config(1, d, 2**20))(x, pos[None])
    hf, _ = apply_rotary_pos_emb(x, x, cos, sin)
    return {
        "max_position": int(pos.max()),
        "posenc_float32_max_abs_error": float(np.abs(ours - ref).max()),
        "hf_float32_max_abs_error": float(np.abs(hf.double().numpy() - ref).max()),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/rope.json")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile variants")
    args = parser.parse_args()
    rows = []
    print(f"machine: {machine()}")
    for shape in SHAPES:
        for dname, dtype in DTYPES.items():
            ours, eager, compiled, bound = build_impls(shape, dtype, not args.no_compile)
            times = {name: timeit(fn) for name, fn in {**ours, **eager, **compiled}.items()}
            fastest_peer = min(times[n] for n in eager)
            print(
                f"\n{shape} {dname}: bandwidth bound {bound:.2f} ms, fastest eager peer "
                f"{fastest_peer:.2f} ms"
            )
            print(f"  {'implementation':<40} {'ms':>8} {'/fastest peer':>14} {'/bound':>8}")
            for name, ms in times.items():
                kind = (
                    "posenc" if name in ours else ("compiled" if name in compiled else "eager peer")
                )
                rows.append(
                    {
                        "shape": list(shape),
                        "dtype": dname,
                        "impl": name,
                        "kind": kind,
                        "ms": ms,
                        "ratio_fastest_eager_peer": ms / fastest_peer,
                        "ratio_bandwidth_bound": ms / bound,
                        "bound_ms": bound,
                    }
                )
                print(f"  {name:<40} {ms:8.2f} {ms / fastest_peer:14.2f} {ms / bound:8.2f}")
    prec = precision()
    print(f"\nprecision at positions up to 2**20 (float32): {prec}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "results": rows, "precision": prec}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
