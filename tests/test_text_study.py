"""The text study's data, metrics and runner (miniature configs: seconds, not hours)."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from posenc.experiments import text_data
from posenc.experiments.text_data import (
    DIGITS,
    NEEDLE,
    corpus,
    eval_windows,
    passkey_batch,
    train_batch,
)
from posenc.experiments.text_run import quick_text_config, run_text, text_jobs
from posenc.experiments.text_study import (
    TEXT_ENCODINGS,
    TextConfig,
    _extended,
    make_text_model,
    passkey_accuracy,
    perplexity,
    result_names,
)

QUICK = quick_text_config(TextConfig())


def test_the_corpus_is_the_pinned_standard_library():
    train, held_out = corpus("train"), corpus("eval")
    assert (len(train), len(held_out)) == (3_653_323, 175_402)  # 64 and 8 files of 3.11.7
    assert bytes(held_out[:34]) == b'#! /usr/bin/env python3\n\n"""Base16'  # base64.py


def test_a_changed_corpus_file_is_refused_by_name(monkeypatch):
    split, name, digest = text_data.FILES[0]
    monkeypatch.setattr(text_data, "FILES", ((split, name, "0" * 64),))
    corpus.cache_clear()
    try:
        with pytest.raises(ValueError, match=f"{name} differs from CPython 3.11.7's"):
            corpus(split)
    finally:
        corpus.cache_clear()


def test_passkey_rows_hide_the_key_and_end_with_it():
    x, y = passkey_batch(corpus("eval"), 256, 8, seed=3)
    assert x.shape == y.shape == (8, 256)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next bytes
    depths = []
    for row_x, row_y in zip(x, y, strict=True):
        text = bytes(row_x.tolist() + [row_y[-1].item()])
        key = text[-DIGITS:]
        assert key.isdigit() and text.count(NEEDLE + key) == 2  # hidden once, asked once
        depths.append(text.index(NEEDLE + key))
    assert depths == sorted(depths) and depths[0] < 40 < 200 < depths[-1]  # spread in depth


def test_training_rows_mix_text_and_passkeys():
    gen = torch.Generator().manual_seed(0)
    x, y = train_batch(corpus("train"), 128, 64, gen, passkeys=0.5)
    assert x.shape == (64, 128) and torch.equal(x[:, 1:], y[:, :-1])
    with_key = sum(NEEDLE in bytes(r.tolist()) for r in x)
    assert 20 <= with_key <= 44  # about half


def test_eval_windows_cut_the_same_text_at_every_length():
    data = corpus("eval")
    for n in (128, 512):
        w = eval_windows(data, n, 2048)
        assert w.shape == (2048 // n, n + 1)
        assert bytes(w[:, :-1].flatten().tolist()) == bytes(data[:2048])


def test_a_uniform_model_has_loss_ln_256_at_every_length():
    lm = make_text_model(TEXT_ENCODINGS["alibi"](QUICK), QUICK)
    with torch.no_grad():
        lm.head.weight.zero_()  # logits 0: every byte equally likely
    got = perplexity(lm, (128, 256), 2048)
    assert got == {128: pytest.approx(math.log(256), abs=1e-6),
                   256: pytest.approx(math.log(256), abs=1e-6)}  # fmt: skip


class _Oracle(torch.nn.Module):  # the true next bytes of passkey rows, the last one shifted
    def __init__(self, shift):
        super().__init__()
        self.shift = shift

    def forward(self, x):
        nxt = torch.roll(x, -1, 1)
        nxt[:, -1] = (self.key[: x.shape[0]] + self.shift) % 256  # four digits right, then this
        return torch.nn.functional.one_hot(nxt, 256).float()


def test_passkey_accuracy_counts_five_right_digits(monkeypatch):
    n, trials = 128, 8
    x, y = passkey_batch(corpus("eval"), n, trials, seed=20_000 + n)
    for shift, want in ((0, 1.0), (1, 0.0)):
        oracle = _Oracle(shift)
        oracle.key = y[:, -1]
        assert passkey_accuracy(oracle, [n], trials, batch=8) == {n: want}


def test_extensions_at_factor_one_are_plain_rope_and_a_raised_base_is_not():
    torch.manual_seed(0)
    lm = make_text_model(TEXT_ENCODINGS["rope"](QUICK), QUICK)
    idx = torch.randint(0, 256, (1, 64))
    with torch.no_grad():
        plain = lm(idx)
        for name in ("pi", "ntk", "yarn", "llama3"):
            assert torch.equal(_extended(lm, QUICK, name, 1.0)(idx), plain), name
        assert not torch.allclose(_extended(lm, QUICK, "base", 1.0)(idx), plain)
        assert not torch.allclose(_extended(lm, QUICK, "pi", 2.0)(idx), plain)


def test_jobs_put_rope_first_and_shard():
    assert text_jobs(["nope", "rope"], [0, 1]) == [("rope", 0), ("nope", 0), ("rope", 1),
                                                   ("nope", 1)]  # fmt: skip
    assert text_jobs(["nope", "rope"], [0, 1], shard=(2, 2)) == [("nope", 0), ("nope", 1)]
    with pytest.raises(ValueError, match="encoding must be one of"):
        text_jobs(["rope2"], [0])


def test_config_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="multiples must be increasing and start at 1"):
        TextConfig(multiples=(2, 4))
    with pytest.raises(ValueError, match="eval_bytes must be a multiple of the longest"):
        TextConfig(eval_bytes=1000)
    assert TextConfig().head_dim >= 64  # the head width


def test_a_miniature_run_writes_every_result_and_resumes(tmp_path):
    out = tmp_path / "text.jsonl"
    config = replace(QUICK, steps=4, finetune_steps=2, dim=64, heads=1, depth=4)
    jobs = text_jobs(["rope", "nope_every_4th"], [0])
    rows = run_text(jobs, config, out, processes=1, progress=False)
    assert sorted(r["encoding"] for r in rows) == sorted(
        result_names("rope") + result_names("nope_every_4th")
    )
    for r in rows:
        assert set(r["loss"]) == set(r["passkey"]) == {"128", "256"}
        assert r["machine"]["capability"] == torch.backends.cpu.get_cpu_capability()
        assert r["task"] == "text" and r["config"] == config.as_dict()
        assert all(np.isfinite(v) for v in r["loss"].values())
    before = out.read_text()
    run_text(jobs, config, out, processes=1, progress=False)  # everything done: no training
    assert out.read_text() == before
    assert json.loads(before.splitlines()[0])["machine"]["blas"]
