"""Schedule.from_hf against transformers' own attention layers (built on the meta device:
their settings, not their weights): each layer's sliding window, RoPE or none, chunk,
query temperature and softmax scale are those the model's attention module holds."""

import math

import pytest
import torch

from posenc.torch import ChannelSlice, QueryTemperature, RotaryEmbedding, Schedule

transformers = pytest.importorskip("transformers")


def _attention_layers(module_name, attn_cls, config):
    module = __import__(f"transformers.models.{module_name}.modeling_{module_name}",
                        fromlist=[attn_cls])  # fmt: skip
    cls = getattr(module, attn_cls)
    with torch.device("meta"):
        return [cls(config, i) for i in range(config.num_hidden_layers)]


def _scale(schedule, i, head_dim):
    return schedule.encoding_of(i).softmax_scale(head_dim)


def _has_rope(enc):
    return any(isinstance(m, RotaryEmbedding) for m in enc.modules()) if enc else False


def test_gemma3_windows_bases_and_scale_are_its_attention_layers():
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(num_hidden_layers=8, query_pre_attn_scalar=200)
    s = Schedule.from_hf(cfg)
    for i, attn in enumerate(_attention_layers("gemma3", "Gemma3Attention", cfg)):
        assert s[i].window == attn.sliding_window, i
        assert _scale(s, i, cfg.head_dim) == pytest.approx(attn.scaling, rel=1e-12)
        rope = s.encoding_of(i).inner if hasattr(s.encoding_of(i), "inner") else s.encoding_of(i)
        want = cfg.rope_parameters[cfg.layer_types[i]]["rope_theta"]
        assert rope.base == want
    assert sum(layer.window is not None for layer in s) == 7  # all but every sixth slide


def test_llama4_rope_layers_chunks_and_temperature_are_its_attention_layers():
    from transformers import Llama4TextConfig

    cfg = Llama4TextConfig(num_hidden_layers=8)
    s = Schedule.from_hf(cfg)
    for i, attn in enumerate(_attention_layers("llama4", "Llama4TextAttention", cfg)):
        enc = s.encoding_of(i)
        assert _has_rope(enc) == bool(attn.use_rope), i
        want_chunk = cfg.attention_chunk_size if cfg.layer_types[i] == "chunked_attention" else None
        assert s[i].chunk == want_chunk
        if not attn.use_rope and attn.attn_temperature_tuning:
            assert isinstance(enc, QueryTemperature)
            assert (enc.scale, enc.floor, enc.shift) == (attn.attn_scale, attn.floor_scale, 1)
        assert _scale(s, i, cfg.head_dim) == pytest.approx(attn.scaling, rel=1e-12)


def test_cohere2_rotates_only_its_sliding_layers():
    from transformers import Cohere2Config

    cfg = Cohere2Config(num_hidden_layers=8)
    s = Schedule.from_hf(cfg)
    for i, attn in enumerate(_attention_layers("cohere2", "Cohere2Attention", cfg)):
        assert s[i].window == attn.sliding_window
        assert _has_rope(s.encoding_of(i)) == (attn.sliding_window is not None)


@pytest.mark.parametrize("rope", [None, {"rope_type": "yarn", "factor": 40.0, "rope_theta": 1e4,
                                         "mscale": 1.0, "mscale_all_dim": 1.0,
                                         "original_max_position_embeddings": 4096}])  # fmt: skip
def test_deepseek_v3_slice_and_softmax_scale_are_its_attention_layers(rope):
    from transformers import DeepseekV3Config

    kw = {} if rope is None else {"rope_parameters": rope}
    cfg = DeepseekV3Config(num_hidden_layers=2, **kw)
    s = Schedule.from_hf(cfg)
    (attn, _) = _attention_layers("deepseek_v3", "DeepseekV3Attention", cfg)
    enc = s.encoding_of(0)
    slice_ = next(m for m in enc.modules() if isinstance(m, ChannelSlice))
    assert (slice_.start, slice_.width) == (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim)
    assert slice_.inner.pairing == "interleaved"
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    assert _scale(s, 0, qk) == pytest.approx(attn.scaling, rel=1e-12)
    if rope is not None:  # YaRN's mscale squared: 1.3689^2
        assert attn.scaling * math.sqrt(qk) == pytest.approx(1.3688879454113936**2, rel=1e-12)


def test_ministral3_temperature_is_hf_s_function():
    from transformers import Ministral3Config
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    cfg = Ministral3Config(num_hidden_layers=2)
    s = Schedule.from_hf(cfg)
    enc = s.encoding_of(0)
    assert isinstance(enc, QueryTemperature)
    pos = torch.tensor([[0, 1, 16383, 16384, 40000, 100000]])
    params = cfg.rope_parameters
    want = get_llama_4_attn_scale(pos, params["llama_4_scaling_beta"],
                                  params["original_max_position_embeddings"])  # fmt: skip
    q = torch.ones(1, 1, pos.shape[1], enc.head_dim, dtype=torch.float64)
    plain = enc.inner.double().encode_qk(q.clone(), q.clone(), pos, pos)[0]
    got = enc.double().encode_qk(q.clone(), q.clone(), pos, pos)[0] / plain
    torch.testing.assert_close(got[0, 0, :, 0], want[0, 0, :, 0].double(), rtol=1e-6, atol=0)


def test_what_posenc_cannot_build_is_refused_by_name():
    with pytest.raises(ValueError, match="model_type 'nanochat' is not reproduced: its rotate"):
        Schedule.from_hf({"model_type": "nanochat", "num_hidden_layers": 2})
    with pytest.raises(ValueError, match="model_type 'beam' is not reproduced"):
        Schedule.from_hf({"model_type": "beam", "num_hidden_layers": 2})
    cfg = {"model_type": "not_a_model", "hidden_size": 64, "num_attention_heads": 2,
           "rope_theta": 1e4, "max_position_embeddings": 128}  # fmt: skip
    with pytest.raises(ValueError, match="model_type 'not_a_model' is not one whose pairing"):
        RotaryEmbedding.from_hf(cfg)
    assert RotaryEmbedding.from_hf(cfg, pairing="interleaved").pairing == "interleaved"


def test_config_dicts_follow_their_classes_rules_or_are_refused():
    from posenc.hf import schedule_from_hf

    base = {"hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": 256,
            "rope_theta": 1e4, "num_hidden_layers": 4, "sliding_window": 16}  # fmt: skip
    windows = lambda cfg: [layer["window"] for layer in schedule_from_hf(cfg)["layers"]]  # noqa: E731
    assert windows(base | {"model_type": "qwen2", "use_sliding_window": False}) == [None] * 4
    qwen = base | {"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 2}
    assert windows(qwen) == [None, None, 16, 16]  # HF: layers >= max_window_layers slide
    assert windows(base | {"model_type": "mistral"}) == [16] * 4
    with pytest.raises(ValueError, match="which layers of 'gemma2' slide is its config class"):
        schedule_from_hf(base | {"model_type": "gemma2"})
    llama4 = {k: v for k, v in base.items() if k != "sliding_window"} | {
        "model_type": "llama4_text"
    }
    layers = schedule_from_hf(llama4)["layers"]  # the class defaults: every 4th without RoPE
    assert [layer["rope"] is None for layer in layers] == [False, False, False, True]
    assert [layer["chunk"] for layer in layers] == [8192, 8192, 8192, None]
    assert layers[3]["temperature"] == {"scale": 0.1, "floor": 8192.0, "shift": 1}
    with pytest.raises(ValueError, match="no_rope_layers must have num_hidden_layers=4"):
        schedule_from_hf(llama4 | {"no_rope_layers": [1, 0]})
    gemma = base | {"model_type": "gemma2", "head_dim": 32,
                    "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
                    "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                              "rope_theta": 1e4}}}  # fmt: skip
    with pytest.raises(ValueError, match="no entry for the attention layer type 'full_attention'"):
        schedule_from_hf(gemma)
    mini = {k: v for k, v in base.items() if k != "sliding_window"} | {
        "model_type": "ministral3", "rope_scaling": {"rope_type": "default", "rope_theta": 1e4,
        "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 128}}  # fmt: skip
    assert schedule_from_hf(mini)["layers"][0]["temperature"] == {
        "scale": 0.1, "floor": 128.0, "shift": 0}  # fmt: skip


def test_wrappers_call_score_encodings_written_without_out():
    from posenc.torch import PositionalEncoding, SoftmaxFactor, attend

    class Plain(PositionalEncoding):
        def score_bias(self, q_positions, k_positions):  # no out= parameter
            return -torch.ones(1, 1, len(q_positions), len(k_positions))

    q = k = v = torch.randn(1, 2, 5, 8)
    with torch.no_grad():
        got = attend(q, k, v, SoftmaxFactor(Plain(), factor=1.0))
        want = attend(q, k, v, Plain())
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "module_name, attn_cls, cfg_cls",
    [("mimi", "MimiAttention", "MimiConfig"),
     ("pocket_tts_audio_tokenizer", "PocketTTSAudioTokenizerAttention",
      "PocketTTSAudioTokenizerConfig")],
)  # fmt: skip
def test_models_whose_every_layer_slides(module_name, attn_cls, cfg_cls):
    cfg = getattr(transformers, cfg_cls)(num_hidden_layers=3)
    s = Schedule.from_hf(cfg)
    for i, attn in enumerate(_attention_layers(module_name, attn_cls, cfg)):
        assert attn.sliding_window == cfg.sliding_window  # HF's rule: every layer
        assert s[i].window == attn.sliding_window, i


def test_a_bidirectional_window_is_refused_by_name():
    cfg = transformers.OpenAIPrivacyFilterConfig()
    with pytest.raises(ValueError, match="'openai_privacy_filter' is not reproduced: its "
                                         "attention is bidirectional"):  # fmt: skip
        Schedule.from_hf(cfg)
