"""Passkey retrieval in the text study: when a model learns it, where its queries look.

In the text study ALiBi, KERPLE and sinusoidal models learn to retrieve the passkey in most
seeds and RoPE models in none, although RoPE's loss is the lowest. This study follows the
retrieval through training for RoPE, ALiBi and NoPE with 1, 2 and 4 times the study's
steps (the cosine schedule stretched over each budget), and trains an independent model
on the same batches: Hugging Face's ``LlamaForCausalLM`` of the same size (RoPE, base
10,000, head width 64), to tell a property of the setup from a fault of posenc.

A row holds, besides the text study's loss and passkey accuracy per length:

* ``trace``: every ``steps / 24`` steps, the mean loss on the five digits of the held-out
  passkey rows at ``L`` (nats; ``ln 10 = 2.303`` is a model that knows a digit comes but
  not which) and the fraction of rows whose five digits are all predicted;
* ``copy_attention`` (posenc models): per layer and head, the mean attention weight that
  the query predicting each digit puts on that digit in the hidden line, the key to copy.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posenc.experiments.text_data import DIGITS, NEEDLE, VOCAB, corpus, passkey_batch
from posenc.experiments.text_study import (
    PASSKEY_SEED,
    TEXT_ENCODINGS,
    _evaluate,
    _Text,
    make_text_model,
)
from posenc.experiments.train import train

__all__ = ["PASSKEY_ENCODINGS", "MULTIPLES", "PASSKEY_SEEDS", "TRACE_POINTS", "passkey_jobs",
           "digit_loss", "copy_attention", "make_hf_llama", "run_passkey_job"]  # fmt: skip

PASSKEY_ENCODINGS = ("rope", "alibi", "nope", "hf_llama")  # hf_llama: 1x only
MULTIPLES = (1, 2, 4)  # training steps, as multiples of the study's
PASSKEY_SEEDS = (0, 1, 2)
TRACE_POINTS = 24  # digit loss measured this many times during a run


def passkey_jobs(seeds) -> list[tuple]:
    """``(name, seed)`` jobs, seed by seed: ``"rope@1x"`` ... ``"hf_llama@1x"``.

    Examples
    --------
    >>> passkey_jobs([0])[:4]
    [('rope@1x', 0), ('alibi@1x', 0), ('nope@1x', 0), ('hf_llama@1x', 0)]
    >>> len(passkey_jobs([0, 1]))
    20
    """
    names = [f"{e}@{m}x" for m in MULTIPLES for e in PASSKEY_ENCODINGS
             if e != "hf_llama" or m == 1]  # fmt: skip
    return [(name, s) for s in seeds for name in names]


class _HFLlama(torch.nn.Module):  # logits only, as the study's trainer calls a model
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx):  # idx: (batch, seq) -> (batch, seq, vocab)
        return self.model(input_ids=idx).logits


def make_hf_llama(config):
    """``LlamaForCausalLM`` the size of the study's model: width, depth, heads and head width
    equal, a SwiGLU of ``8 dim / 3`` (rounded to 8) for the GELU MLP of ``4 dim``, RoPE
    base 10,000, no tied embeddings, eager float32 attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(
        vocab_size=VOCAB, hidden_size=config.dim, num_hidden_layers=config.depth,
        num_attention_heads=config.heads, num_key_value_heads=config.heads,
        head_dim=config.head_dim, intermediate_size=8 * math.ceil(config.dim / 3),
        max_position_embeddings=config.lengths[-1], rope_parameters={"rope_type": "default",
        "rope_theta": 10_000.0}, tie_word_embeddings=False, attention_bias=False,
    )  # fmt: skip
    return _HFLlama(LlamaForCausalLM._from_config(hf, attn_implementation="eager"))


@torch.no_grad()
def digit_loss(lm, n, trials) -> tuple[float, float]:
    """Mean loss (nats) on the five digits of ``trials`` held-out passkey rows of ``n`` bytes,
    and the fraction of rows whose five digits are all predicted (teacher forced).

    Parameters
    ----------
    lm : torch.nn.Module
        Token ids ``(batch, seq)`` to logits ``(batch, seq, 256)``; left in its mode.
    n : int
        Row length in bytes.
    trials : int
        Rows (the rows of ``text_study.passkey_accuracy``).

    Returns
    -------
    loss : float
        Mean loss on the digits (nats).
    right : float
        Fraction of rows whose five digits are all predicted.
    """
    was = lm.training
    lm.eval()
    x, y = passkey_batch(corpus("eval"), n, trials, PASSKEY_SEED + n)  # (trials, n)
    logits = lm(x)[:, -DIGITS:]  # (trials, DIGITS, vocab)
    loss = F.cross_entropy(logits.flatten(0, 1), y[:, -DIGITS:].flatten()).item()
    right = (logits.argmax(-1) == y[:, -DIGITS:]).all(1).float().mean().item()
    lm.train(was)
    return loss, right


@torch.no_grad()
def copy_attention(lm, n, trials) -> list[list[float]]:
    """Per layer and head: the mean attention weight from the query that predicts digit ``j``
    (position ``n - 5 + j``) to digit ``j`` of the hidden line, over ``j`` and the rows.

    The weights are the model's own: each layer's queries and keys (captured from its
    projection) go through :func:`~posenc.torch.attend` with the layer's encoding and an
    identity matrix as the values, so the output *is* the attention matrix.

    Parameters
    ----------
    lm : TransformerLM
        The model.
    n : int
        Row length in bytes.
    trials : int
        Held-out passkey rows.

    Returns
    -------
    list of list of float
        ``(depth, heads)``.
    """
    from posenc.torch import attend

    lm.eval()
    x, y = passkey_batch(corpus("eval"), n, trials, PASSKEY_SEED + n)  # (trials, n)
    first = []  # index in x of each row's hidden first digit
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        key = bytes(row_y[-DIGITS:])
        first.append(bytes(row_x).index(NEEDLE + key) + len(NEEDLE))
    captured = []
    hooks = [b.attn.qkv.register_forward_hook(lambda m, i, out: captured.append(out))
             for b in lm.blocks]  # fmt: skip
    try:
        lm(x)
    finally:
        for h in hooks:
            h.remove()
    rows = torch.arange(trials)[:, None]  # (trials, 1)
    j = torch.arange(DIGITS)[None]  # (1, DIGITS)
    out = []
    for block, qkv in zip(lm.blocks, captured, strict=True):
        a = block.attn
        h, kvh, hd = a.heads, a.kv_heads, a.head_dim
        q, k, _ = qkv.view(trials, n, h + 2 * kvh, hd).split([h, kvh, kvh], dim=2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (trials, h|kvh, n, hd)
        eye = torch.eye(n).expand(trials, kvh, n, n)  # values: one-hot keys
        w = attend(q, k, eye, a.encoding, backend="sdpa")  # (trials, h, n, n): weights
        target = torch.tensor(first)[:, None] + j  # (trials, DIGITS)
        picked = w[rows, :, n - DIGITS + j, target]  # (trials, DIGITS, h)
        out.append(picked.mean((0, 1)).tolist())  # (h,)
    return out


def run_passkey_job(name, seed, config, progress=None) -> list[dict]:
    """Train ``name`` (``"<encoding>@<m>x"``) with ``seed`` for ``m`` times the steps; one row.

    Parameters
    ----------
    name : str
        From ``passkey_jobs``.
    seed : int
        Seeds the weights and the data, as in the text study.
    config : TextConfig
        The text study's config (``steps`` is multiplied by ``m``).
    progress : callable, optional
        Called as ``progress(step, loss)`` after every step.

    Returns
    -------
    list of dict
        One row: ``encoding`` (the name), ``multiple``, ``steps``, ``trace`` (``step``,
        ``digit_loss``, ``passkey``), ``loss`` and ``passkey`` per length, ``final_loss``,
        ``seconds`` and (posenc models) ``copy_attention``.
    """
    encoding, _, multiple = name.partition("@")
    if encoding not in PASSKEY_ENCODINGS or multiple not in {f"{m}x" for m in MULTIPLES}:
        raise ValueError(f"name must be <encoding>@<m>x with encoding in {PASSKEY_ENCODINGS} "
                         f"and m in {MULTIPLES}, got {name!r}")  # fmt: skip
    m = int(multiple[:-1])
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if encoding == "hf_llama":
        lm = make_hf_llama(config)
    else:
        lm = make_text_model(TEXT_ENCODINGS[encoding](config), config)
    steps, L = m * config.steps, config.length
    every = steps // TRACE_POINTS
    trace = {"step": [], "digit_loss": [], "passkey": []}

    def record(step, loss):
        if (step + 1) % every == 0:
            dl, acc = digit_loss(lm, L, config.trials)
            trace["step"].append(step + 1)
            trace["digit_loss"].append(dl)
            trace["passkey"].append(acc)
        if progress is not None:
            progress(step, loss)

    log = train(lm, _Text(config.passkeys), steps=steps, batch=config.batch, lr=config.lr,
                sizes=(L, L), warmup=config.warmup, seed=seed, progress=record)  # fmt: skip
    tail = log["losses"][-50:]
    row = {"encoding": name, "multiple": m, "steps": steps, "trace": trace,
           "final_loss": sum(tail) / len(tail), "seconds": log["seconds"],
           **_evaluate(lm, config)}  # fmt: skip
    if encoding != "hf_llama":
        row["copy_attention"] = copy_attention(lm, L, config.trials)
    return [row]
