"""Benchmark: the same documents packed into rows, or one per row padded to the longest.

Run with ``nox -s bench -- packing`` or ``python benchmarks/bench_packing.py --out
benchmarks/results/packing.json``. 48 documents of 32 to 512 tokens (a fixed draw) go
through a ``TransformerLM`` forward (no gradient) two ways: packed back to back into rows
of ``--row`` tokens with ``documents=`` (SDPA with the document mask; FlexAttention with
the document block mask, compiled), or one document per row, left-padded to the longest
with ``padding_mask=``. Reported: real tokens (padding not counted) per second. The packed
and padded logits of every document agree (checked).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from _common import machine, timeit

from posenc.torch import ALiBi, RotaryEmbedding, TransformerLM

VOCAB, DIM, DEPTH, HEADS = 1000, 128, 2, 4


def documents(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(32, 513, (n,), generator=g).tolist()
    return [torch.randint(0, VOCAB, (m,), generator=g) for m in lengths]


def pack(docs, row):
    """Rows of ``row`` tokens filled greedily in order; the tail of a row is a padding doc."""
    rows, ids, cur, cur_ids, d = [], [], [], [], 0
    for doc in docs:
        if sum(len(t) for t in cur) + len(doc) > row:
            rows.append(cur)
            ids.append(cur_ids)
            cur, cur_ids = [], []
        cur.append(doc)
        cur_ids.append(torch.full((len(doc),), d))
        d += 1
    rows.append(cur)
    ids.append(cur_ids)
    tokens = torch.zeros(len(rows), row, dtype=torch.long)
    doc_ids = torch.zeros(len(rows), row, dtype=torch.long)
    for i, (r, k) in enumerate(zip(rows, ids, strict=True)):
        flat, flat_ids = torch.cat(r), torch.cat(k)
        tokens[i, : len(flat)] = flat
        doc_ids[i, : len(flat)] = flat_ids
        doc_ids[i, len(flat) :] = flat_ids[-1] + 1  # the row's tail: a document of its own
    return tokens, doc_ids


def pad(docs):
    longest = max(len(t) for t in docs)
    tokens = torch.zeros(len(docs), longest, dtype=torch.long)
    mask = torch.zeros(len(docs), longest, dtype=torch.bool)
    for i, doc in enumerate(docs):
        tokens[i, longest - len(doc) :] = doc  # left padding
        mask[i, longest - len(doc) :] = True
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    return tokens, mask, positions


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--row", type=int, default=2048)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    docs = documents()
    real = sum(len(t) for t in docs)
    packed, doc_ids = pack(docs, args.row)
    padded, mask, positions = pad(docs)
    results = []
    for name, enc in (
        ("rope", RotaryEmbedding(DIM // HEADS, max_len=4096)),
        ("alibi", ALiBi(HEADS)),
    ):
        torch.manual_seed(0)
        lm = TransformerLM(VOCAB, DIM, DEPTH, HEADS, encoding=enc).eval()
        flex = TransformerLM(VOCAB, DIM, DEPTH, HEADS, encoding=enc, backend="flex").eval()
        flex.load_state_dict(lm.state_dict())
        with torch.no_grad():
            a = lm(packed, documents=doc_ids)
            b = lm(padded, positions, mask)
            first = len(docs[0])  # the first document: row 0 of both
            torch.testing.assert_close(a[0, :first], b[0, -first:], rtol=1e-4, atol=1e-4)
            runs = {
                "packed, SDPA (document mask)": (lm, (packed,), {"documents": doc_ids}),
                "packed, FlexAttention (document block mask)": (
                    flex,
                    (packed,),
                    {"documents": doc_ids},
                ),
                "padded, SDPA (padding mask)": (lm, (padded, positions, mask), {}),
            }
            for label, (model, call, kw) in runs.items():
                ms = timeit(lambda m=model, c=call, k=kw: m(*c, **k), min_time=1.0, min_reps=3,
                            max_reps=20, warmup=2)  # fmt: skip
                results.append({"encoding": name, "run": label, "ms": round(ms, 2),
                                "tokens_per_s": round(real / ms * 1e3)})  # fmt: skip
                print(f"{name:6s} {label:46s} {ms:9.1f} ms  {real / ms * 1e3:10.0f} tok/s")
    out = {
        "machine": machine(), "documents": len(docs), "real_tokens": real,
        "packed_shape": list(packed.shape), "padded_shape": list(padded.shape),
        "model": {"vocab": VOCAB, "dim": DIM, "depth": DEPTH, "heads": HEADS},
        "results": results,
    }  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
