"""Extending the text study's RoPE model to a target length, every method at that target.

The text study (:mod:`~posenc.experiments.text_study`) extends its trained RoPE model with
each method set for the length it is evaluated at, and fine-tunes at ``2 L`` only. Here
every method is set for one *target* ``T = m L`` (``m`` in :data:`TARGETS`), with the
factor that target needs, ``s = m``:

====================  ==========================================================
``rope``              nothing changed (the trained model as it is)
``pi``                position interpolation, :class:`~posenc.scaling.Linear` ``(s)``
``ntk``               :class:`~posenc.scaling.NTK` ``(s)``: the base raised to
                      ``b s^(d / (d - 2))``, so it is also the raised base matched to ``T``
``dynamic``           :class:`~posenc.scaling.DynamicNTK` ``(1, L)``: NTK at each length
``yarn``              :class:`~posenc.scaling.YaRN` ``(s, L)``
``llama3``            :class:`~posenc.scaling.Llama3` ``(s, 1, 4, L)``
``codellama``         the base raised to ``raised_base`` (1e6, Code Llama's), whatever ``T``
====================  ==========================================================

Each is evaluated as it is and after the same short training at ``T``:
``finetune_steps`` AdamW steps at ``finetune_lr`` of ``2 L * batch`` bytes each (the bytes
per step of the study's ``rope+ft``: ``batch * 2 / m`` rows of ``T``), paired by seed.
A row holds the loss per byte at ``L`` and at ``T``, the loss by position in the windows
of ``T`` (:func:`position_loss`, in ``bins`` equal bins), what the text beyond ``L`` is
worth to the model (:func:`context_gain`) and passkey retrieval at ``T``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from posenc.experiments.text_data import corpus, eval_windows
from posenc.experiments.text_study import (
    _fit,
    _Text,
    make_text_model,
    passkey_accuracy,
    perplexity,
)
from posenc.experiments.train import train
from posenc.scaling import NTK, DynamicNTK, Linear, Llama3, YaRN
from posenc.torch import RotaryEmbedding

__all__ = ["TARGETS", "METHODS", "BINS", "extend_names", "position_loss", "context_gain",
           "run_extend_job"]  # fmt: skip

TARGETS = (4, 8)  # target lengths, as multiples of the training length L
BINS = 32  # the loss by position: equal bins of the target window

# name -> RotaryEmbedding keywords for a factor s, trained length L and raised base
METHODS = {
    "rope": lambda s, L, b: {},
    "pi": lambda s, L, b: {"scaling": Linear(s)},
    "ntk": lambda s, L, b: {"scaling": NTK(s)},
    "dynamic": lambda s, L, b: {"scaling": DynamicNTK(1.0, L)},
    "yarn": lambda s, L, b: {"scaling": YaRN(s, L)},
    "llama3": lambda s, L, b: {"scaling": Llama3(s, 1.0, 4.0, L)},
    "codellama": lambda s, L, b: {"base": b},
}


def extend_names() -> list[str]:
    """The result names of one seed: the trained model, then each method, target and budget.

    Examples
    --------
    >>> extend_names()[:3]
    ['rope', 'rope@4', 'rope+ft@4']
    >>> len(extend_names())
    29
    """
    return ["rope", *(f"{m}{ft}@{t}" for t in TARGETS for m in METHODS for ft in ("", "+ft"))]


@torch.no_grad()
def position_loss(lm, n, total, *, batch=16) -> np.ndarray:
    """Mean loss (nats) of the byte predicted at each position of windows of ``n`` bytes.

    The first ``total`` held-out bytes are cut into windows of ``n``
    (``text_data.eval_windows``); entry ``p`` is the mean loss of
    predicting byte ``p + 1`` of a window from bytes ``0 .. p``. Its mean is the loss per
    byte of ``text_study.perplexity`` at ``n``.

    Parameters
    ----------
    lm : TransformerLM
        The model.
    n : int
        Window length in bytes.
    total : int
        Held-out bytes scored (a multiple of ``n``).
    batch : int
        Windows per forward pass.

    Returns
    -------
    numpy.ndarray
        Float64 ``(n,)``.
    """
    lm.eval()
    rows, nll = eval_windows(corpus("eval"), n, total), torch.zeros(n, dtype=torch.float64)
    for i in range(0, len(rows), batch):
        t = rows[i : i + batch]  # (b, n + 1)
        logits = lm(t[:, :-1])  # (b, n, vocab)
        loss = F.cross_entropy(logits.transpose(1, 2), t[:, 1:], reduction="none")  # (b, n)
        nll += loss.double().sum(0)
    return (nll / len(rows)).numpy()


def _rope(config, **kw):  # the study's RoPE, for positions up to the longest target
    return RotaryEmbedding(config.head_dim, max_len=max(TARGETS) * config.length, **kw)


@torch.no_grad()
def context_gain(lm, n, L, total, *, batch=16) -> float:
    """How much the text beyond ``L`` bytes helps: the loss on the last ``L / 2`` bytes of each
    window of ``n`` bytes, minus the loss on the same bytes predicted within a window of
    ``L`` bytes that ends with them (``L / 2`` to ``L`` bytes of context instead of
    ``n - L / 2`` to ``n``; mean nats; negative: the longer context is used).

    The two losses are of the same model on the same bytes (the last ``L + 1`` bytes of
    each window of ``text_data.eval_windows`` at ``n`` form the
    window of ``L``), so the difference is the longer context's alone, not the text's.

    Parameters
    ----------
    lm : TransformerLM
        The model.
    n, L : int
        The long window and the short one (``L <= n``, both even).
    total : int
        Held-out bytes (a multiple of ``n``).
    batch : int
        Windows per forward pass.

    Returns
    -------
    float
        Nats per byte.
    """
    lm.eval()
    rows, half = eval_windows(corpus("eval"), n, total), L // 2
    long_nll = short_nll = 0.0
    for i in range(0, len(rows), batch):
        t = rows[i : i + batch]  # (b, n + 1)
        for window, out in ((t, "long"), (t[:, n - L :], "short")):  # (b, n + 1), (b, L + 1)
            logits = lm(window[:, :-1])[:, -half:]  # (b, L / 2, vocab): the same bytes
            nll = F.cross_entropy(logits.transpose(1, 2), window[:, -half:], reduction="sum")
            if out == "long":
                long_nll += nll.item()
            else:
                short_nll += nll.item()
    return (long_nll - short_nll) / (len(rows) * half)


def _extend(lm, config, method, m):
    """``lm``'s weights with RoPE set for the target ``m * L`` by ``method``."""
    rope = _rope(config, **METHODS[method](float(m), config.length, config.raised_base))
    new = make_text_model(rope, config)
    new.load_state_dict(lm.state_dict())  # same weights, new rotations
    return new


def _measure(lm, config, m):
    L, T = config.length, m * config.length
    by_pos = position_loss(lm, T, config.eval_bytes)  # (T,)
    return {
        "loss": {str(L): perplexity(lm, [L], config.eval_bytes)[L], str(T): float(by_pos.mean())},
        "by_position": by_pos.reshape(BINS, T // BINS).mean(1).tolist(),  # (BINS,)
        "passkey": {str(T): passkey_accuracy(lm, [T], config.trials)[T]},
        "context_gain": context_gain(lm, T, L, config.eval_bytes),
    }


def _check(config):
    for m in TARGETS:
        T = m * config.length
        if T % BINS or config.eval_bytes % T or (2 * config.batch) % m:
            raise ValueError(
                f"the target {m} L = {T} needs a multiple of {BINS} that divides eval_bytes="
                f"{config.eval_bytes}, and batch={config.batch} with 2 * batch divisible by {m}"
            )


def run_extend_job(encoding, seed, config, progress=None) -> list[dict]:
    """Train the study's RoPE model with ``seed``; extend it to each target, every method.

    Parameters
    ----------
    encoding : str
        ``"rope"`` (the only model this study extends).
    seed : int
        Seeds the weights and the data, as in the text study.
    config : TextConfig
        The text study's config (``length``, budgets, ``raised_base``...).
    progress : callable, optional
        Passed to the training of the RoPE model.

    Returns
    -------
    list of dict
        One row per name of ``extend_names()``: ``encoding`` (the name), ``target``
        (``m``, 1 for the trained model), ``loss``, ``by_position`` (``BINS`` means, the
        trained model's at ``L``), ``passkey``, ``context_gain`` (not for the trained model),
        ``final_loss`` and ``seconds``; the trained
        ones (``+ft``) their ``budget`` (``steps``, ``rows`` of ``length`` bytes, ``lr``).
    """
    if encoding != "rope":
        raise ValueError(f"encoding must be 'rope' (the model the study extends), got {encoding!r}")
    _check(config)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    lm = make_text_model(_rope(config), config)
    fit = _fit(lm, config, steps=config.steps, lr=config.lr, n=config.length, seed=seed,
               progress=progress)  # fmt: skip
    L = config.length
    by_pos = position_loss(lm, L, config.eval_bytes)
    rows = [{"encoding": "rope", "target": 1, **fit, "loss": {str(L): float(by_pos.mean())},
             "by_position": by_pos.reshape(BINS, L // BINS).mean(1).tolist(),
             "passkey": {str(L): passkey_accuracy(lm, [L], config.trials)[L]}}]  # fmt: skip
    for m in TARGETS:
        for method in METHODS:
            start = time.perf_counter()
            extended = _extend(lm, config, method, m)
            rows.append({"encoding": f"{method}@{m}", "target": m, "final_loss": fit["final_loss"],
                         **_measure(extended, config, m),
                         "seconds": time.perf_counter() - start})  # fmt: skip
            torch.manual_seed(seed)
            tuned = _extend(lm, config, method, m)
            budget = {"steps": config.finetune_steps, "rows": 2 * config.batch // m,
                      "length": m * L, "lr": config.finetune_lr}  # fmt: skip
            log = train(tuned, _Text(config.passkeys), steps=budget["steps"], batch=budget["rows"],
                        lr=budget["lr"], sizes=(m * L, m * L), warmup=config.warmup,
                        seed=seed + 1_000_000)  # fmt: skip
            tail = log["losses"][-50:]
            rows.append({"encoding": f"{method}+ft@{m}", "target": m, "budget": budget,
                         "final_loss": sum(tail) / len(tail), **_measure(tuned, config, m),
                         "seconds": log["seconds"]})  # fmt: skip
    return rows
