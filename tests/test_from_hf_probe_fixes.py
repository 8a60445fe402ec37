"""Issue 40, the config-reading fixes of the fourth probe round: each table of posenc.hf checked
against transformers 5.23.0 itself (its config classes, its modeling source, its rotary
classes), and the bad values its classes refuse refused by name."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import re
import warnings

import pytest
import torch

from posenc.hf import defaults, schedule_from_hf, settled
from posenc.scaling import from_hf

transformers = pytest.importorskip("transformers")

MODELS = pathlib.Path(transformers.__file__).parent / "models"
TINY = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 64, "num_hidden_layers": 2, "rope_theta": 1e4}  # fmt: skip


def _config_model_types(package):
    """Every model type a transformers model package's configuration modules define."""
    found = set()
    for path in (MODELS / package).glob("configuration_*.py"):
        module = importlib.import_module(f"transformers.models.{package}.{path.stem}")
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                found.add(getattr(obj, "model_type", ""))
    return found - {""}


def test_partial_default_is_every_rotary_class_whose_default_init_reads_the_factor():
    # HF's source: a compute_default_rope_parameters that reads the factor (or a rotary width)
    reading = set()
    for path in MODELS.glob("*/modeling_*.py"):
        text = path.read_text()
        for body in re.findall(r"def compute_default_rope_parameters\(.*?\n    (?:def |@)", text,
                               re.S):  # fmt: skip
            if re.search(r"partial_rotary_factor|rotary_dim|rotary_pct", body):
                reading.add(path.parent.name)
    assert len(reading) > 30
    want = set().union(*(_config_model_types(p) for p in reading))
    vision = {t for t in want if t.endswith(("_vision", "_vqmodel", "_vision_encoder"))}
    assert defaults.PARTIAL_DEFAULT <= want
    assert want - vision - defaults.PARTIAL_DEFAULT <= {"phi4_multimodal_audio"}  # its own rotary
    for t in ("llama", "qwen2", "mistral", "gemma3_text", "olmo3", "cohere", "granite"):
        assert t not in defaults.PARTIAL_DEFAULT


def _hf_rotary_width(model_type, prefix, **kw):
    cls = transformers.CONFIG_MAPPING[model_type]
    cfg = cls(**{k: v for k, v in TINY.items() if k != "rope_theta"}, **kw)
    module = importlib.import_module(cls.__module__.replace("configuration_", "modeling_"))
    return cfg, 2 * getattr(module, f"{prefix}RotaryEmbedding")(cfg).inv_freq.numel()


@pytest.mark.parametrize(
    "model_type, prefix, kw",
    [("mistral", "Mistral", {}), ("phi", "Phi", {}), ("stablelm", "StableLm", {}),
     ("llama", "Llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                             "rope_theta": 1e4}}),
     ("qwen2", "Qwen2", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                             "rope_theta": 1e4}})],
)  # fmt: skip
def test_rotary_width_is_that_of_hfs_rotary_class(model_type, prefix, kw):
    # the default inits of Phi and StableLM read the factor, Mistral's does not; the scaled
    # inits of modeling_rope_utils read it for every model type
    cfg, width = _hf_rotary_width(model_type, prefix, partial_rotary_factor=0.5, **kw)
    for config in (cfg, cfg.to_dict()):
        got = from_hf(config)
        assert (got["rotary_dim"] or got["head_dim"]) == width, config


def test_class_window_is_the_sliding_window_default_of_every_config_class():
    want = {}
    for model_type, cls in sorted(transformers.CONFIG_MAPPING.items()):
        try:
            field = {f.name: f for f in dataclasses.fields(cls)}.get("sliding_window")
        except TypeError:
            continue
        if field is not None and field.default not in (None, dataclasses.MISSING):
            want[model_type] = field.default
    assert len(want) > 40
    assert defaults.CLASS_WINDOW == want


def test_a_dict_without_sliding_window_takes_the_class_default_everywhere_it_matters():
    # Mistral's default 4096 slides every layer; EXAONE 4's decides which layers rotate
    from transformers import Exaone4Config, MistralConfig

    for cls in (MistralConfig, Exaone4Config):
        cfg = cls(num_hidden_layers=4).to_dict()
        del cfg["sliding_window"]
        back = cls.from_dict(dict(cfg))
        assert back.sliding_window == 4096
        assert schedule_from_hf(cfg) == schedule_from_hf(back)


def test_layer_types_are_hfs_allowed_ones():
    from transformers.configuration_utils import ALLOWED_LAYER_TYPES

    assert defaults.LAYER_TYPES == ALLOWED_LAYER_TYPES


def test_slide_every_layer_is_each_models_mask_rule():
    rules = ("create_causal_mask if self.config.sliding_window is None else create_sliding_window",
             "causal_mask = create_sliding_window_causal_mask(")  # one mask for every layer
    packages = {p.parent.name for p in MODELS.glob("*/modeling_*.py")
                if any(rule in p.read_text() for rule in rules)}  # fmt: skip
    owners = {t: p for p in packages for t in _config_model_types(p)}
    for model_type, ignored in settled.SLIDE_EVERY_LAYER.items():
        assert (model_type in owners) == ignored, model_type  # ignored: one mask, all layers
    for package in ("mistral", "mixtral", "minimax", "qwen3_moe", "starcoder2", "phi3", "mimi"):
        assert package in packages


def test_minimax_slides_its_full_layers_and_leaves_its_linear_ones():
    cfg = {"model_type": "minimax", **TINY, "num_hidden_layers": 3, "sliding_window": 3,
           "layer_types": ["linear_attention", "full_attention", "full_attention"]}  # fmt: skip
    layers = schedule_from_hf(cfg)["layers"]
    assert [(a["attention"], a["window"]) for a in layers] == [(False, None), (True, 3), (True, 3)]
    cfg["sliding_window"] = None  # HF: create_causal_mask
    assert [a["window"] for a in schedule_from_hf(cfg)["layers"]] == [None] * 3


@pytest.mark.parametrize(
    "model_type, bad",
    [("falcon", {"alibi": True}), ("esm", {}), ("esm", {"position_embedding_type": "absolute"})],
)
def test_dicts_of_models_without_rope_are_refused_by_name(model_type, bad):
    from posenc.torch import RotaryEmbedding

    cfg = {"model_type": model_type, **TINY, **bad}
    key = "alibi" if model_type == "falcon" else "position_embedding_type"
    for build in (schedule_from_hf, from_hf, RotaryEmbedding.from_hf):
        with pytest.raises(ValueError, match=f"{model_type} with {key}="):
            build(cfg)
    rotary = {"alibi": False} if model_type == "falcon" else {"position_embedding_type": "rotary"}
    assert schedule_from_hf(cfg | rotary)["layers"][0]["rope"] is not None


def test_falcon_and_esm_rotate_where_hf_does():
    from transformers import EsmConfig, FalconConfig
    from transformers.models.esm.modeling_esm import EsmSelfAttention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        esm = EsmConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                        position_embedding_type="rotary", vocab_size=8, pad_token_id=1)  # fmt: skip
    for kind in ("rotary", "absolute"):  # the attention rotates for "rotary" only
        with torch.device("meta"):
            attn = EsmSelfAttention(esm, position_embedding_type=kind)
        assert attn.position_embedding_type == kind
    assert EsmConfig(vocab_size=8, pad_token_id=1).position_embedding_type == "absolute"
    assert schedule_from_hf(esm)["layers"][0]["rope"] is not None
    falcon = FalconConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=2)
    assert falcon.rotary and schedule_from_hf(falcon)["layers"][0]["rope"] is not None


def test_jetmoe_dict_without_kv_channels_takes_the_class_default():
    from transformers import JetMoeConfig

    cfg = {"model_type": "jetmoe", "hidden_size": 64, "num_attention_heads": 4,
           "max_position_embeddings": 64, "rope_theta": 1e4}  # fmt: skip
    assert JetMoeConfig.from_dict(dict(cfg)).head_dim == 128
    assert from_hf(cfg)["head_dim"] == 128
    assert from_hf(cfg | {"kv_channels": 8})["head_dim"] == 8


def test_dia_decoder_softmax_scale_is_one_in_both_layouts():
    from transformers import DiaDecoderConfig
    from transformers.models.dia.modeling_dia import DiaSelfAttention

    cfg = DiaDecoderConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=16, num_hidden_layers=2)  # fmt: skip
    with torch.device("meta"):
        assert DiaSelfAttention(cfg, 0).scaling == 1
    for config in (cfg, cfg.to_dict()):  # the object and its config.json
        layers = schedule_from_hf(config)["layers"]
        assert layers[0]["softmax_factor"] * 16**-0.5 == pytest.approx(1.0)


@pytest.mark.parametrize(
    "model_type, bad, key",
    [
        ("qwen2", {"max_window_layers": "1", "sliding_window": 4, "use_sliding_window": True},
         "max_window_layers"),
        ("gemma3_text", {"sliding_window_pattern": 0, "sliding_window": 4},
         "sliding_window_pattern"),
        ("llama4_text", {"attention_chunk_size": 0}, "attention_chunk_size"),
        ("mistral", {"sliding_window": 0}, "sliding_window"),
        ("gemma3_text", {"sliding_window": True, "layer_types": ["full_attention"] * 2},
         "sliding_window"),
        ("smollm3", {"no_rope_layers": [2, "x"]}, "no_rope_layers"),
        ("smollm3", {"no_rope_layers": [1, 0.0]}, "no_rope_layers"),
        ("cohere2_moe", {"sliding_window": 4, "first_k_dense_replace": -1},
         "first_k_dense_replace"),
        ("modernbert-decoder", {"local_attention": 0}, "local_attention"),
        ("modernbert-decoder", {"global_attn_every_n_layers": 0}, "global_attn_every_n_layers"),
    ],
)  # fmt: skip
def test_values_hf_cannot_use_are_refused_by_name(model_type, bad, key):
    with pytest.raises(ValueError, match=key):
        schedule_from_hf({"model_type": model_type, **TINY, **bad})
