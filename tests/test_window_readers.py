"""Whose ``sliding_window`` reaches the attention, against HF's own models (transformers 5.23.0).

Every config class accepts ``sliding_window`` and ``layer_types``, but only some models build a
sliding mask: ``LlamaConfig(sliding_window=3, layer_types=[..."sliding_attention"...])`` runs
a ``LlamaModel`` whose every layer sees every earlier token. For every model type whose config
class has ``sliding_window`` or ``layer_types`` (and Llama, Gemma, OLMoE, which take them as
extra keys), a tiny config with a window of 3 and one sliding layer is read by posenc; where
posenc accepts it, the mask each layer's attention receives in HF's tiny model (eager, one
forward) is the oracle, and where that model is not run here (``NOT_RUN`` says why) a scan of
HF's modeling code is: a model class whose source builds no sliding mask applies no window.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from functools import cache
from pathlib import Path

import pytest
import torch

from posenc.hf import layers, schedule_from_hf, settled
from posenc.hf.model_types import MODEL_TYPES
from posenc.hf.windows import WINDOWED, applies_window

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402

MODELS = Path(transformers.__file__).parent / "models"
TINY = {"hidden_size": 32, "num_attention_heads": 2, "head_dim": 16, "num_hidden_layers": 3,
        "max_position_embeddings": 1024, "vocab_size": 16, "intermediate_size": 32,
        "num_key_value_heads": 1, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0,
        "use_sliding_window": True, "max_window_layers": 1, "sliding_window": 3}  # fmt: skip
TYPES = ("full_attention", "sliding_attention", "full_attention")
# keywords a tiny model needs, and the model class where AutoModel has none for the config
EXTRA = {"qwen3_omni_moe_text": {"num_experts": 2, "num_experts_per_tok": 1,
                                 "moe_intermediate_size": 16},
         "qwen2_5_omni_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                   "mrope_section": [2, 3, 3]}}}  # fmt: skip
DIRECT = {"deepseek_ocr2_encoder": "DeepseekOcr2VisionEncoder",
          "qwen3_omni_moe_text": "Qwen3OmniMoeThinkerTextModel",
          "qwen2_5_omni_text": "Qwen2_5OmniThinkerTextModel"}  # fmt: skip
# posenc accepts the tiny config, but HF's tiny model is not run here: why
NOT_RUN = {
    **dict.fromkeys(("afmoe", "kolibri1", "gemma4_text", "phi4_multimodal", "qwen3_moe"),
                    "slow to build (seconds; test_sliding_every_layer runs some)"),
    **dict.fromkeys(("axk2", "bailing_hybrid", "deepseek_v32", "glm_moe_dsa",
                     "mistral_large4_text"), "latent attention: the tiny widths do not fit"),
    **dict.fromkeys(("lfm2", "lfm2_moe", "llama4_text", "minimax", "qwen3_5_text",
                     "qwen3_5_moe_text", "qwen3_next"),
                    "HF's model has no mask for 'sliding_attention' (KeyError)"),
    **dict.fromkeys(("blt_patcher", "mimi", "pocket_tts_audio_tokenizer", "voxtral_realtime_text"),
                    "not an AutoModel of ids: tests/test_sliding_every_layer.py runs it"),
    **dict.fromkeys(("qwen2_5_omni_talker", "qwen3_omni_moe_talker_text", "step3p5",
                     "t5_gemma_module", "t5gemma2_decoder", "t5gemma2_text",
                     "unlimited_ocr_text", "diffusion_gemma_text"),
                    "no AutoModel for the config: a part of a larger model"),
    **dict.fromkeys(("qwen2_vl_text", "qwen2_5_vl_text"), "M-RoPE sections of another width"),
    "dots1": "its tiny model fails in HF (TypeError in the experts)",
    "gemma3n_text": "HF refuses its cache layer types for a 3-layer model",
    "muse_spark_text": "its class defaults allocate more memory than a test may",
    "kyutai_speech_to_text": "its token ids lie outside a tiny vocabulary",
    "modernbert-decoder": "its window is local_attention // 2 (test_schedule_from_hf runs it)",
}  # fmt: skip
# model types whose window a parent model reads (the scan finds the parent's class): MimiModel's
# and PocketTTS's encoder and decoder halves, BltModel's local encoder and decoder (its
# local_attention_window_len), T5Gemma's modules; NemotronAsrStreamingEncoder's left context
# (sliding_window - 1) is an overlay of its own
PARENT_READ = frozenset(("mimi_encoder", "mimi_decoder", "pocket_tts_audio_tokenizer_encoder",
                         "pocket_tts_audio_tokenizer_decoder", "blt_local_encoder",
                         "blt_local_decoder", "t5_gemma_module",
                         "nemotron_asr_streaming_encoder"))  # fmt: skip
MASK_KEYS = ("create_sliding_window_causal_mask", "create_bidirectional_sliding_window_mask",
             "sliding_window_bidirectional_overlay", "sliding_window_mask_function")  # fmt: skip


def _has(cls, name):
    if any(name in getattr(c, "__annotations__", {}) or name in vars(c) for c in cls.__mro__):
        return True
    try:
        return f"self.{name}" in inspect.getsource(cls)
    except (OSError, TypeError):
        return False


def _candidates():
    out = []
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        try:
            cls = CONFIG_MAPPING[model_type]
        except (KeyError, ImportError, AttributeError):
            continue
        if _has(cls, "sliding_window") or _has(cls, "layer_types"):
            out.append(model_type)
    return out + ["llama", "gemma", "olmoe"]


@cache
def _windowed_config_classes():
    """The config classes (by name) of HF's model classes whose source builds a sliding mask
    (MASK_KEYS, or a module function that calls one), and their model types."""
    found, types = set(), set()
    for path in MODELS.glob("*/modeling_*.py"):
        text = path.read_text()
        if not any(k in text for k in MASK_KEYS):
            continue
        lines = text.splitlines()
        nodes = [(n, "\n".join(lines[n.lineno - 1 : n.end_lineno])) for n in ast.parse(text).body]
        keys = set(MASK_KEYS) | {f"{n.name}(" for n, segment in nodes
                                 if isinstance(n, ast.FunctionDef)
                                 and any(k in segment for k in MASK_KEYS)}  # fmt: skip
        for node, segment in nodes:
            if isinstance(node, ast.ClassDef) and any(k in segment for k in keys):
                names = set(re.findall(r"config: (\w+Config)\b", segment))
                found |= names
                configs = importlib.import_module(
                    f"transformers.models.{path.parent.name}.configuration_{path.parent.name}"
                )
                types |= {getattr(configs, n).model_type for n in names if hasattr(configs, n)}
    return found, types - {""}


def _config(model_type):
    kw = TINY | EXTRA.get(model_type, {})
    return CONFIG_MAPPING[model_type](**kw, layer_types=list(TYPES))


def _hf_visible(model_type, config, seq=8):
    """Per layer, the keys each query sees in HF's tiny model (bool ``(seq, seq)``)."""
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    if model_type in DIRECT:
        module = type(config).__module__.replace(".configuration_", ".modeling_")
        model = getattr(importlib.import_module(module), DIRECT[model_type])(config)
    else:
        model = transformers.AutoModel.from_config(config)
    seen = {}
    for path, attn in model.named_modules():
        if path.endswith("self_attn") and "layers." in path:

            def grab(mod, args, kwargs, path=path):
                mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
                seen[path] = mask if mask.dtype == torch.bool else mask == 0

            attn.register_forward_pre_hook(grab, with_kwargs=True)
    if model_type in DIRECT:  # (the masks do not depend on the values: float32 will do)
        given = {"inputs_embeds": torch.randn(1, seq, config.hidden_size)}
    else:
        given = {"input_ids": torch.zeros(1, seq, dtype=torch.long)}
    given |= {"num_patches": 0} if model_type == "deepseek_ocr2_encoder" else {"use_cache": False}
    with torch.no_grad():
        model.eval()(**given)
    order = sorted(seen, key=lambda p: int(p.split(".")[-2]))
    assert len(order) == config.num_hidden_layers
    return [seen[p][0, 0].bool() for p in order]


def _visible(windows, seq=8):
    q, k = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    return [(k <= q) & (q - k < (w or seq)) for w in windows]


@pytest.mark.parametrize("model_type", _candidates())
def test_each_layers_window_is_what_hfs_attention_receives(model_type):
    try:
        config = _config(model_type)
    except Exception:  # noqa: BLE001 (strict dataclass validators raise their own errors)
        pytest.skip("HF's config class refuses the tiny config (layer_types or its keys)")
    try:
        read = schedule_from_hf(config)["layers"]
    except ValueError:
        return  # refused by name: nothing silently wrong
    windows = [layer["window"] for layer in read]
    if model_type in NOT_RUN:  # second best: the modeling source builds a sliding mask or not
        applied = type(config).__name__ in _windowed_config_classes()[0]
        if applied or model_type in PARENT_READ:  # the sliding layer keeps a window
            assert windows[1] is not None, windows  # (ModernBERT-decoder's: local_attention // 2)
        else:
            assert windows == [None] * 3, windows
        return
    got, want = _visible(windows), _hf_visible(model_type, config)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"{model_type}: layer {i}, window {windows[i]}"


def test_llamas_window_is_dropped_as_its_model_drops_it():
    want = _hf_visible("llama", _config("llama"))  # three plain causal masks
    assert all(torch.equal(w, torch.ones(8, 8).tril().bool()) for w in want)
    assert [layer["window"] for layer in schedule_from_hf(_config("llama"))["layers"]] == [None] * 3
    # a model type transformers does not know keeps the window it is given
    assert layers.prepare({"sliding_window": 3}, "my_custom_llama")["sliding_window"] == 3
    custom = {**_config("llama").to_dict(), "model_type": None}
    assert [layer["window"] for layer in schedule_from_hf(custom)["layers"]] == [None, 3, None]


def test_model_types_are_those_of_transformers():
    types = set(CONFIG_MAPPING_NAMES)
    for path in MODELS.glob("*/configuration_*.py"):
        types |= set(re.findall(r'^\s+model_type = "([^"]+)"', path.read_text(), re.M))
    assert types == MODEL_TYPES
    assert set(WINDOWED) <= MODEL_TYPES
    assert not applies_window("llama") and applies_window("not_a_model_type_of_hf")


def test_the_table_is_the_modeling_code():
    """WINDOWED holds every model type whose model class builds a sliding mask, and no other
    than those whose parent model reads their window or whose text model is windowed."""
    scanned = _windowed_config_classes()[1]
    assert scanned - set(WINDOWED) == set()
    wrappers = {t for t, how in WINDOWED.items() if how == "text model"}
    assert set(WINDOWED) - scanned - wrappers == PARENT_READ
    every = {t for t, how in WINDOWED.items() if how == "every"}
    assert every == {t for t, ignored in settled.SLIDE_EVERY_LAYER.items() if ignored}
    assert set(settled.SLIDE_EVERY_LAYER) <= set(WINDOWED)


@pytest.mark.parametrize("model_type", ["t5_gemma_module", "t5gemma2_text"])
def test_encoder_windows_that_look_both_ways_are_refused(model_type):
    # T5Gemma's encoder (is_decoder False, the module config's default) and T5Gemma 2's
    # (its text config) build create_bidirectional_sliding_window_mask / an is_causal=False
    # window: posenc's windows look back, so the schedule is refused by name
    cfg = transformers.AutoConfig.for_model(
        model_type, num_hidden_layers=3, sliding_window=3,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    src = Path(transformers.__file__).parent / "models"
    text = "".join(p.read_text() for p in src.glob("t5gemma*/modeling_t5gemma*.py"))
    assert "create_bidirectional_sliding_window_mask" in text and "is_causal=False" in text
    why = r"bidirectional \(an encoder's: posenc.hf.windows.WINDOWED\)"
    with pytest.raises(ValueError, match=f"{model_type}.*{why}"):
        schedule_from_hf(cfg)
