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


def test_the_models_own_m_rope_is_kept_and_another_refused():
    import transformers

    from posenc.hf import use
    from posenc.torch import MRoPE, Schedule

    row = atlas_use.run_type("qwen2_vl_text")  # its rotary takes 3-axis positions
    assert row["status"] == "exact" and row["use"]["path"] == "rotary", row
    cfg = transformers.Qwen2VLTextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
    )  # fmt: skip
    model = transformers.Qwen2VLTextModel(cfg)
    own = Schedule.from_hf(cfg)
    kept = use(model, own)
    assert kept.posenc_path == "rotary" and kept.config.rope_parameters["rope_type"] == "default"
    with pytest.raises(ValueError, match="before"):
        use(kept, own)
    other = Schedule([type(layer)(MRoPE(16, sections=(2, 3, 3), base=5e5)) for layer in own])
    with pytest.raises(ValueError, match="M-RoPE"):
        use(transformers.Qwen2VLTextModel(cfg), other)


def test_a_rotary_that_takes_a_layer_type_and_is_read_while_running():
    # LFM3's rotary needs a layer_type though its parameters are flat, and its model reads
    # rotary_emb.layer_types each forward: the stand-in passes both through
    row = atlas_use.run_type("lfm3")
    assert row["status"] == "exact", row
