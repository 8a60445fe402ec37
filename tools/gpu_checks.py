"""The checks that need a GPU, in one short run: syncs of a decode step, CUDA graphs, asserts.

For a depth-4 ``TransformerLM`` in bfloat16 on CUDA with ``new_cache(static=True)``, per
encoding:

* ``eager_syncs``: synchronising CUDA calls in one eager decode step (CUDA's sync debug
  mode, ``"warn"``: each one is a warning);
* ``compiled_syncs``: the same for a ``torch.compile(fullgraph=True)`` decode step (0 lets
  it be captured as a CUDA graph);
* ``graphs_*``: greedy decoding with ``mode="reduce-overhead"`` (CUDA graphs) gives the
  tokens of the compiled default mode (and those of eager decoding, up to bf16 ties), and
  no graph was skipped;
* ``device_assert``: a compiled step past the static cache stops with posenc's words (a
  device-side assert, in its own process: it ends the CUDA context).

``python tools/gpu_checks.py [--out PATH]`` prints one JSON row per check.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback
import warnings

import torch

from posenc.torch import (
    ALiBi,
    MRoPE,
    PoPE,
    RotaryEmbedding,
    SinusoidalEncoding,
    T5RelativeBias,
    TransformerLM,
    XPos,
)

DIM, HEADS, VOCAB = 256, 8, 1000
ENCODINGS = {
    "rope": lambda: RotaryEmbedding(DIM // HEADS, max_len=512),
    "xpos": lambda: XPos(DIM // HEADS, max_len=512),
    "mrope": lambda: MRoPE(DIM // HEADS, sections=(6, 5, 5), max_len=512),
    "pope": lambda: PoPE(DIM // HEADS, HEADS),
    "alibi": lambda: ALiBi(HEADS),
    "t5": lambda: T5RelativeBias(HEADS),
    "sinusoidal": lambda: SinusoidalEncoding(DIM, max_len=512),
}
COMPILED = ("rope", "alibi", "mrope")  # compiles cost ~30 s each: a representative few


def _lm(name):
    torch.manual_seed(0)
    enc = ENCODINGS[name]()
    lm = TransformerLM(VOCAB, DIM, 4, HEADS, encoding=enc, max_len=512)
    return lm.to("cuda", torch.bfloat16).eval()


WHERE = []  # where each synchronising call came from (the Python stack)


def _syncs(fn):
    """Synchronising CUDA calls made by ``fn()`` (sync debug mode "warn"), with their stacks."""
    torch.cuda.synchronize()
    shown = warnings.showwarning

    def note(message, *args, **kwargs):
        if "synchroniz" in str(message):
            WHERE.append("".join(traceback.format_stack(limit=12)[:-2]))

    warnings.showwarning = note
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            before = len(WHERE)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            return len(WHERE) - before
    finally:
        warnings.showwarning = shown


def _greedy(step, cache, prompt, new):
    cache.reset()
    logits = step(prompt, cache=cache)
    toks = [logits[:, -1:].argmax(-1)]
    for _ in range(new - 1):
        toks.append(step(toks[-1], cache=cache)[:, -1:].argmax(-1))
    return torch.cat(toks, 1)


def check(name, compiled=True):
    lm = _lm(name)
    torch.manual_seed(1)
    prompt = torch.randint(0, VOCAB, (2, 16), device="cuda")
    row = {"encoding": name}
    with torch.no_grad():
        cache = lm.new_cache(2, 64, static=True)
        logits = lm(prompt, cache=cache)
        nxt = logits[:, -1:].argmax(-1)
        lm(nxt, cache=cache)  # warm
        row["eager_syncs"] = _syncs(lambda: lm(nxt, cache=cache))
        eager = _greedy(lm, cache, prompt, 24)
        if compiled and name in COMPILED:
            torch._dynamo.reset()
            step = torch.compile(lm, fullgraph=True)
            compiled = _greedy(step, cache, prompt, 24)  # compiles prefill and decode
            row["compiled_syncs"] = _syncs(lambda: step(nxt, cache=cache))
            torch._dynamo.reset()
            graphed = torch.compile(lm, fullgraph=True, mode="reduce-overhead")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                toks = _greedy(graphed, cache, prompt, 24)
                toks = _greedy(graphed, cache, prompt, 24)  # replayed
            said = [str(w.message)[:200] for w in caught]
            row["graphs_skipped"] = [m for m in said if "skipping cudagraphs" in m]
            row["graphs_same_tokens_as_compiled"] = bool(torch.equal(toks, compiled))
            row["compiled_same_tokens_as_eager"] = bool(torch.equal(compiled, eager))
    return row


ASSERT = """
import torch
from posenc.torch import RotaryEmbedding, TransformerLM
lm = TransformerLM(50, 64, 1, 2, encoding=RotaryEmbedding(32, max_len=64), max_len=8)
lm = lm.cuda().eval()
cache = lm.new_cache(1, 8, static=True)
step = torch.compile(lm, fullgraph=True)
with torch.no_grad():
    logits = step(torch.tensor([[1, 2, 3, 4, 5]], device="cuda"), cache=cache)
    for _ in range(4):  # the 4th step is past the 8 slots
        logits = step(logits[:, -1:].argmax(-1), cache=cache)
    torch.cuda.synchronize()
print("no error")
"""


def device_assert():
    run = subprocess.run([sys.executable, "-c", ASSERT], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    tail = (run.stdout + run.stderr)[-2000:]
    return {"check": "compiled step past a static cache", "returncode": run.returncode,
            "posenc_words": "cache slots must be" in tail,
            "tail": tail[-600:]}  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--no-compile", action="store_true", help="eager checks only")
    args = parser.parse_args(argv)
    rows = [{"device": torch.cuda.get_device_name(), "torch": torch.__version__}]
    for i, name in enumerate([*ENCODINGS, "rope"]):  # RoPE again last: a first use shows once
        try:
            rows.append(check(name, compiled=not args.no_compile and i < len(ENCODINGS)))
        except Exception as err:  # one failing encoding must not hide the others
            rows.append({"encoding": name, "error": f"{type(err).__name__}: {err}"[-600:]})
        print(json.dumps(rows[-1]), flush=True)
    rows.append({"sync_stacks": WHERE[:4]})
    print(*WHERE[:4], sep="\n----\n", flush=True)
    rows.append(device_assert())
    print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
