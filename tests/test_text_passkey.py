"""The passkey study: jobs, the digit loss, the attention of the digit queries, the HF model
(miniature configs; the attention against a float64 formula, not the code under test)."""

import math
from dataclasses import replace

import pytest
import torch

import posenc
from posenc.experiments.text_data import DIGITS, NEEDLE, corpus, passkey_batch
from posenc.experiments.text_passkey import (
    copy_attention,
    digit_loss,
    make_hf_llama,
    passkey_jobs,
    run_passkey_job,
)
from posenc.experiments.text_run import quick_text_config, run_text
from posenc.experiments.text_study import (
    PASSKEY_SEED,
    TextConfig,
    make_text_model,
    passkey_accuracy,
)
from posenc.torch import ALiBi

pytest.importorskip("transformers")

TINY = replace(quick_text_config(TextConfig()), length=64, steps=24, eval_bytes=1024, trials=4,
               dim=64, heads=1, depth=2)  # fmt: skip


def test_copy_attention_is_the_softmax_weight_on_the_digit_to_copy():
    torch.manual_seed(0)
    config = replace(TINY, heads=2, dim=128)
    lm = make_text_model(ALiBi(2), config).eval()
    n, trials = config.length, 3
    got = copy_attention(lm, n, trials)
    # float64 by hand: each layer's input, projections, scores + ALiBi's -m (i - j), softmax
    x, y = passkey_batch(corpus("eval"), n, trials, PASSKEY_SEED + n)
    first = [bytes(r).index(NEEDLE + bytes(t[-DIGITS:])) + len(NEEDLE)
             for r, t in zip(x.tolist(), y.tolist(), strict=True)]  # fmt: skip
    lm64 = lm.double()
    h = lm64.embed(x)  # (trials, n, dim)
    slopes = torch.tensor(posenc.alibi_slopes(2), dtype=torch.float64)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    bias = -slopes[:, None, None] * (i - j)  # (2, n, n)
    bias = bias.masked_fill(j > i, float("-inf"))
    for layer, block in enumerate(lm64.blocks):
        qkv = block.attn.qkv(block.norm1(h)).view(trials, n, 3, 2, 64)
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (trials, 2, n, 64)
        w = (q @ k.transpose(-1, -2) / 8.0 + bias).softmax(-1)  # (trials, 2, n, n)
        want = [sum(w[r, head, n - DIGITS + d, first[r] + d].item() for r in range(trials)
                    for d in range(DIGITS)) / (trials * DIGITS) for head in range(2)]  # fmt: skip
        assert got[layer] == pytest.approx(want, rel=1e-4, abs=1e-6)
        h = block(h, *_plan(lm64, h))
    assert len(got) == config.depth


def _plan(lm, h):  # a step plan for one plain forward of the blocks
    from posenc.torch.cache.step import plan_step

    b, n, _ = h.shape
    step = plan_step(lm.encoding, b, n, None, None, None, None, causal=True, heads=2,
                     backend="sdpa", dtype=h.dtype, device=h.device,
                     limits=(None, None))  # fmt: skip
    return step, 0


def test_the_digit_loss_is_the_cross_entropy_of_the_five_digits():
    torch.manual_seed(0)
    lm = make_text_model(ALiBi(1), TINY)
    loss, right = digit_loss(lm, 64, 4)
    x, y = passkey_batch(corpus("eval"), 64, 4, PASSKEY_SEED + 64)
    with torch.no_grad():
        logp = lm(x)[:, -DIGITS:].double().log_softmax(-1)  # (4, 5, 256)
    want = -logp.gather(-1, y[:, -DIGITS:, None]).mean().item()
    assert loss == pytest.approx(want, rel=1e-5)
    assert right == passkey_accuracy(lm, [64], 4)[64]


def test_the_hf_model_has_the_size_of_the_study_model():
    config = TextConfig()
    hf = make_hf_llama(config)
    ours = make_text_model(posenc.torch.RotaryEmbedding(64, max_len=1024), config)
    count = [sum(p.numel() for p in m.parameters()) for m in (hf, ours)]
    assert abs(count[0] - count[1]) / count[1] < 0.05
    c = hf.model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.head_dim) == (
        128, 4, 2, 64)  # fmt: skip
    assert c.rope_parameters["rope_theta"] == 10_000.0
    assert hf(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 256)


def test_a_run_traces_the_digits_and_the_last_point_is_the_final_accuracy(tmp_path):
    out = tmp_path / "p.jsonl"
    rows = run_text([("alibi@2x", 0), ("hf_llama@1x", 0)], TINY, out, processes=1,
                    progress=False, study="passkey")  # fmt: skip
    got = {r["encoding"]: r for r in rows}
    alibi, hf = got["alibi@2x"], got["hf_llama@1x"]
    assert alibi["steps"] == 2 * TINY.steps and alibi["multiple"] == 2
    assert alibi["trace"]["step"] == list(range(2, 49, 2))  # 24 points
    assert alibi["trace"]["passkey"][-1] == alibi["passkey"]["64"]
    assert len(alibi["copy_attention"]) == TINY.depth and "copy_attention" not in hf
    assert all(0 <= v <= 1 for v in alibi["trace"]["passkey"])
    assert all(math.isfinite(v) for v in hf["trace"]["digit_loss"])
    assert {r["task"] for r in rows} == {"text-passkey"}


def test_jobs_and_names():
    assert passkey_jobs([3])[-1] == ("nope@4x", 3)
    assert sum(name.startswith("hf_llama") for name, _ in passkey_jobs([0])) == 1
    with pytest.raises(ValueError, match="name must be <encoding>@<m>x"):
        run_passkey_job("rope@3x", 0, TINY)
    with pytest.raises(ValueError, match="name must be"):
        run_passkey_job("xpos@1x", 0, TINY)
