"""Part 8's study: the position schedules of today's models on the text study's harness.

The same byte-level model, data, budget and evaluation as the text study
(:mod:`~posenc.experiments.text_study`: width 128, 4 layers, 2 heads of 64, trained at
``L = 128`` bytes, scored at 1, 2, 4 and 8 times that), with the schemes of today's
models scaled to it:

=======================  ===============================================================
``rope``                 RoPE in every layer (the baseline of every comparison)
``nope_every_4th``       SmolLM3: the fourth layer has no position
``nope_every_4th+temp``  Llama 4: the same, the NoPE layer's queries scaled by its
                         temperature
                         ``1 + 0.1 ln(1 + floor((p + 1) / f))``, ``f = L / 32`` (Llama 4's
                         ``floor_scale`` 8192 is 1/32 of its 256K training context)
``local_global``         Gemma 3: three sliding-window layers (window ``L / 4``, base
                         1e4), then a global one (base 1e6)
``p_rope``               p-RoPE (Barbero et al. 2024): the 75 % fastest pairs rotate,
                         the slowest 25 % do not (``Proportional(0.75)``)
``proportional``         Gemma 4's global layers: a quarter of the pairs rotate, at the
                         rates of the whole head (``Proportional(0.25)``)
``rope_quarter``         GPT-NeoX: a quarter of the head rotates, at rates spread over
                         that quarter (``rotary_dim = head_dim / 4``)
``rope+sinks``           RoPE and GPT-OSS's learned sink logit in every layer
=======================  ===============================================================

``rope``, ``nope_every_4th`` and ``rope_quarter`` are also in the text study; they are
trained again here so that every comparison pairs rows of one commit (the text study's
were trained at an earlier commit, on another machine: their ``rope`` differs from this
one's by up to 0.02 nats).

The two RoPE models are also decoded past their window with an evicting cache
(:func:`stream_losses`): each 1,024-byte held-out stream is read with ``L`` tokens of
cache at most, with and without 4 sink tokens, each in both position conventions, beside
a full forward (``dense``) and the window recomputed at every byte (``recompute``).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from posenc.experiments.text_data import corpus, eval_windows
from posenc.experiments.text_study import _evaluate, _fit, _nope_every_4th, make_text_model
from posenc.scaling import Proportional
from posenc.torch import Layer, QueryTemperature, RotaryEmbedding, Schedule, evicting_cache

__all__ = ["TODAY_ENCODINGS", "STREAMS", "SINK_TOKENS", "today_jobs", "today_names",
           "stream_losses", "run_today_job"]  # fmt: skip

SINK_TOKENS = 4  # StreamingLLM's number of sink tokens


def _rope(c, **kw):
    return RotaryEmbedding(c.head_dim, max_len=c.lengths[-1], **kw)


def _every(c, make):  # one scheme per layer: make(i) -> Layer
    return Schedule([make(i) for i in range(c.depth)])


def _nope_4th_temperature(c):
    rope, nope = _rope(c), QueryTemperature(scale=0.1, floor=c.length / 32, shift=1)
    return _every(c, lambda i: Layer(nope if (i + 1) % 4 == 0 else rope))


def _local_global(c):
    local, far = _rope(c, base=1e4), _rope(c, base=1e6)
    return _every(c, lambda i: Layer(far) if (i + 1) % 4 == 0 else Layer(local, window=c.length // 4))


# name -> factory(config): a PositionalEncoding or a Schedule
TODAY_ENCODINGS = {
    "rope": _rope,
    "nope_every_4th": _nope_every_4th,
    "nope_every_4th+temp": _nope_4th_temperature,
    "local_global": _local_global,
    "p_rope": lambda c: _rope(c, scaling=Proportional(0.75)),
    "proportional": lambda c: _rope(c, scaling=Proportional(0.25)),
    "rope_quarter": lambda c: _rope(c, rotary_dim=c.head_dim // 4),
    "rope+sinks": lambda c: _rope_sinks(c),
}


def _rope_sinks(c):  # one RoPE for every layer, each with its learned sink logits
    rope = _rope(c)
    return _every(c, lambda i: Layer(rope, sinks=True))


# stream -> (sink tokens, position convention); "dense" and "recompute" are references
STREAMS = {"window": (0, "cache"), "sinks": (SINK_TOKENS, "cache"),
           "window/original": (0, "original"), "sinks/original": (SINK_TOKENS, "original")}  # fmt: skip
STREAMED = ("rope", "rope+sinks")  # the models decoded past their window


def today_names(encoding) -> list[str]:
    """The result names of one job: the model, then (RoPE's two) each way of streaming.

    Examples
    --------
    >>> today_names("p_rope")
    ['p_rope']
    >>> today_names("rope")[:3]
    ['rope', 'rope:dense', 'rope:recompute']
    """
    if encoding not in STREAMED:
        return [encoding]
    return [encoding, f"{encoding}:dense", f"{encoding}:recompute",
            *(f"{encoding}:{s}" for s in STREAMS)]  # fmt: skip


def today_jobs(seeds) -> list[tuple]:
    """``(encoding, seed)`` jobs, seed by seed, the streamed RoPE models first.

    Examples
    --------
    >>> today_jobs([0])[:3]
    [('rope', 0), ('rope+sinks', 0), ('nope_every_4th', 0)]
    """
    order = sorted(TODAY_ENCODINGS, key=lambda e: e not in STREAMED)
    return [(e, s) for s in seeds for e in order]


@torch.no_grad()
def stream_losses(lm, config, *, rows=16) -> dict:
    """Loss of ``lm`` on ``rows`` held-out streams of ``8 L`` bytes, read every way.

    Returns ``{way: (n,) tensor}``, the mean loss (nats) of the byte after each position:
    ``dense`` (one forward over the stream), ``recompute`` (each byte from the ``L`` bytes
    up to it, computed afresh), and each of :data:`STREAMS` (an evicting cache of ``L``
    tokens: prefill ``L``, then one byte per step).
    """
    lm.eval()
    L, n = config.length, config.lengths[-1]
    t = eval_windows(corpus("eval"), n, n * rows)  # (rows, n + 1)
    target = t[:, 1:]  # (rows, n)

    def nll(logits):  # (rows, n, vocab) -> (n,)
        return F.cross_entropy(logits.transpose(1, 2), target, reduction="none").mean(0)

    out = {"dense": nll(lm(t[:, :n]))}
    windows = t[:, :n].unfold(1, L, 1)  # (rows, n - L + 1, L): the L bytes up to each
    last = torch.cat([lm(w)[:, -1:] for w in windows.unbind(1)], 1)  # (rows, n - L + 1, vocab)
    out["recompute"] = nll(torch.cat([lm(t[:, : L - 1]), last], 1))
    for way, (sinks, convention) in STREAMS.items():
        cache = evicting_cache(lm, rows, sink_tokens=sinks, window=L - sinks,
                               positions=convention)  # fmt: skip
        steps = [lm(t[:, :L], cache=cache)]  # (rows, L, vocab)
        steps += [lm(t[:, i : i + 1], cache=cache) for i in range(L, n)]
        out[way] = nll(torch.cat(steps, 1))
    return out


def run_today_job(encoding, seed, config) -> list[dict]:
    """Train ``encoding`` with ``seed`` as the text study does, evaluate it; stream RoPE's.

    A streamed model gives one more row per way of reading (:func:`stream_losses`): its
    ``loss`` at ``8 L`` is the mean over the bytes past the first ``L`` (where the cache
    evicts), and ``by_position`` the loss in 16 equal bins of the stream.
    """
    if encoding not in TODAY_ENCODINGS:
        raise ValueError(f"encoding must be one of {sorted(TODAY_ENCODINGS)}, got {encoding!r}")
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    lm = make_text_model(TODAY_ENCODINGS[encoding](config), config)
    fit = _fit(lm, config, steps=config.steps, lr=config.lr, n=config.length, seed=seed,
               progress=None)  # fmt: skip
    rows = [{"encoding": encoding, **fit, **_evaluate(lm, config)}]
    if encoding in STREAMED:
        start = time.perf_counter()
        losses = stream_losses(lm, config)
        spent = time.perf_counter() - start
        L, n = config.length, config.lengths[-1]
        for way, per in losses.items():
            rows.append({"encoding": f"{encoding}:{way}", "final_loss": fit["final_loss"],
                         "seconds": spent, "loss": {str(n): float(per[L:].mean())},
                         "by_position": [float(b.mean()) for b in per.chunk(16)]})  # fmt: skip
    return rows
