"""Every ``from_hf`` returns the whole position scheme or refuses, naming Schedule.from_hf.

``RotaryEmbedding.from_hf`` builds one RoPE of the leading channels, ``MRoPE.from_hf`` one
M-RoPE. A config whose layers do more -- Ministral 3's query scaling, Mistral 4's and
DeepSeek's rotation of the trailing channels of a ``[nope | rope]`` head, Llama 4's and
SmolLM3's layers without RoPE, Cohere 2's full layers without RoPE, sets per layer type, M-RoPE
positions -- is refused; one that a ``layer_type`` narrows to one RoPE is built, and rotates
as the model's own rotary class and apply function do (float64).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from posenc.torch import MRoPE, RotaryEmbedding, Schedule

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")

SMALL = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
         "num_hidden_layers": 6}  # fmt: skip


def _config(model_type, **keys):
    return transformers.AutoConfig.for_model(model_type, **{**SMALL, **keys})


MINISTRAL3 = {  # a config.json as saved: Llama-4 query scaling in rope_parameters
    "model_type": "ministral3", "hidden_size": 64, "num_attention_heads": 2, "head_dim": 32,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.1,
                        "original_max_position_embeddings": 16},
}  # fmt: skip
MISTRAL4 = {  # [nope 32 | rope 32] heads: HF rotates the trailing 32 channels
    "model_type": "mistral4", "hidden_size": 64, "num_attention_heads": 2,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
}  # fmt: skip

REFUSED = {
    "ministral3 dict": (lambda: MINISTRAL3, None, "'ministral3': layer 0 has a query temperature"),
    "ministral3": (lambda: _config("ministral3", head_dim=32), None, "query temperature"),
    "mistral4 dict": (lambda: MISTRAL4, None, "layer 0 has its rotation on the trailing "
                      "channels from 32 on (HF's [nope | rope] head), where a RoPE rotates "
                      "the leading ones"),
    "mistral4": (lambda: _config("mistral4", qk_nope_head_dim=16, qk_rope_head_dim=16),
                 None, "trailing channels"),
    "deepseek_v3": (lambda: _config("deepseek_v3", qk_nope_head_dim=16, qk_rope_head_dim=16),
                    None, "trailing channels"),
    "llama4 NoPE layers": (lambda: _config("llama4_text", head_dim=32), None, "no RoPE"),
    "llama4 full layers": (lambda: _config("llama4_text", head_dim=32), "full_attention",
                           "no RoPE and a query temperature"),
    "smollm3": (lambda: _config("smollm3"), None, "layer 3 (full_attention) has no RoPE"),
    "cohere2 full layers": (lambda: _config("cohere2", head_dim=32), None, "no RoPE"),
    "qwen2_vl": (lambda: _config("qwen2_vl_text"), None, "MRoPE.from_hf"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_rotary_embedding_from_hf_refuses_what_one_rope_would_drop(case):
    make, layer_type, why = REFUSED[case]
    want = "from_hf builds one (RoPE|M-RoPE), but .*; Schedule.from_hf builds every layer"
    with pytest.raises(ValueError, match=want) as info:
        RotaryEmbedding.from_hf(make(), layer_type=layer_type)
    assert why in str(info.value)


def test_mistral4_is_built_whole_by_schedule_instead():
    # what the refusal points to builds it: the trailing slice, as HF's attention holds it
    schedule = Schedule.from_hf({**MISTRAL4, "num_hidden_layers": 1})
    assert "ChannelSlice" in repr(schedule.encoding_of(0))


def _hf_rotate(module_name, rotary_name, config, layer_type, q, k, pos):
    mod = __import__(f"transformers.models.{module_name}.modeling_{module_name}", fromlist=["x"])
    rotary = getattr(mod, rotary_name)(config).double()
    args = (layer_type,) if layer_type else ()
    cos, sin = rotary(q, pos[None], *args)
    return mod.apply_rotary_pos_emb(q, k, cos, sin)


ACCEPTED = {  # a layer type narrows the layers to one RoPE: built, as the model rotates
    "cohere2 sliding": ("cohere2", "Cohere2RotaryEmbedding", "sliding_attention", False),
    "gemma3 sliding": ("gemma3", "Gemma3RotaryEmbedding", "sliding_attention", True),
    "gemma3 full": ("gemma3", "Gemma3RotaryEmbedding", "full_attention", True),
    "llama": ("llama", "LlamaRotaryEmbedding", None, False),
    "exaone4 sliding": ("exaone4", "Exaone4RotaryEmbedding", "sliding_attention", False),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_one_rope_per_layer_type_is_built_as_the_model_rotates(case):
    module_name, rotary_name, layer_type, per_type = ACCEPTED[case]
    model_type = {"gemma3": "gemma3_text"}.get(module_name, module_name)
    config = _config(model_type, head_dim=32)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 40, 32, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 40, 32, generator=gen, dtype=torch.float64)
    pos = torch.arange(40) * 7  # far apart: a wrong base shows
    want = _hf_rotate(module_name, rotary_name, config, layer_type if per_type else None,
                      q, k, pos)  # fmt: skip
    rope = RotaryEmbedding.from_hf(config, layer_type=layer_type, max_len=4096)
    for got, exp in zip(rope(q, k, pos[None]), want, strict=True):
        torch.testing.assert_close(got, exp, rtol=0, atol=1e-4)  # HF: float32 angles


def test_llama4_chunked_layers_are_one_rope():
    config = _config("llama4_text", head_dim=32)
    assert RotaryEmbedding.from_hf(config, layer_type="chunked_attention").base == 5e5


def test_plain_dicts_without_a_depth_are_built():
    cfg = {"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
           "max_position_embeddings": 8192}  # fmt: skip
    # (the README's)
    assert RotaryEmbedding.from_hf(cfg).head_dim == 128
    # a class rule of which layers slide, unknown without the object, does not change a RoPE
    gemma2 = {"model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 2,
              "head_dim": 32, "rope_theta": 1e4, "max_position_embeddings": 64,
              "sliding_window": 16}  # fmt: skip
    assert RotaryEmbedding.from_hf(gemma2).base == 1e4


def test_a_layer_type_the_model_does_not_have_is_refused_by_name():
    with pytest.raises(ValueError, match="layer_type must be one of"):
        RotaryEmbedding.from_hf(_config("cohere2", head_dim=32), layer_type="chunked_attention")


def _neomme(**keys):
    return transformers.AutoConfig.for_model(
        "neomme", hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
        num_hidden_layers=4,
        vision_config={"hidden_size": 32, "num_attention_heads": 2}, **keys,
    )  # fmt: skip


def test_mrope_from_hf_refuses_per_type_sets_and_layers_without_rope():
    with pytest.raises(ValueError, match="layer_type"):
        MRoPE.from_hf(_neomme())  # its full and sliding layers rotate differently
    assert MRoPE.from_hf(_neomme(), layer_type="sliding_attention").rotary_dim == 64
    compass = transformers.AutoConfig.for_model(
        "cohere_compass_text", **SMALL, layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": None},
    )  # fmt: skip
    with pytest.raises(ValueError, match="layer_type"):
        MRoPE.from_hf(compass)
    with pytest.raises(ValueError, match="no RoPE"):
        MRoPE.from_hf(compass, layer_type="full_attention")
    assert MRoPE.from_hf(compass, layer_type="sliding_attention").interleaved


def test_mrope_from_hf_builds_hybrid_models_whose_other_layers_have_no_attention():
    # Qwen3.5: gated-delta (linear attention) layers carry no position; its M-RoPE is whole
    config = transformers.AutoConfig.for_model("qwen3_5_text", **SMALL, head_dim=64)
    assert "linear_attention" in config.layer_types
    mrope = MRoPE.from_hf(config)
    assert (mrope.rotary_dim, mrope.sections) == (16, (3, 3, 2))
    with pytest.raises(ValueError, match="linear_attention layers have no attention"):
        MRoPE.from_hf(config, layer_type="linear_attention")


MROPE_SECTION = {"mrope_section": [4, 6, 6]}  # 16 pairs of a 32-wide head


@pytest.mark.parametrize("where", ["rope_parameters", "rope_scaling", "per layer type"])
def test_rotary_embedding_from_hf_refuses_mrope_sections_of_a_model_type_it_does_not_know(where):
    """HF's Qwen2-VL config keeps mrope_section wherever the file gives it, and its rotary
    class then turns pairs with three axes: one RoPE of text positions would drop that."""
    base = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
            "num_hidden_layers": 2, "max_position_embeddings": 256}  # fmt: skip
    params = {"rope_type": "default", "rope_theta": 1e6, **MROPE_SECTION}
    cfg = {
        "rope_parameters": base | {"rope_parameters": params},
        "rope_scaling": base | {"rope_theta": 1e6, "rope_scaling": params},
        "per layer type": base | {"layer_types": ["full_attention"] * 2,
                                  "rope_parameters": {"full_attention": params}},
    }[where]  # fmt: skip
    if where != "per layer type":  # no model type: read as HF's class reads this dict
        hf = transformers.AutoConfig.for_model("qwen2_vl_text", **cfg)
        assert hf.rope_parameters["mrope_section"] == MROPE_SECTION["mrope_section"]
    with pytest.raises(ValueError, match=r"its positions are M-RoPE's \(time, height, width\)"):
        RotaryEmbedding.from_hf(cfg, layer_type="full_attention" if "layer" in where else None)


def test_rotary_embedding_from_hf_refuses_a_multimodal_v4_file_by_its_text_model_type():
    """A 4.x Qwen2-VL config.json: model_type "qwen2_vl", flat keys, no mrope_section -- HF's
    Qwen2VLTextRotaryEmbedding then uses its class default sections (M-RoPE all the same)."""
    cfg = {"model_type": "qwen2_vl", "hidden_size": 64, "num_attention_heads": 2,
           "num_hidden_layers": 2, "max_position_embeddings": 256, "rope_theta": 1e6}  # fmt: skip
    hf = transformers.AutoConfig.for_model(**cfg)
    assert hf.text_config.model_type == "qwen2_vl_text"
    with pytest.raises(ValueError, match=r"model_type 'qwen2_vl': its positions are M-RoPE's"):
        RotaryEmbedding.from_hf(cfg)


def test_a_known_model_type_given_a_pairing_keeps_its_own_layer_rules():
    """A pairing given for a model type posenc knows does not turn its rules off: DeepSeek-V3
    rotates the trailing channels whatever window the file names; Cohere 2's class default
    window (4096) gives sliding layers and full ones without RoPE, so a dict that names no
    window cannot be read as one RoPE."""
    base = {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 4,
            "max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    deepseek = base | {"model_type": "deepseek_v3", "qk_nope_head_dim": 16,
                       "qk_rope_head_dim": 16, "sliding_window": 8}  # fmt: skip
    with pytest.raises(ValueError, match="rotation on the trailing channels from 16 on"):
        RotaryEmbedding.from_hf(deepseek, pairing="interleaved")
    assert transformers.AutoConfig.for_model("cohere2").sliding_window == 4096
    with pytest.raises(ValueError, match="cannot be read as Schedule.from_hf reads them"):
        RotaryEmbedding.from_hf(base | {"model_type": "cohere2"}, pairing="interleaved")


def test_the_layer_type_hint_names_only_the_attention_types():
    # a refusal names the layer types layer_type= can build (Llama 4: its chunked layers
    # rotate, its full ones do not); a layer without attention is never offered
    transformers = pytest.importorskip("transformers")
    saved = transformers.AutoConfig.for_model("llama4_text", num_hidden_layers=4).to_dict()
    hint = r"\(layer_type= one of \['chunked_attention', 'full_attention'\] builds"
    with pytest.raises(ValueError, match=hint):
        RotaryEmbedding.from_hf(saved)
    saved["layer_types"] = ["chunked_attention", "linear_attention"] + ["chunked_attention"] * 2
    with pytest.raises(ValueError, match="layer 3 .chunked_attention. has no RoPE") as caught:
        RotaryEmbedding.from_hf(saved)  # no_rope_layers' 0 is layer 3
    assert "layer_type=" not in str(caught.value)  # one attention type: nothing to choose


def test_a_rope_read_otherwise_than_the_schedule_reads_it_is_refused(monkeypatch):
    # RotaryEmbedding.from_hf reads the config with posenc.hf.from_hf and checks the result
    # against Schedule.from_hf's reading of the same layers: a reader that drifted (here one
    # made to read the base wrong) is refused, not built
    from posenc.hf import from_hf
    from posenc.torch.encodings.qk import rope as rope_module

    cfg = {"hidden_size": 64, "num_attention_heads": 2, "rope_theta": 5e5,
           "max_position_embeddings": 64}  # fmt: skip
    assert RotaryEmbedding.from_hf(cfg).base == 5e5
    monkeypatch.setattr(rope_module, "from_hf", lambda *a, **kw: from_hf(*a, **kw) | {"base": 1e4})
    with pytest.raises(ValueError, match=r"its layers' RoPE is \{.*'base': 500000.0.*\}, not"):
        RotaryEmbedding.from_hf(cfg)
