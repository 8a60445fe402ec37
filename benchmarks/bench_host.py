"""Host time per call on the CPU: posenc's Python around a rotation or a score bias.

At a one-token decode shape the kernels cost next to nothing, so what is timed is the work
done on the host per call (checks, plans, tables, masks): the cost that makes a small model
host-bound on a GPU (``../shared/notes/gpu.md``: ~355 us per RoPE call on an H200's host).
Each row is a ratio of medians against a peer timed in the same process, alternating runs,
one thread:

* ``rope``: ``RotaryEmbedding.encode_qk`` of q and k ``(1, 8, 1, 64)`` at a tensor position
  against HF's ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` (the Llama decode step);
* ``alibi``: ``attend(q, k, v, ALiBi(8), backend="sdpa")``, one query over 64 keys, against
  SDPA given a bias row built once beforehand (the floor: no host work for position at all).

Each without grad (inference) and with q, k, v requiring grad (a training step's forward).
With ``--device cuda`` the same calls on GPU tensors: each round ends with a synchronize, and
the kernels' launches count as host work (as they do in a host-bound step).

    python benchmarks/bench_host.py [--out benchmarks/results/host.json] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import machine

from posenc.torch import ALiBi, RotaryEmbedding
from posenc.torch.attention.core import attend

H, D, KEYS = 8, 64, 64
TARGETS = {  # the ratio each row must stay under (issue "Lean hot paths")
    "rope, no grad": 1.0, "rope, grad": 1.2, "alibi sdpa, no grad": 1.5, "alibi sdpa, grad": 2.0,
}  # fmt: skip


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _per_call_us(fn, calls):
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync()
    return (time.perf_counter() - start) / calls * 1e6


def ratio(ours, peer, *, calls=400, rounds=15):
    """Medians (us per call) of ``ours`` and ``peer``, timed in alternating rounds."""
    for fn in (ours, peer):
        fn()
    times = {"ours": [], "peer": []}
    for _ in range(rounds):
        times["ours"].append(_per_call_us(ours, calls))
        times["peer"].append(_per_call_us(peer, calls))
    return {k: statistics.median(v) for k, v in times.items()}


def rope_pair(grad, dev):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, max_position_embeddings=4096)
    hf, rope = LlamaRotaryEmbedding(config).to(dev), RotaryEmbedding(D, max_len=4096).to(dev)
    q, k = (torch.randn(1, H, 1, D, device=dev, requires_grad=grad) for _ in range(2))
    pos = torch.tensor([[100]], device=dev)  # (b, 1): the decode step's position; q, k (b, h, 1, d)

    def peer():
        cos, sin = hf(q, pos)  # (b, 1, d) each
        return apply_rotary_pos_emb(q, k, cos, sin)

    return lambda: rope.encode_qk(q, k, pos, pos), peer


def alibi_pair(grad, dev):
    alibi = ALiBi(H).to(dev)
    q = torch.randn(1, H, 1, D, device=dev, requires_grad=grad)  # one query
    k, v = (torch.randn(1, H, KEYS, D, device=dev, requires_grad=grad) for _ in range(2))
    bias = alibi.score_bias(range(KEYS - 1, KEYS), range(KEYS)).detach()  # (1, h, 1, 64), once

    def peer():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    return lambda: attend(q, k, v, alibi, backend="sdpa"), peer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/host.json")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for GPU tensors")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for name, make in (("rope", rope_pair), ("alibi sdpa", alibi_pair)):
        for grad in (False, True):
            label = f"{name}, {'grad' if grad else 'no grad'}"
            ours, peer = make(grad, args.device)
            with torch.set_grad_enabled(grad):
                us = ratio(ours, peer)
            row = {"case": label, "posenc_us": round(us["ours"], 1),
                   "peer_us": round(us["peer"], 1), "ratio": round(us["ours"] / us["peer"], 3),
                   "target": TARGETS[label]}  # fmt: skip
            row["met"] = row["ratio"] <= row["target"]
            rows.append(row)
            print(f"{label:22s} posenc {row['posenc_us']:7.1f} us  peer {row['peer_us']:7.1f} us"
                  f"  {row['ratio']:.2f}x (target <= {row['target']})")  # fmt: skip
    out = {"machine": machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "rows": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
