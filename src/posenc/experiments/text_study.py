"""The text study: byte-level language models on Python source, evaluated past their length.

Every encoding trains the same model (width 128, 4 layers, 2 heads of 64) on windows of
``length`` bytes of the standard library (:mod:`~posenc.experiments.text_data`) and is
evaluated on held-out modules at 1, 2, 4 and 8 times that length: the loss per byte
(perplexity against length, the figure of Press et al.) and passkey retrieval. The
trained RoPE model is also extended the ways practitioners extend one: a scaling at
inference (``rope+pi`` ...), or the same scaling at twice the length followed by a short
training there (``rope+pi+ft`` ...; ``rope+ft`` fine-tunes without one).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from posenc.experiments.text_data import DIGITS, VOCAB, corpus, passkey_batch, train_batch
from posenc.experiments.train import train
from posenc.scaling import NTK, DynamicNTK, Linear, Llama3, YaRN
from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    Layer,
    LearnedEncoding,
    NoPE,
    PoPE,
    RotaryEmbedding,
    Schedule,
    SinusoidalEncoding,
    T5RelativeBias,
    TransformerLM,
    XPos,
)

__all__ = ["TextConfig", "TEXT_ENCODINGS", "EXTENSIONS", "make_text_model", "perplexity",
           "passkey_accuracy", "PASSKEY_SEED", "run_text_job", "result_names"]  # fmt: skip


@dataclass(frozen=True)
class TextConfig:
    """Model, budget and evaluation of the text study (every field a CLI option).

    Parameters
    ----------
    dim, depth, heads : int
        Model width, blocks, heads (``dim // heads`` is the head width, >= 64).
    length : int
        Training length ``L`` in bytes; evaluation at ``L * m`` for ``m`` in ``multiples``.
    steps, batch, lr, warmup : int, int, float, float
        Training: AdamW steps, rows per step, peak rate, warm-up fraction (then cosine).
    passkeys : float
        Fraction of training rows that hold a passkey.
    multiples : tuple of int
        Evaluation lengths as multiples of ``length``.
    eval_bytes : int
        Held-out bytes scored at each length (the same text, cut into windows).
    trials : int
        Passkey rows per length.
    finetune_steps, finetune_lr : int, float
        The short training at ``2 L`` of the extended RoPE models.
    raised_base : float
        The RoPE base of the ``rope+base`` extension.
    """

    dim: int = 128
    depth: int = 4
    heads: int = 2
    length: int = 128
    steps: int = 1200
    batch: int = 16
    lr: float = 2e-3
    warmup: float = 0.05
    passkeys: float = 1.0
    multiples: tuple = (1, 2, 4, 8)
    eval_bytes: int = 32768
    trials: int = 64
    finetune_steps: int = 100
    finetune_lr: float = 5e-4
    raised_base: float = 1e6

    def __post_init__(self):
        for name in ("dim", "depth", "heads", "length", "steps", "batch", "eval_bytes",
                     "trials", "finetune_steps"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.dim % self.heads or (self.dim // self.heads) % 8:
            raise ValueError(
                f"dim must be a multiple of 8 * heads={8 * self.heads}, got {self.dim}"
            )
        multiples = tuple(self.multiples)
        if not multiples or multiples[0] != 1 or list(multiples) != sorted(set(multiples)):
            raise ValueError(f"multiples must be increasing and start at 1, got {self.multiples}")
        if self.eval_bytes % (self.length * multiples[-1]):
            raise ValueError(f"eval_bytes must be a multiple of the longest length "
                             f"{self.length * multiples[-1]}, got {self.eval_bytes}")  # fmt: skip
        if not 0 <= self.passkeys <= 1:
            raise ValueError(f"passkeys must be a fraction in [0, 1], got {self.passkeys!r}")
        object.__setattr__(self, "multiples", multiples)

    @property
    def lengths(self) -> tuple:
        return tuple(self.length * m for m in self.multiples)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def as_dict(self):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def _rope(c, **kw):
    return RotaryEmbedding(c.head_dim, max_len=c.lengths[-1], **kw)


def _nope_every_4th(c):  # Llama 4, SmolLM3: RoPE in three layers of four, none in the fourth
    rope = _rope(c)
    return Schedule([Layer(None if (i + 1) % 4 == 0 else rope) for i in range(c.depth)])


# name -> factory(config): a PositionalEncoding or a Schedule
TEXT_ENCODINGS = {
    "nope": lambda c: NoPE(),
    "sinusoidal": lambda c: SinusoidalEncoding(c.dim, max_len=c.lengths[-1]),
    "learned": lambda c: LearnedEncoding(c.lengths[-1], c.dim),
    "rope": _rope,
    "xpos": lambda c: XPos(c.head_dim, max_len=c.lengths[-1]),
    "alibi": lambda c: ALiBi(c.heads),
    "t5": lambda c: T5RelativeBias(c.heads),
    "kerple": lambda c: KERPLE(c.heads),
    "fire": lambda c: FIRE(c.heads),
    "pope": lambda c: PoPE(c.head_dim, c.heads),
    "nope_every_4th": _nope_every_4th,
    "rope_quarter": lambda c: _rope(c, rotary_dim=c.head_dim // 4),  # GPT-NeoX's 25 %
}

# RoPE extensions: name -> scaling(factor s, trained length L), or a base; "+ft" trains on
EXTENSIONS = {
    "pi": lambda s, L: {"scaling": Linear(s)},
    "ntk": lambda s, L: {"scaling": NTK(s)},
    "dynamic": lambda s, L: {"scaling": DynamicNTK(1.0, L)},
    "yarn": lambda s, L: {"scaling": YaRN(s, L)},
    "llama3": lambda s, L: {"scaling": Llama3(s, 1.0, 4.0, L)},
    "base": None,  # the raised base of the config
}


def result_names(encoding):
    """Every result a job of ``encoding`` writes (RoPE's: its extensions too)."""
    if encoding != "rope":
        return [encoding]
    return ["rope", *(f"rope+{e}" for e in EXTENSIONS), "rope+ft",
            *(f"rope+{e}+ft" for e in EXTENSIONS)]  # fmt: skip


def make_text_model(position, config: TextConfig) -> TransformerLM:
    """The study's byte-level model around an encoding or a :class:`Schedule`."""
    kw = {"schedule": position} if isinstance(position, Schedule) else {"encoding": position}
    return TransformerLM(VOCAB, config.dim, config.depth, config.heads, **kw)


def _extended(lm, config, name, s):
    """``lm``'s weights with RoPE extended by ``name`` (``None``: plain) for a length ratio
    ``s`` (a scaling of factor 1 is plain RoPE)."""
    if name == "base":
        rope = _rope(config, base=config.raised_base)
    elif name is not None and (s > 1 or name == "dynamic"):
        rope = _rope(config, **EXTENSIONS[name](s, config.length))
    else:
        rope = _rope(config)
    new = make_text_model(rope, config)
    new.load_state_dict(lm.state_dict())  # same weights, new rotations
    return new


@torch.no_grad()
def perplexity(lm, lengths, total, *, batch=16) -> dict:
    """Mean loss per byte (nats) on the first ``total`` held-out bytes at each length."""
    from posenc.experiments.text_data import eval_windows

    lm.eval()
    out, data = {}, corpus("eval")
    for n in lengths:
        rows, nll = eval_windows(data, n, total), 0.0
        for i in range(0, len(rows), batch):
            t = rows[i : i + batch]  # (b, n + 1)
            logits = lm(t[:, :-1])  # (b, n, vocab)
            nll += F.cross_entropy(logits.flatten(0, 1), t[:, 1:].flatten(), reduction="sum").item()
        out[n] = nll / total
    return out


PASSKEY_SEED = 20_000  # the held-out passkey rows at length n come from seed PASSKEY_SEED + n


@torch.no_grad()
def passkey_accuracy(lm, lengths, trials, *, seed=PASSKEY_SEED, batch=16) -> dict:
    """Fraction of passkeys whose five digits are all predicted (teacher forced), per length."""
    lm.eval()
    out = {}
    for n in lengths:
        x, y = passkey_batch(corpus("eval"), n, trials, seed + n)  # (trials, n)
        right = 0
        for i in range(0, trials, batch):
            logits = lm(x[i : i + batch])[:, -DIGITS:]  # (b, DIGITS, vocab)
            right += (logits.argmax(-1) == y[i : i + batch, -DIGITS:]).all(1).sum().item()
        out[n] = right / trials
    return out


class _Text:  # the training data as the grid's trainer asks for it
    def __init__(self, passkeys):
        self.passkeys = passkeys

    def batch(self, n, batch, gen):
        return train_batch(corpus("train"), n, batch, gen, passkeys=self.passkeys)


def _evaluate(lm, config):
    loss = perplexity(lm, config.lengths, config.eval_bytes)
    found = passkey_accuracy(lm, config.lengths, config.trials)
    return {"loss": {str(n): v for n, v in loss.items()},
            "passkey": {str(n): v for n, v in found.items()}}  # fmt: skip


def _fit(lm, config, *, steps, lr, n, seed, progress):
    log = train(lm, _Text(config.passkeys), steps=steps, batch=config.batch, lr=lr, sizes=(n, n),
                warmup=config.warmup, seed=seed, progress=progress)  # fmt: skip
    tail = log["losses"][-50:]
    return {"final_loss": sum(tail) / len(tail), "seconds": log["seconds"]}


def run_text_job(encoding, seed, config: TextConfig, progress=None) -> list[dict]:
    """Train ``encoding`` with ``seed``, evaluate it (and RoPE's extensions); one row per result.

    Rows hold ``loss`` (nats per byte) and ``passkey`` (accuracy), each keyed by length, the
    final training loss (mean of the last 50 steps) and the seconds spent.
    """
    if encoding not in TEXT_ENCODINGS:
        raise ValueError(f"encoding must be one of {sorted(TEXT_ENCODINGS)}, got {encoding!r}")
    torch.set_num_threads(1)  # models this small train fastest on one thread per process
    torch.manual_seed(seed)
    lm = make_text_model(TEXT_ENCODINGS[encoding](config), config)
    fit = _fit(lm, config, steps=config.steps, lr=config.lr, n=config.length, seed=seed,
               progress=progress)  # fmt: skip
    rows = [{"encoding": encoding, **fit, **_evaluate(lm, config)}]
    if encoding == "rope":
        L = config.length
        for name in EXTENSIONS:  # at inference: the factor of each evaluation length
            start, res = time.perf_counter(), {"loss": {}, "passkey": {}}
            for n in config.lengths:
                one = _evaluate_at(_extended(lm, config, name, n / L), config, n)
                for k in res:
                    res[k].update(one[k])
            rows.append({"encoding": f"rope+{name}", "seconds": time.perf_counter() - start,
                         "final_loss": fit["final_loss"], **res})  # fmt: skip
        for name in (None, *EXTENSIONS):  # a short training at 2 L, then every length
            torch.manual_seed(seed)
            tuned = _extended(lm, config, name, 2.0)
            ft = _fit(tuned, config, steps=config.finetune_steps, lr=config.finetune_lr,
                      n=2 * L, seed=seed + 1_000_000, progress=None)  # fmt: skip
            label = "rope+ft" if name is None else f"rope+{name}+ft"
            rows.append({"encoding": label, **ft, **_evaluate(tuned, config)})
    return rows


def _evaluate_at(lm, config, n):
    return {
        "loss": {str(n): perplexity(lm, [n], config.eval_bytes)[n]},
        "passkey": {str(n): passkey_accuracy(lm, [n], config.trials)[n]},
    }


def nats_to_ppl(loss) -> float:
    """Perplexity per byte of a mean loss in nats."""
    return math.exp(loss)
