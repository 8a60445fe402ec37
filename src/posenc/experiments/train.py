"""Training and evaluation of a small TransformerLM on a task (one run of the study)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from posenc.experiments.tasks import IGNORE, vocab_size
from posenc.torch import TransformerLM

__all__ = ["Config", "make_model", "train", "evaluate"]


@dataclass(frozen=True)
class Config:
    """Model and budget of a run (the study's defaults; every field is a CLI option).

    Parameters
    ----------
    dim, depth, heads : int
        Model width, number of blocks, attention heads.
    steps, batch : int
        Optimiser steps and problems per step.
    lr : float
        Peak learning rate (AdamW).
    warmup : float
        Fraction of the steps of linear warm-up, then cosine decay to 0.
    train_min, train_max : int
        Training problem sizes are drawn uniformly from ``train_min .. train_max``.
    lengths : tuple of int
        Test problem sizes.
    eval_size : int
        Test problems per size.
    content : int
        Content tokens of the vocabulary.
    max_len : int
        Size of the position tables (absolute encodings, RoPE, xPos).
    device : str
        ``"cpu"`` or ``"cuda"``.
    """

    dim: int = 64
    depth: int = 2
    heads: int = 4
    steps: int = 2000
    batch: int = 64
    lr: float = 3e-3
    warmup: float = 0.05  # fraction of the steps, then cosine to 0
    train_min: int = 4  # problem size n ~ U[train_min, train_max]
    train_max: int = 16
    lengths: tuple = (16, 24, 32, 48, 64)  # test sizes
    eval_size: int = 512
    content: int = 64
    max_len: int = 256  # position tables of the absolute encodings and RoPE
    device: str = "cpu"

    def __post_init__(self):
        for name in ("dim", "depth", "heads", "steps", "batch", "eval_size", "content",
                     "max_len", "train_min", "train_max"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"dim must be a multiple of 2 * heads={2 * self.heads} (an even "
                             f"head dimension for the rotations), got {self.dim}")  # fmt: skip
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.warmup, (int, float)) and 0 <= self.warmup < 1):
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup!r}")
        if self.train_min < 2:  # lookback needs a token to look back to
            raise ValueError(f"train_min must be >= 2, got {self.train_min}")
        if self.train_min > self.train_max:
            raise ValueError(f"train_min must be <= train_max={self.train_max}, "
                             f"got {self.train_min}")  # fmt: skip
        lengths = tuple(self.lengths)
        if (not lengths or any(isinstance(n, bool) or not isinstance(n, int) for n in lengths)
                or list(lengths) != sorted(set(lengths)) or lengths[0] < 2):  # fmt: skip
            raise ValueError(f"lengths must be increasing ints >= 2, got {self.lengths!r}")
        if lengths[0] > self.train_max:
            raise ValueError(
                f"lengths must start in distribution (<= train_max="
                f"{self.train_max}: 'learned' is judged there), got {lengths}"
            )
        if not isinstance(self.device, str) or not (
            self.device == "cpu" or self.device.split(":")[0] == "cuda"
        ):
            raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {self.device!r}")
        object.__setattr__(self, "lengths", lengths)

    def as_dict(self):
        """The fields as JSON-friendly values (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def make_model(encoding, config: Config, *, vocab: int | None = None) -> TransformerLM:
    """A causal ``TransformerLM`` of the config's size around ``encoding``.

    Parameters
    ----------
    encoding : posenc.torch.PositionalEncoding
        The encoding.
    config : Config
        Model size and device.
    vocab : int, optional
        Vocabulary size; default the study's (specials and ``config.content`` tokens).

    Returns
    -------
    posenc.torch.TransformerLM
        On ``config.device``.
    """
    vocab = vocab_size(config.content) if vocab is None else vocab
    lm = TransformerLM(vocab, config.dim, config.depth, config.heads, encoding=encoding)
    return lm.to(config.device)


def _schedule(step, steps, warmup, kind):
    if kind == "constant":
        return 1.0
    w = max(1, int(warmup * steps))
    if step < w:
        return (step + 1) / w
    return 0.5 * (1 + math.cos(math.pi * (step - w) / max(1, steps - w)))


def train(lm, task, *, steps, batch=64, lr=3e-3, sizes=(4, 16), warmup=0.05, schedule="cosine",
          seed=0, device="cpu", progress=None):  # fmt: skip
    """Train ``lm`` on ``task`` with AdamW; problem sizes drawn uniformly from ``sizes``.

    Parameters
    ----------
    lm : TransformerLM
        The model (trained in place).
    task : Task
        Draws the batches.
    steps : int
        Optimiser steps.
    batch : int
        Problems per step (all of one size per step).
    lr : float
        Peak learning rate.
    sizes : tuple of int
        ``(low, high)``: ``n`` is drawn from ``low .. high`` each step; equal for a fixed size.
    warmup : float
        Fraction of the steps of linear warm-up (``schedule="cosine"``).
    schedule : {"cosine", "constant"}
        Learning-rate schedule after warm-up.
    seed : int
        Seeds the data stream.
    device : str
        Where the batches go.
    progress : callable, optional
        Called as ``progress(step, loss)`` after every step (a progress bar's update).

    Returns
    -------
    dict
        ``losses`` (one per step) and ``seconds``.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(lm.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _schedule(s, steps, warmup, schedule))
    lm.train()
    losses, start = [], time.perf_counter()
    for step in range(steps):
        n = int(torch.randint(sizes[0], sizes[1] + 1, (), generator=gen))
        x, y = (t.to(device) for t in task.batch(n, batch, gen))
        logits = lm(x)  # (batch, seq, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step, losses[-1])
    lm.eval()
    return {"losses": losses, "seconds": time.perf_counter() - start}


@torch.no_grad()
def evaluate(lm, task, sizes, *, size=512, batch=128, seed=10_000, device="cpu"):
    """Teacher-forced accuracy on fresh problems of each size (the same for every model).

    Parameters
    ----------
    lm : TransformerLM
        The model.
    task : Task
        Draws the problems.
    sizes : iterable of int
        Problem sizes ``n`` to test.
    size : int
        Problems per size.
    batch : int
        Problems per forward pass.
    seed : int
        The problems of size ``n`` come from seed ``seed + n``.
    device : str
        Where the batches go.

    Returns
    -------
    dict
        ``{n: {"exact": float, "token": float}}``: the fraction of problems with every scored
        token right, and of scored tokens right.
    """
    lm.eval()
    out = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(seed + n)
        exact = tokens = right = problems = 0
        for start in range(0, size, batch):
            x, y = task.batch(n, min(batch, size - start), gen)
            x, y = x.to(device), y.to(device)
            hit = (lm(x).argmax(-1) == y) | (y == IGNORE)  # (b, seq)
            scored = y != IGNORE
            exact += hit.all(1).sum().item()
            right += (hit & scored).sum().item()
            tokens += scored.sum().item()
            problems += x.shape[0]
        out[n] = {"exact": exact / problems, "token": right / tokens}
    return out
