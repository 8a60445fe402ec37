"""tools/atlas_use.py: posenc.hf.use end to end on a few model types, and the committed table.

The oracle is HF's own model on the atlas's tiny config (float64, ``torch.float`` read as
float64 so that HF's rates are not rounded to float32): ``use(model,
Schedule.from_hf(config))`` must leave its logits and its cached greedy ``generate`` as they
were, whichever way the scheme goes in, and with posenc's attention forced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import atlas_use  # noqa: E402

# a plain RoPE, per-layer-type bases and windows, adjacent pairs with partial rotary, NoPE
# layers with chunks and a temperature (Llama 4's complex rotary), latent attention
# (DeepSeek's interleave in its apply function), GPT-OSS's half-width cos and its sinks
TYPES = ["llama", "gemma3_text", "glm", "llama4_text", "deepseek_v3", "gpt_oss", "ministral3"]


@pytest.mark.parametrize("model_type", TYPES)
def test_use_leaves_the_models_own_scheme_exact(model_type):
    row = atlas_use.run_type(model_type)
    assert row["status"] == "exact", row
    assert float(row["use"]["error"]) <= atlas_use.TOL
    assert row["use"]["generate_equal"] is True
    forced = row.get("forced")
    if forced is not None and forced["status"] != "refused":  # sinks, channel reorder
        assert forced["status"] == "exact", row


def test_the_committed_table_has_no_silent_difference():
    result = json.loads((ROOT / "benchmarks" / "results" / "atlas_use.json").read_text())
    rows = result["rows"]
    assert {r["status"] for r in rows} <= {"exact", "refused", "no-registry", "not-built",
                                           "differs"}  # fmt: skip
    assert [r["model_type"] for r in rows if r["status"] == "differs"] == []
    for r in rows:
        if r["status"] == "exact":
            assert float(r["use"]["error"]) <= atlas_use.TOL
            assert r["use"]["generate_equal"] is (True if r["lm"] else None)
        if r["status"] in ("refused", "no-registry", "not-built"):
            assert r.get("reason"), r  # every row that was not checked says why
