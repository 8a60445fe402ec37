"""Which layers slide, against the masks of HF's own models (transformers 5.23.0).

For every model type of ``posenc.hf.settled.SLIDE_EVERY_LAYER`` and a few outside it, a tiny
HF model is built from its config class and run once (eager attention); the mask each layer's
attention module receives is the oracle. posenc reads the same config as a config object,
as ``to_dict()``, as ``to_diff_dict()`` (what ``save_pretrained`` writes: the class defaults
left out) and, where the class derives ``layer_types``, as a dict without them, and each
layer's window must see exactly the keys HF's mask lets through.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from posenc.hf import config as read
from posenc.hf import layers, schedule_from_hf, settled

transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 32, "num_attention_heads": 2, "head_dim": 16, "num_hidden_layers": 3,
        "max_position_embeddings": 1024, "vocab_size": 16, "intermediate_size": 32}  # fmt: skip
IDS = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
EXPERTS = {"num_local_experts": 2, "num_experts_per_tok": 1}
PHI4_PARTS = {
    "vision_config": {"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
    "audio_config": {"hidden_size": 16, "intermediate_size": 16, "num_blocks": 1,
                     "num_attention_heads": 2, "nemo_conv_channels": 8, "num_mel_bins": 16},
}  # fmt: skip
# model type -> (module, model class or None for AutoModel, config keywords, input)
MODELS = {
    "mistral": ("mistral", None, {}, "ids"),
    "mixtral": ("mixtral", None, EXPERTS, "ids"),
    "minimax": ("minimax", None, EXPERTS, "ids"),
    "ministral3": ("ministral3", None, {}, "ids"),
    "ministral": ("ministral", None, {}, "ids"),
    "phi3": ("phi3", None, IDS, "ids"),
    "phi4_multimodal": ("phi4_multimodal", None, IDS | PHI4_PARTS, "ids"),
    "phimoe": ("phimoe", None, EXPERTS, "ids"),
    "qwen3_moe": ("qwen3_moe", None, {"num_experts": 2, "num_experts_per_tok": 1,
                  "moe_intermediate_size": 16, "use_sliding_window": True}, "ids"),  # fmt: skip
    "starcoder2": ("starcoder2", None, IDS, "ids"),
    "doge": ("doge", None, {}, "ids"),
    "blt_patcher": ("blt", "BltPatcher", {}, "ids"),
    "voxtral_realtime_text": ("voxtral_realtime", "VoxtralRealtimeTextModel", IDS, "t_cond"),
    "voxtral_realtime_encoder": ("voxtral_realtime", "VoxtralRealtimeEncoder", {}, "embeds"),
    **{t: ("mimi", "MimiTransformerModel", {}, "hidden")
       for t in ("mimi", "mimi_encoder", "mimi_decoder")},
    **{t: ("pocket_tts_audio_tokenizer", "PocketTTSAudioTokenizerTransformerModel", {}, "hidden")
       for t in ("pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_encoder",
                 "pocket_tts_audio_tokenizer_decoder")},
    # outside the table: windows by layer_types (or the class's rule for them)
    "qwen2": ("qwen2", None, {"use_sliding_window": True, "max_window_layers": 1}, "ids"),
    "gemma2": ("gemma2", None, {}, "ids"),
    "olmo3": ("olmo3", None, {}, "ids"),
}  # fmt: skip
# config classes whose sliding_window is an int (None refused)
INT_WINDOW = {"voxtral_realtime_encoder", "mimi", "mimi_encoder", "mimi_decoder",
              "pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_encoder",
              "pocket_tts_audio_tokenizer_decoder"}  # fmt: skip
# models that build a sliding mask whatever the config, and so refuse sliding_window=None
# (create_sliding_window_causal_mask: "Could not find a `sliding_window` argument")
NEEDS_WINDOW = {"ministral", "gemma2", "olmo3"}
# model types whose pairing posenc does not know: schedule_from_hf refuses them whole, by name,
# so their layers are read by the schedule's layer rules (settled.settle, layers.layer_types)
NO_PAIRING = {"voxtral_realtime_encoder", "mimi_encoder", "mimi_decoder",
              "pocket_tts_audio_tokenizer_encoder",
              "pocket_tts_audio_tokenizer_decoder"}  # fmt: skip
# class default windows short enough to see in a sequence of their length + 2
SHORT_DEFAULT = {"blt_patcher": 512, "voxtral_realtime_encoder": 750, "mimi": 250,
                 "pocket_tts_audio_tokenizer": 250}  # fmt: skip


def _config(model_type, variant):
    module, _, extra, _ = MODELS[model_type]
    kw = TINY | extra
    if model_type == "voxtral_realtime_encoder":
        kw.pop("vocab_size")  # its attribute_map: num_key_value_heads is num_attention_heads
    else:
        kw["num_key_value_heads"] = 1
    if variant != "default":
        kw["sliding_window"] = None if variant == "none" else 3
    if variant == "layer_types":  # a layer_types key, which some models' masks never read
        kw["layer_types"] = ["linear_attention", "full_attention", "full_attention"]
        if model_type != "minimax":  # MiniMaxModel has masks for these two types only
            kw["layer_types"][:2] = ["full_attention", "sliding_attention"]
    return transformers.CONFIG_MAPPING[model_type](**kw)


def _hf_visible(model_type, config, seq):
    """Per layer, the keys each query sees in HF's model (bool ``(seq, seq)``), or None for a
    layer without softmax attention (MiniMax's lightning attention)."""
    module, name, _, given = MODELS[model_type]
    config._attn_implementation = "eager"
    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"
    torch.manual_seed(0)
    if name is None:
        model = transformers.AutoModel.from_config(config)
    else:
        pkg = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        model = getattr(pkg, name)(config)
    seen = {}
    for path, attn in model.named_modules():
        if path.endswith("self_attn") and path.startswith("layers."):

            def grab(mod, args, kwargs, path=path):
                mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
                if "Lightning" in type(mod).__name__:  # linear attention: no positions
                    seen[path] = None
                else:
                    seen[path] = mask if mask.dtype == torch.bool else mask == 0

            attn.register_forward_pre_hook(grab, with_kwargs=True)
    x = torch.randn(1, seq, config.hidden_size)
    ids = torch.zeros(1, seq, dtype=torch.long)
    inputs = {"ids": {"input_ids": ids}, "embeds": {"inputs_embeds": x},
              "hidden": {"hidden_states": x},
              "t_cond": {"input_ids": ids, "t_cond": torch.zeros(1, 1, config.hidden_size)}}
    with torch.no_grad():
        model.eval()(**inputs[given], use_cache=False)
    order = sorted(seen, key=lambda p: int(p.split(".")[-2]))
    assert len(order) == config.num_hidden_layers
    return [None if seen[p] is None else seen[p][0, 0].bool() for p in order]


def _posenc_visible(config, seq):
    cfg = read.as_dict(config)
    model_type, depth = cfg["model_type"], cfg["num_hidden_layers"]
    if model_type in NO_PAIRING:
        with pytest.raises(ValueError, match="pairing"):
            schedule_from_hf(config)
        cfg = settled.settle(cfg, model_type, depth)
        kinds = layers.layer_types(cfg, model_type, depth)
        read_layers = [(k not in layers.NO_ATTENTION, layers.window(cfg, k)) for k in kinds]
    else:
        read_layers = [(a["attention"], a["window"]) for a in schedule_from_hf(config)["layers"]]
    q, k = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    return [None if not attends else (k <= q) & (q - k < (window or seq))
            for attends, window in read_layers]  # fmt: skip


def _readings(model_type, config, variant):
    """The config as posenc may be given it."""
    out = {"object": config, "to_dict": config.to_dict(),
           "config.json": {**config.to_diff_dict(), "model_type": model_type}}  # fmt: skip
    if variant != "layer_types" and getattr(config, "layer_types", None):
        out["without layer_types"] = {k: v for k, v in config.to_dict().items()
                                      if k != "layer_types"}  # fmt: skip
    return out


CASES = [(t, v) for t in MODELS for v in ("window", "layer_types", "none", "default")
         if not (v == "none" and t in INT_WINDOW | NEEDS_WINDOW)]  # fmt: skip


@pytest.mark.parametrize("model_type, variant", CASES)
def test_each_layers_window_is_the_mask_of_hfs_model(model_type, variant):
    seq = SHORT_DEFAULT.get(model_type, 6) + 2 if variant == "default" else 8
    want = _hf_visible(model_type, _config(model_type, variant), seq)
    for how, config in _readings(model_type, _config(model_type, variant), variant).items():
        if how == "without layer_types" and model_type not in settled.SLIDE_EVERY_LAYER:
            try:  # a class rule posenc does not hold may be refused by name, never guessed
                got = _posenc_visible(config, seq)
            except ValueError as error:
                assert "no layer_types" in str(error)
                continue
        else:
            got = _posenc_visible(config, seq)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same = g is w is None or (g is not None and w is not None and torch.equal(g, w))
            assert same, f"{model_type} ({variant}, {how}): layer {i}"


def test_the_table_covers_every_model_whose_one_mask_serves_all_layers():
    """The model types sharing one mask rule (the mask built for all layers) are those the
    table marks so (its True entries); the source of each is a modeling file of HF."""
    models = Path(transformers.__file__).parent / "models"
    rules = ("create_causal_mask if self.config.sliding_window is None else create_sliding",
             "create_causal_mask if config.sliding_window is None else create_sliding",
             "causal_mask = create_sliding_window_causal_mask(")  # fmt: skip
    found = {p.parent.name for p in models.glob("*/modeling_*.py")
             if any(r in p.read_text() for r in rules)}  # fmt: skip
    # RecurrentGemma (its own block rule) and DeepSeek-V4 (refused whole) share the text
    assert found - {"recurrent_gemma", "deepseek_v4"} == {
        MODELS[t][0] for t, ignored in settled.SLIDE_EVERY_LAYER.items() if ignored
    }


@pytest.mark.parametrize("model_type", sorted(NEEDS_WINDOW))
def test_models_left_out_without_a_window_refuse_to_run(model_type):
    with pytest.raises(ValueError, match="sliding_window"):
        _hf_visible(model_type, _config(model_type, "none"), 8)
