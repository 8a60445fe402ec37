"""Statistics of the study on hand-made rows whose answers are known (no training)."""

import math

import numpy as np
import pytest

from posenc.experiments import beats, learned_seeds, paired, summarise, table
from posenc.experiments.stats import t_quantile


def _rows(encoding, at32, at16=None, task="copy", token=None):
    """One row per seed: exact match ``at16`` (default 1.0) at n=16 and ``at32`` at n=32."""
    at16 = at16 or [1.0] * len(at32)
    token = token or at16
    return [{"task": task, "encoding": encoding, "seed": s,
             "exact": {"16": a16, "32": a32}, "token": {"16": t, "32": a32}}
            for s, (a16, a32, t) in enumerate(zip(at16, at32, token, strict=True))]  # fmt: skip


def _t_cdf(x, df):
    """Student's t CDF by the trapezoid rule on its density (independent of the table)."""
    t = np.linspace(0.0, x, 400_001)
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    pdf = np.exp(c - (df + 1) / 2 * np.log1p(t**2 / df))
    return 0.5 + float(np.sum((pdf[1:] + pdf[:-1]) / 2) * (t[1] - t[0]))


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 19, 30, 31, 40, 100])
def test_t_quantile_is_the_975_quantile_of_students_t(df):
    assert _t_cdf(t_quantile(df), df) == pytest.approx(0.975, abs=2e-5)


def test_t_quantile_golden_and_bad_df():
    assert t_quantile(4) == 2.776 and t_quantile(2) == 4.303  # any table of Student's t
    with pytest.raises(ValueError, match="df must be an int >= 1, got 0"):
        t_quantile(0)


def test_paired_interval_and_signs_by_hand():
    # diffs 0.1, 0.2, 0.1, 0.2, 0.1: mean 0.14, sd sqrt(0.012 / 4) = 0.05477,
    # half-width 2.776 * 0.05477 / sqrt(5) = 0.06800
    a = [0.9, 0.8, 0.7, 0.6, 0.5]
    b = [0.8, 0.6, 0.6, 0.4, 0.4]
    rows = _rows("x", a) + _rows("y", b)
    c = paired(rows, "copy", "x", "y", 32)
    assert c.seeds == (0, 1, 2, 3, 4) and c.dropped == ()
    assert c.mean == pytest.approx(0.14)
    assert (c.low, c.high) == pytest.approx((0.14 - 0.06800, 0.14 + 0.06800), abs=1e-5)
    assert (c.wins, c.losses, c.ties) == (5, 0, 0)
    assert c.winner == "x" and c.resolved and beats(rows, "copy", "x", "y", 32)
    assert not beats(rows, "copy", "y", "x", 32)
    assert paired(rows, "copy", "y", "x", 32).winner == "x"  # the same verdict, swapped
    assert "x better" in str(c) and "+14.0 pts" in str(c)


def test_one_seed_against_leaves_it_unresolved_even_when_the_interval_excludes_zero():
    # diffs 0.3, 0.3, 0.3, 0.3, -0.01: mean 0.238, t-interval 0.066 .. 0.410
    c = paired(_rows("x", [0.8] * 4 + [0.49]) + _rows("y", [0.5] * 5), "copy", "x", "y", 32)
    assert c.low > 0 and (c.wins, c.losses) == (4, 1)
    assert c.winner is None and not c.resolved and "not resolved" in str(c)


def test_signs_agreeing_but_a_wide_interval_is_unresolved():
    # diffs 0.5, 0.01, 0.01: mean 0.173, half-width 4.303 * 0.2829 / sqrt(3) = 0.703
    c = paired(_rows("x", [1.0, 0.51, 0.51]) + _rows("y", [0.5] * 3), "copy", "x", "y", 32)
    assert (c.wins, c.losses) == (3, 0) and c.low < 0 < c.high and c.winner is None


def test_ties_and_single_seeds_resolve_nothing():
    c = paired(_rows("x", [0.5, 0.5]) + _rows("y", [0.5, 0.5]), "copy", "x", "y", 32)
    assert c.ties == 2 and c.winner is None
    c = paired(_rows("x", [0.9]) + _rows("y", [0.1]), "copy", "x", "y", 32)
    assert c.seeds == (0,) and math.isnan(c.low) and c.winner is None


def test_pairs_only_seeds_where_both_learned():
    rows = _rows("x", [0.9] * 5) + _rows("y", [0.1] * 5, at16=[1, 1, 0.5, 1, 1])
    c = paired(rows, "copy", "x", "y", 32)
    assert c.seeds == (0, 1, 3, 4) and c.dropped == (2,)
    assert paired(rows, "copy", "x", "y", 32, learned_only=False).seeds == (0, 1, 2, 3, 4)
    rows = _rows("x", [0.9] * 3) + _rows("y", [0.0] * 3, at16=[0.2] * 3)  # y never learned
    assert paired(rows, "copy", "x", "y", 32).seeds == () and not beats(rows, "copy", "x", "y", 32)
    assert beats(rows, "copy", "x", "y", 32, learned_only=False)


def test_learned_is_judged_per_seed_not_by_the_mean():
    # mean 0.92 >= 0.9, but one seed at 0.6 did not learn
    rows = _rows("x", [0.0] * 5, at16=[1.0, 1.0, 1.0, 1.0, 0.6])
    # mean 0.693 < 0.9, yet two of three seeds learned (as RoPE on reverse at n=16)
    rows += _rows("y", [0.0] * 3, at16=[1.0, 0.95, 0.13])
    assert learned_seeds(rows, "copy", "x") == [0, 1, 2, 3] and learned_seeds(
        rows, "copy", "y"
    ) == [0, 1]
    s = summarise(rows)
    assert (s[("copy", "x")]["learned_seeds"], s[("copy", "x")]["learned"]) == (4, False)
    assert (s[("copy", "y")]["learned_seeds"], s[("copy", "y")]["learned"]) == (2, False)
    text = table(rows)
    assert "learned by 4/5 seeds" in text and "learned by 2/3 seeds" in text


def test_learned_is_judged_by_exact_match_whatever_metric_is_tabulated():
    rows = _rows("x", [0.0] * 3, at16=[0.5] * 3, token=[0.97] * 3)  # tokens right, problems not
    rows += _rows("y", [0.0] * 3, at16=[0.95] * 3, token=[0.99] * 3)
    for metric in ("exact", "token"):
        s = summarise(rows, metric)
        assert s[("copy", "x")]["learned"] is False and s[("copy", "y")]["learned"] is True
        lines = {line.split()[0]: line for line in table(rows, metric).splitlines() if line}
        assert lines["x"].endswith("did not learn the task (0/3 seeds)")
        assert "learn" not in lines["y"]
    assert " 97.0 +- 0.0" in table(rows, "token")  # the token table shows token accuracy


def test_bad_metric():
    with pytest.raises(ValueError, match="metric must be 'exact' or 'token', got 'loss'"):
        summarise(_rows("x", [0.5]), "loss")
    with pytest.raises(ValueError, match=r"metric must be one of \('exact', 'token', "
                       r"'passkey', '-loss'\), got 'loss'"):  # fmt: skip
        paired(_rows("x", [0.5]), "copy", "x", "x", 32, "loss")


def test_a_lower_loss_wins_as_its_negation():
    rows = [{"task": "text", "encoding": e, "seed": s, "loss": {"128": v + 0.01 * s}}
            for e, v in (("a", 1.5), ("b", 1.9)) for s in range(3)]  # fmt: skip
    c = paired(rows, "text", "a", "b", 128, "-loss", learned_only=False)
    assert c.winner == "a" and c.wins == 3 and abs(c.mean - 0.4) < 1e-12


def test_compare_command_prints_one_verdict_per_size(tmp_path, capsys):
    import json

    from posenc.experiments.__main__ import main

    rows = _rows("alibi", [0.9, 0.8, 0.7, 0.6, 0.5]) + _rows("kerple", [0.8, 0.6, 0.6, 0.4, 0.4])
    rows += _rows("alibi", [0.0] * 5, task="reverse")
    rows += _rows("kerple", [0.0] * 5, at16=[1, 1, 1, 1, 0.2], task="reverse")
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["compare", "alibi", "kerple", "--task", "copy", "--path", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].endswith("of 5: alibi better")
    main(["compare", "alibi", "kerple", "--task", "reverse", "--path", str(path)])
    assert "seeds 4 left out" in capsys.readouterr().out


def test_claims_drawn_on_some_seeds_are_confirmed_or_refuted_on_others():
    from posenc.experiments.verdicts import claims, holds

    drawn = _rows("x", [0.9, 0.8, 0.7]) + _rows("y", [0.5, 0.4, 0.45]) + _rows("z", [0.5] * 3)
    found = claims(drawn, "copy", ["z", "y", "x"], 32)
    assert [(c.a, c.b) for c in found] == [("x", "z"), ("x", "y")]  # winner first; y ~ z
    later = [r | {"seed": r["seed"] + 3} for r in _rows("x", [0.6, 0.6]) + _rows("y", [0.5, 0.6])]
    assert holds(found[1], later)  # one seed for, one tie, none against
    against = [r | {"seed": 9} for r in _rows("x", [0.3]) + _rows("y", [0.5])]
    assert not holds(found[1], later + against)
    assert not holds(found[1], [r | {"seed": 9} for r in _rows("x", [0.3])])  # no pair: no support
    with pytest.raises(ValueError, match="claim must be resolved"):
        holds(paired(drawn, "copy", "y", "z", 32), later)
