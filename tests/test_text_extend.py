"""The matched-target extension study (miniature configs: seconds, not hours)."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from posenc.experiments import text_extend
from posenc.experiments.text_extend import (
    BINS,
    METHODS,
    TARGETS,
    _extend,
    context_gain,
    extend_names,
    position_loss,
    run_extend_job,
)
from posenc.experiments.text_run import quick_text_config, run_text, text_jobs
from posenc.experiments.text_study import TextConfig, make_text_model, perplexity

TINY = replace(quick_text_config(TextConfig()), length=64, steps=3, finetune_steps=2,
               eval_bytes=1024, trials=2, dim=64, heads=1)  # fmt: skip


def _model(config=TINY, seed=0):
    torch.manual_seed(seed)
    return make_text_model(text_extend._rope(config), config)


def test_the_loss_by_position_averages_to_the_loss_per_byte():
    lm = _model()
    by_pos = position_loss(lm, 64, 512)
    assert by_pos.shape == (64,) and by_pos.dtype == np.float64
    assert math.isclose(by_pos.mean(), perplexity(lm, [64], 512)[64], rel_tol=1e-6)
    assert by_pos[0] > by_pos[-8:].mean() - 1.0  # finite, one value per position
    # position p of a window sees bytes 0..p only: the first column is the loss of byte 1 alone
    with pytest.raises(ValueError, match="total must be a multiple of n=64"):
        position_loss(lm, 64, 500)


def test_a_model_that_sees_a_fixed_window_gains_nothing_from_a_longer_context():
    from posenc.torch import Layer, Schedule

    torch.manual_seed(0)
    rope = text_extend._rope(TINY)
    L = 32  # the last L / 2 bytes see as far back in the long window as in the short one:
    w = 1 + L // 2 // TINY.depth  # depth layers of a window w reach depth * (w - 1) bytes back
    seen = make_text_model(Schedule([Layer(rope, window=w) for _ in range(TINY.depth)]), TINY)
    assert abs(context_gain(seen, 256, L, 1024)) < 1e-5
    full = make_text_model(rope, TINY)  # sees everything: other bytes, another loss
    full.load_state_dict(seen.state_dict())
    assert abs(context_gain(full, 256, L, 1024)) > 1e-3
    with pytest.raises(ValueError, match="total must be a multiple of n=256"):
        context_gain(full, 256, L, 1000)


def test_the_context_gain_is_the_loss_of_each_byte_from_its_long_and_its_short_context():
    from posenc.experiments.text_data import corpus, eval_windows

    lm, n, L, total = _model(replace(TINY, depth=1)), 64, 16, 128
    rows = eval_windows(corpus("eval"), n, total)  # (2, n + 1)
    diffs = []
    with torch.no_grad():
        for t in rows:
            for p in range(n - L // 2, n):  # predict byte p + 1 from bytes ..p, one at a time
                long = lm(t[None, : p + 1])[0, -1].double().log_softmax(-1)[t[p + 1]]
                short = lm(t[None, n - L : p + 1])[0, -1].double().log_softmax(-1)[t[p + 1]]
                diffs.append((short - long).item())  # loss(long) - loss(short)
    assert context_gain(lm, n, L, total) == pytest.approx(np.mean(diffs), abs=2e-6)


@pytest.mark.parametrize("m", TARGETS)
def test_each_method_is_set_for_the_target(m):
    lm, d, base = _model(), TINY.head_dim, 10_000.0
    inv = {name: _extend(lm, TINY, name, m).blocks[0].attn.encoding for name in METHODS}
    pairs = np.arange(0, d, 2) / d
    plain = base**-pairs  # float64: the paper's rates
    freq = {}
    for name, enc in inv.items():  # the angle of position 1 is each pair's rate
        cs = enc.table(range(2), torch.float64)[0, 1]  # (pairs, 2): scale * [cos, sin]
        freq[name] = torch.atan2(cs[:, 1], cs[:, 0]).numpy()
    np.testing.assert_allclose(freq["rope"], plain, rtol=1e-6)
    np.testing.assert_allclose(freq["pi"], plain / m, rtol=1e-6)
    np.testing.assert_allclose(freq["ntk"], (base * m ** (d / (d - 2))) ** -pairs, rtol=1e-6)
    np.testing.assert_allclose(freq["codellama"], 1e6**-pairs, rtol=1e-6)
    assert freq["ntk"][-1] == pytest.approx(plain[-1] / m, rel=1e-6)  # the slowest pair: 1/s
    assert freq["llama3"][0] == pytest.approx(plain[0]) and freq["llama3"][-1] == pytest.approx(
        plain[-1] / m
    )
    for name in METHODS:  # the weights are the trained model's
        for a, b in zip(_extend(lm, TINY, name, m).parameters(), lm.parameters(), strict=True):
            assert torch.equal(a, b)


def test_a_seed_writes_every_name_and_the_training_budget_is_the_same_bytes(tmp_path):
    out, config = tmp_path / "extend.jsonl", replace(TINY, depth=1)  # one layer: fast
    rows = run_text(text_jobs(["rope"], [0]), config, out, processes=1, progress=False,
                    study="extend")  # fmt: skip
    got = {r["encoding"]: r for r in rows}
    assert sorted(got) == sorted(extend_names()) and len(got) == 1 + 2 * len(METHODS) * len(TARGETS)
    L = TINY.length
    assert all(r["task"] == "text-extend" for r in rows)
    for name, r in got.items():
        m = r["target"]
        assert len(r["by_position"]) == BINS
        assert set(r["loss"]) == ({str(L)} if m == 1 else {str(L), str(m * L)})
        assert ("context_gain" in r) == (m > 1)
        if "+ft" in name:  # the same bytes per step as the text study's rope+ft at 2 L
            assert r["budget"]["rows"] * r["budget"]["length"] == config.batch * 2 * L
            assert r["budget"]["length"] == m * L and r["budget"]["steps"] == config.finetune_steps
        else:
            assert "budget" not in r
        if m > 1:  # the bins average to the loss at the target
            assert np.mean(r["by_position"]) == pytest.approx(r["loss"][str(m * L)], rel=1e-6)
    for m in TARGETS:  # RoPE and dynamic NTK leave the trained model alone at L
        for name in ("rope", "dynamic"):
            assert got[f"{name}@{m}"]["loss"][str(L)] == pytest.approx(got["rope"]["loss"][str(L)])
        assert got[f"pi@{m}"]["loss"][str(L)] != pytest.approx(got["rope"]["loss"][str(L)])
    before = out.read_text()
    run_text(text_jobs(["rope"], [0]), config, out, processes=1, progress=False, study="extend")
    assert out.read_text() == before  # resumed: nothing ran again


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="encoding must be 'rope'"):
        run_extend_job("alibi", 0, TINY)
    with pytest.raises(ValueError, match="batch=3"):
        run_extend_job("rope", 0, replace(TINY, batch=3))
    with pytest.raises(ValueError, match="study must be one of"):
        run_text([], TINY, "x.jsonl", study="passkeys")


def test_the_command_line_runs_the_study_for_rope_only(tmp_path, capsys):
    from posenc.experiments.__main__ import main

    with pytest.raises(SystemExit):
        main(["text", "--study", "extend", "--encodings", "alibi"])
    assert "--study extend extends RoPE only" in capsys.readouterr().err
    out = tmp_path / "x.jsonl"
    args = ["text", "--study", "extend", "--seeds", "0", "--jobs", "1", "--no-progress",
            "--out", str(out), "--steps", "2", "--finetune-steps", "1", "--length", "64",
            "--dim", "64", "--heads", "1", "--depth", "1", "--eval-bytes", "1024", "--trials", "2",
            "--multiples", "1", "2"]  # fmt: skip
    assert main(args) == 0
    assert len(out.read_text().splitlines()) == len(extend_names())
