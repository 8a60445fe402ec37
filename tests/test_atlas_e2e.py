"""The atlas's end-to-end harness (tools/atlas_e2e*.py) on a few model types: per layer, HF's
own attention (a tiny float64 model, eager) against posenc's ``attend``, in both config
layouts; M-RoPE on image and video positions; refusals only at build time."""

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import atlas_e2e  # noqa: E402
from atlas_e2e_config import tiny, v4_layout  # noqa: E402

AXIAL = "2-D axial"


def _modeling(name):
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


@pytest.fixture(autouse=True)
def _fresh():
    atlas_e2e._DONE.clear()  # results are memoised per run; each test builds its own
    yield
    atlas_e2e._DONE.clear()


@pytest.mark.parametrize(
    "name, config",
    [("llama", "LlamaConfig"), ("gemma3", "Gemma3TextConfig"), ("llama4", "Llama4TextConfig"),
     ("deepseek_v3", "DeepseekV3Config")],
)  # fmt: skip
def test_per_layer_attention_matches_hf_in_both_layouts(name, config):
    import transformers

    result = atlas_e2e.run_e2e(_modeling(name), getattr(transformers, config)())
    for layout in ("default", "v4"):
        assert result[layout]["status"] == "exact", result[layout]
    layers = result["default"]["layers"]
    assert len(layers) >= 2 and all(float(n.rsplit(" ", 1)[1]) <= atlas_e2e.TOL for n in layers)


def test_a_wrong_window_or_base_is_caught(monkeypatch):
    """The harness compares against HF, not against posenc: a schedule that drops Gemma 3's
    windows, or gives its sliding layers the global base, differs."""
    import transformers

    from posenc.torch import Layer, RotaryEmbedding, Schedule

    real = Schedule.from_hf.__func__

    def no_window(cls, config):
        s = real(cls, config)
        return Schedule([Layer(x.encoding) for x in s])

    monkeypatch.setattr(Schedule, "from_hf", classmethod(no_window))
    cfg = transformers.Gemma3TextConfig()
    result = atlas_e2e.run_e2e(_modeling("gemma3"), cfg)
    assert result["status"] == "differs" and "sliding_attention" in result["default"]["reason"]
    atlas_e2e._DONE.clear()

    def one_base(cls, config):
        s = real(cls, config)
        far = s.encoding_of(len(s) - 1)
        assert isinstance(far, RotaryEmbedding)
        return Schedule([Layer(far, window=x.window) for x in s])

    monkeypatch.setattr(Schedule, "from_hf", classmethod(one_base))
    result = atlas_e2e.run_e2e(_modeling("gemma3"), cfg)
    assert result["status"] == "differs"


def test_layers_without_attention_must_have_no_encoding(monkeypatch):
    """Qwen3-Next's linear-attention layers run no attention: a schedule that puts RoPE on
    them differs, even though every attention layer matches."""
    import transformers

    from posenc.torch import Layer, Schedule

    real = Schedule.from_hf.__func__

    def rope_everywhere(cls, config):
        s = real(cls, config)
        enc = next(x.encoding for x in s if x.encoding is not None)
        return Schedule([Layer(enc, window=x.window, chunk=x.chunk) for x in s])

    monkeypatch.setattr(Schedule, "from_hf", classmethod(rope_everywhere))
    result = atlas_e2e.run_e2e(_modeling("qwen3_next"), transformers.Qwen3NextConfig())
    assert result["status"] == "differs"
    assert "linear_attention: no attention; posenc gives it" in result["default"]["reason"]


def test_the_v4_write_back_is_what_hf_reads_as_the_class_default():
    """Gemma 3's flat 4.x keys (rope_theta, rope_local_base_freq) read back through HF's own
    config class give the class default's per-layer-type parameters."""
    import transformers

    cls = transformers.Gemma3TextConfig
    d, _ = tiny(cls().to_dict(), "gemma3_text")
    flat = v4_layout(d, cls)
    assert "rope_parameters" not in flat and flat["rope_local_base_freq"] == 10_000.0
    assert cls.from_dict(flat).rope_parameters == cls.from_dict(d).rope_parameters
    cls = transformers.Ministral3Config  # flat YaRN with the beta temperature
    d, notes = tiny(cls().to_dict(), "ministral3")
    flat = v4_layout(d, cls)
    assert flat["rope_scaling"]["rope_type"] == "yarn" and notes
    assert cls.from_dict(flat).rope_parameters == cls.from_dict(d).rope_parameters


def test_mrope_is_checked_on_image_and_video_positions(monkeypatch):
    """Qwen3-VL's interleaved sections against HF's rotary class on (t, h, w) that differ;
    consecutive sections in their place differ (text positions cannot tell)."""
    from atlas_cases import run_case

    from posenc.torch import MRoPE

    rows = [r for r in run_case("qwen3_vl", _modeling("qwen3_vl")) if "grid" in r]
    assert rows and all(r["grid"]["MRoPE.from_hf(config)"]["status"] == "exact" for r in rows)
    real = MRoPE.from_hf.__func__

    def consecutive(cls, config, **kw):
        return real(cls, config, **kw | {"interleaved": False})

    monkeypatch.setattr(MRoPE, "from_hf", classmethod(consecutive))
    rows = [r for r in run_case("qwen3_vl", _modeling("qwen3_vl")) if "grid" in r]
    assert rows and all(r["grid"]["MRoPE.from_hf(config)"]["status"] == "differs" for r in rows)
    assert all(r["status"] == "differs" for r in rows)


def test_a_refusal_is_a_value_error_at_build_time(monkeypatch):
    """A vision 2-D RoPE built at the wrong width is a wrong build ("differs"), not a refusal;
    a ValueError from from_hf is."""
    from atlas_cases import run_case

    from posenc.torch import AxialRotaryEmbedding

    def wrong_width(cls, config, **kw):
        return cls(8, base=100.0)

    monkeypatch.setattr(AxialRotaryEmbedding, "from_hf", classmethod(wrong_width))
    rows = [r for r in run_case("qwen2_vl", _modeling("qwen2_vl")) if r.get("scheme") == AXIAL]
    assert rows and all(r["status"] == "differs" and "builds" in r["reason"] for r in rows)

    def refuse(cls, config, **kw):
        raise ValueError("config: no")

    monkeypatch.setattr(AxialRotaryEmbedding, "from_hf", classmethod(refuse))
    rows = [r for r in run_case("qwen2_vl", _modeling("qwen2_vl")) if r.get("scheme") == AXIAL]
    assert rows and all(r["status"] == "refused" for r in rows)
