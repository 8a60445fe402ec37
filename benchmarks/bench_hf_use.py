"""Time per forward of a small HF Llama after ``posenc.hf.use``, against the same model as HF built it.

The model is small (2 layers, 8 heads of 32, hidden 256, float32, one thread) so that the
work around the kernels -- HF's and posenc's Python per call -- shows, as it does for a
small model on a GPU. Same weights, same inputs, alternating rounds, medians:

* ``decode``: one token against a DynamicCache of 128 keys (cropped back after each step);
* ``prefill``: 256 tokens, no cache.

Rows: the model's own RoPE put in ``path="rotary"`` (HF's attention with posenc's cos and
sin) and ``path="attention"`` (posenc's ``attend`` in every layer), each against HF's own
model with SDPA attention.

    python benchmarks/bench_hf_use.py [--out benchmarks/results/hf_use.json]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
import transformers
from _common import machine
from bench_host import ratio

from posenc.hf import use
from posenc.torch import Schedule

CACHED, PREFILL = 128, 256
TARGETS = {  # posenc / HF: the most the way in may cost
    "decode, rotary": 1.10, "decode, attention": 1.5,
    "prefill, rotary": 1.10, "prefill, attention": 1.3,
}  # fmt: skip


def _model():
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _decode(model):
    ids = torch.randint(0, 512, (1, CACHED))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    step = torch.tensor([[7]])
    pos = torch.tensor([[CACHED]])

    def run():
        model(step, past_key_values=cache, position_ids=pos, use_cache=True)
        cache.crop(-1)  # back to the 128 cached keys

    return run


def _prefill(model):
    ids = torch.randint(0, 512, (1, PREFILL))
    return lambda: model(ids, use_cache=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/hf_use.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    hf = _model()
    rows = []
    for path in ("rotary", "attention"):
        mine = copy.deepcopy(hf)
        use(mine, Schedule.from_hf(mine.config), path=path)
        assert mine.posenc_path == path
        for case, make, calls in (("decode", _decode, 40), ("prefill", _prefill, 5)):
            with torch.no_grad():  # us per call, alternating rounds (bench_host's timing)
                ms = {k: v / 1e3 for k, v in ratio(make(mine), make(hf), calls=calls).items()}
            label = f"{case}, {path}"
            row = {"case": label, "posenc_ms": round(ms["ours"], 3), "hf_ms": round(ms["peer"], 3),
                   "ratio": round(ms["ours"] / ms["peer"], 3), "target": TARGETS[label]}  # fmt: skip
            row["met"] = row["ratio"] <= row["target"]
            rows.append(row)
            print(f"{label:20s} posenc {row['posenc_ms']:8.3f} ms  HF {row['hf_ms']:8.3f} ms  "
                  f"{row['ratio']:.2f}x (target <= {row['target']})")  # fmt: skip
    out = {"machine": machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "transformers": transformers.__version__, "rows": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
