"""posenc.scaling.from_hf against transformers 5.23.0, on published model configs.

Each config below is a dict literal copied from a published ``config.json`` (the comment
names the model and where the copy was read). For every one, in its v4 form (as published)
and in a v5 ``rope_parameters`` form: HF's config object is built from the dict (no
download), and the inverse frequencies, attention factor and rotated q, k of posenc are
compared with HF's ``ROPE_INIT_FUNCTIONS`` and the model's own rotary embedding and
``apply_rotary_pos_emb``.
"""

import copy
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from expect import raises_exactly

import posenc
from posenc.scaling import DynamicNTK, Linear, LongRoPE, Proportional, YaRN, from_hf
from posenc.torch import RotaryEmbedding, apply_rope

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox as neox  # noqa: E402
from transformers.models.llama import modeling_llama as llama  # noqa: E402
from transformers.models.phi3 import modeling_phi3 as phi3  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2 as qwen2  # noqa: E402

transformers.logging.set_verbosity_error()  # HF warns about Phi-3's and Qwen's factors

# fmt: off
# meta-llama/Llama-3.1-8B config.json: NousResearch/Meta-Llama-3.1-8B's copy (a re-upload of
# the same release), quoted byte for byte in a public repository's parser tests.
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3",
    },
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 128256,
}

# Qwen/Qwen2.5-7B-Instruct config.json, the keys several public repositories quote from it
# (hidden 3584, 28 heads, 4 KV heads, 32768 positions, theta 1e6, no rope_scaling), plus the
# rope_scaling block its model card ("Processing Long Texts") tells users to add for 128K
# tokens, quoted verbatim in verl's docs.
QWEN25_7B_YARN = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
    "max_position_embeddings": 32768, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "vocab_size": 152064,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}

# microsoft/Phi-3-mini-128k-instruct config.json, April 2024 release (transformers 4.39.3,
# legacy "type": "su"), as vendored in dotnet/machinelearning
# (src/Microsoft.ML.GenAI.Phi/Resource/Config/phi-3-mini-128k-instruct-config.json).
PHI3_MINI_128K = {
    "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
    "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "long_factor": [
            1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547,
            1.2299998998641968, 1.2299998998641968, 1.2999999523162842, 1.4499999284744263,
            1.5999999046325684, 1.6499998569488525, 1.8999998569488525, 2.859999895095825,
            3.68999981880188, 5.419999599456787, 5.489999771118164, 5.489999771118164,
            9.09000015258789, 11.579999923706055, 15.65999984741211, 15.769999504089355,
            15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055,
            30.009998321533203, 32.35000228881836, 32.590003967285156, 35.56000518798828,
            39.95000457763672, 53.840003967285156, 56.20000457763672, 57.95000457763672,
            59.29000473022461, 59.77000427246094, 59.920005798339844, 61.190006256103516,
            61.96000671386719, 62.50000762939453, 63.3700065612793, 63.48000717163086,
            63.48000717163086, 63.66000747680664, 63.850006103515625, 64.08000946044922,
            64.760009765625, 64.80001068115234, 64.81001281738281, 64.81001281738281,
        ],
        "short_factor": [
            1.05, 1.05, 1.05, 1.1, 1.1, 1.1500000000000001, 1.2000000000000002,
            1.2500000000000002, 1.3000000000000003, 1.3500000000000003, 1.5000000000000004,
            2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
            2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
            2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
            2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
            2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
            2.000000000000001, 2.0500000000000007, 2.0500000000000007, 2.0500000000000007,
            2.1000000000000005, 2.1000000000000005, 2.1000000000000005, 2.1500000000000004,
            2.1500000000000004, 2.3499999999999996, 2.549999999999999, 2.5999999999999988,
            2.5999999999999988, 2.7499999999999982, 2.849999999999998, 2.849999999999998,
            2.9499999999999975,
        ],
        "type": "su",
    },
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.39.3", "use_cache": True,
    "attention_bias": False, "vocab_size": 32064,
}

# microsoft/Phi-3.5-mini-instruct config.json (current "type": "longrope" spelling), as
# quoted in a public ONNX-export script that cites it; RoPE keys only.
PHI35_MINI = {
    "hidden_size": 3072, "max_position_embeddings": 131072, "model_type": "phi3",
    "num_attention_heads": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "rope_scaling": {
        "long_factor": [
            1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
            1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661,
            3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432,
            7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945,
            24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
            32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
            50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305,
            58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203,
            62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094,
            63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
            64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
            64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062,
        ],
        "short_factor": [
            1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
            1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
            1.0699999332427979, 1.0999999046325684, 1.1099998950958252, 1.1599998474121094,
            1.1599998474121094, 1.1699998378753662, 1.2899998426437378, 1.339999794960022,
            1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788,
            1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
            2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
            2.0199997425079346, 2.0199997425079346, 2.0299997329711914, 2.0299997329711914,
            2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
            2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756,
            2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
            2.729999542236328, 2.749999523162842, 2.8399994373321533,
        ],
        "type": "longrope",
    },
    "rope_theta": 10000.0,
}

# EleutherAI/gpt-neox-20b config.json, its architecture keys (also GPTNeoXConfig's defaults,
# "a gpt-neox-20b style configuration", and Cerebras' converter defaults in a public
# repository): partial rotary through the legacy `rotary_pct` and `rotary_emb_base` keys.
GPT_NEOX_20B = {
    "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 6144, "intermediate_size": 24576,
    "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 64,
    "num_hidden_layers": 44, "rotary_emb_base": 10000, "rotary_pct": 0.25,
    "use_parallel_residual": True, "vocab_size": 50432,
}

# internlm/internlm2-chat-1_8b config.json, as quoted in two public repositories: dynamic NTK.
# model_type "internlm2" is remote code, so HF's side is a LlamaConfig with the same RoPE keys.
INTERNLM2_1_8B = {
    "architectures": ["InternLM2ForCausalLM"], "bias": False, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 32768,
    "model_type": "internlm2", "num_attention_heads": 16, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"type": "dynamic", "factor": 2.0}, "rope_theta": 1000000,
    "vocab_size": 92544,
}
# fmt: on

LLAMA_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
LLAMA_KEYS += ("max_position_embeddings", "rope_scaling", "rope_parameters", "rope_theta")

# name: (config, HF module with the model's RotaryEmbedding and apply_rotary_pos_emb)
MODELS = {
    "llama-3.1-8b": (LLAMA_31_8B, llama),
    "qwen2.5-7b-yarn": (QWEN25_7B_YARN, qwen2),
    "phi-3-mini-128k": (PHI3_MINI_128K, phi3),
    "phi-3.5-mini": (PHI35_MINI, phi3),
    "gpt-neox-20b": (GPT_NEOX_20B, neox),
    "internlm2-1.8b-dynamic": (INTERNLM2_1_8B, llama),
}


def v5(config):
    """The same config written the v5 way: everything RoPE inside ``rope_parameters``."""
    cfg = copy.deepcopy(config)
    params = cfg.pop("rope_scaling", None) or {"rope_type": "default"}
    if "type" in params:
        params["rope_type"] = params.pop("type")
    params["rope_theta"] = cfg.pop("rope_theta", None) or cfg.pop("rotary_emb_base")
    if "rotary_pct" in cfg:
        params["partial_rotary_factor"] = cfg.pop("rotary_pct")
    if "original_max_position_embeddings" in cfg:
        params["original_max_position_embeddings"] = cfg.pop("original_max_position_embeddings")
    cfg["rope_parameters"] = params
    return cfg


def hf_config(config):
    """HF's config object from the dict (no download)."""
    cfg = copy.deepcopy(config)
    if cfg["model_type"] == "internlm2":  # remote code: LlamaConfig reads the same keys
        return LlamaConfig(**{k: v for k, v in cfg.items() if k in LLAMA_KEYS})
    for params in (cfg.get("rope_scaling"), cfg.get("rope_parameters")):
        if params and params.get("type", params.get("rope_type")) == "su":
            params.pop("type", None)  # HF 5.23.0 cannot load "su" (see test below)
            params["rope_type"] = "longrope"
    return AutoConfig.for_model(**cfg)


def form(name, which):
    config = MODELS[name][0]
    return config if which == "v4" else v5(config)


def seq_lens(kwargs):
    """None plus lengths below, at and above the original length for length-dependent types."""
    scaling = kwargs["scaling"]
    if not getattr(scaling, "length_dependent", False):
        return [None]
    orig = scaling.original_max_len
    return [None, orig // 3, orig, orig + 1, 3 * orig]


def hf_frequencies(cfg, module, seq_len):
    rope_type = cfg.rope_parameters["rope_type"]
    if rope_type == "default":
        rotary = next(v for k, v in vars(module).items() if k.endswith("RotaryEmbedding"))
        inv, scale = rotary.compute_default_rope_parameters(cfg)
    else:
        inv, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, None, seq_len=seq_len)
    return inv.double().numpy(), scale


def frequencies(kwargs, seq_len=None):
    kw = {k: v for k, v in kwargs.items() if k not in ("max_len", "pairing")}
    return posenc.rope_frequencies(**kw, seq_len=seq_len)


@pytest.mark.parametrize("which", ["v4", "v5"])
@pytest.mark.parametrize("name", list(MODELS))
def test_frequencies_and_attention_factor_match_hf(name, which):
    config = form(name, which)
    kwargs = from_hf(config)
    cfg = hf_config(config)
    for seq_len in seq_lens(kwargs):
        inv, scale = frequencies(kwargs, seq_len)
        inv_hf, scale_hf = hf_frequencies(cfg, MODELS[name][1], seq_len)
        np.testing.assert_allclose(inv, inv_hf, rtol=1e-6, err_msg=f"seq_len={seq_len}")
        assert scale == pytest.approx(scale_hf, rel=1e-6)


EXPECTED = {  # what each published config means, independently of HF
    "llama-3.1-8b": (128, 500000.0, None, 131072, 1.0),
    "qwen2.5-7b-yarn": (128, 1e6, None, 131072, 0.1 * math.log(4.0) + 1),  # 4 x 32768
    "phi-3-mini-128k": (96, 1e4, None, 131072, math.sqrt(1 + math.log(32) / math.log(4096))),
    "phi-3.5-mini": (96, 1e4, None, 131072, math.sqrt(1 + math.log(32) / math.log(4096))),
    "gpt-neox-20b": (96, 1e4, 24, 2048, 1.0),
    "internlm2-1.8b-dynamic": (128, 1e6, None, 65536, 1.0),  # dynamic x2 of 32768
}


@pytest.mark.parametrize("name", list(MODELS))
def test_kwargs_of_each_published_config(name):
    kwargs = from_hf(MODELS[name][0])
    head_dim, base, rotary_dim, max_len, scale = EXPECTED[name]
    assert (kwargs["head_dim"], kwargs["base"], kwargs["rotary_dim"]) == (
        head_dim,
        base,
        rotary_dim,
    )
    assert kwargs["max_len"] == max_len
    assert frequencies(kwargs)[1] == pytest.approx(scale, rel=1e-12)  # Phi-3: 1.1902
    assert from_hf(v5(MODELS[name][0])) == kwargs  # the v5 form means the same
    assert from_hf(hf_config(MODELS[name][0])) == kwargs  # so does HF's config object


def assert_rotation_close(x, got, want, angles, scale, rotary):
    """``got`` and ``want`` rotate ``x`` by ``angles`` (b, seq, rotary // 2) up to float32.

    HF rounds the angles p * inv_freq to float32 and takes float32 sin/cos, so pair j is
    off by a few float32 epsilons of its angle: rotating a pair of norm r by an angle off by
    d moves each coordinate by at most r * d. Bound d by 8 epsilons (2**-23) of the pair's
    angle (as tests/test_rope_parity.py does with the largest angle) plus 2**-21 for sin/cos
    of small angles. A wrong convention or frequency errs by O(r). The unrotated tail of a
    partial rotary head must be untouched.
    """
    half = rotary // 2
    r = torch.hypot(x[..., :half], x[..., half:rotary]).repeat(1, 1, 1, 2)  # (b, h, s, rot)
    d = (8 * 2.0**-23 * angles + 2.0**-21)[:, None].repeat(1, 1, 1, 2)  # (b, 1, s, rot)
    assert torch.all((got[..., :rotary] - want[..., :rotary]).abs() <= scale * r * d)
    assert torch.equal(got[..., rotary:], want[..., rotary:])


def position_sets(kwargs):
    """Per-row positions; below and above the original length for length-dependent types."""
    scaling = kwargs["scaling"]
    top = getattr(scaling, "original_max_len", None) or min(kwargs["max_len"], 8192)
    gen = torch.Generator().manual_seed(0)
    sets = [torch.randint(0, top // 2, (2, 24), generator=gen)]
    if getattr(scaling, "length_dependent", False):
        sets.append(torch.randint(top // 2, 2 * top, (2, 24), generator=gen))
    return sets


@pytest.mark.parametrize("which", ["v4", "v5"])
@pytest.mark.parametrize("name", list(MODELS))
def test_rotated_qk_match_hf_apply_rotary_pos_emb(name, which):
    config = form(name, which)
    module = MODELS[name][1]
    kwargs = from_hf(config)
    head_dim = kwargs["head_dim"]
    rotary = kwargs["rotary_dim"] or head_dim
    rotary_cls = next(v for k, v in vars(module).items() if k.endswith("RotaryEmbedding"))
    torch.manual_seed(1)
    q, k = torch.randn(2, 2, 3, 24, head_dim, dtype=torch.float64).unbind(0)
    for positions in position_sets(kwargs):
        emb = rotary_cls(hf_config(config)).double()  # fresh: HF's dynamic type keeps state
        cos, sin = emb(q, positions)  # dynamic types update from max(positions) + 1
        q_hf, k_hf = module.apply_rotary_pos_emb(q, k, cos, sin)
        ours = [
            apply_rope(
                t,
                positions,
                base=kwargs["base"],
                scaling=kwargs["scaling"],
                rotary_dim=kwargs["rotary_dim"],
            )
            for t in (q, k)
        ]
        inv, scale = frequencies(kwargs, int(positions.max()) + 1)
        angles = positions.double()[..., None] * torch.from_numpy(inv)  # (b, seq, rot // 2)
        for x, got, want in zip((q, k), ours, (q_hf, k_hf), strict=True):
            assert_rotation_close(x, got, want, angles, scale, rotary)


def test_rotary_embedding_module_from_kwargs_matches_functional():
    kwargs = from_hf(GPT_NEOX_20B)
    rot = RotaryEmbedding(**kwargs).double()
    x = torch.randn(1, 2, 9, 96, dtype=torch.float64)
    pos = torch.arange(100, 109)
    qr, _ = rot.rope(x, x, pos)
    want = apply_rope(x, pos, base=kwargs["base"], rotary_dim=kwargs["rotary_dim"])
    torch.testing.assert_close(qr, want, rtol=0, atol=1e-6)  # float32 tables
    assert rot.rotary_dim == 24 and rot.max_len == 2048


# -- HF's reading rules, one at a time -----------------------------------------------------
def small(rope_scaling=None, **top):
    """A small Llama-style config.json (head_dim 64) with the given rope_scaling."""
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4}
    cfg |= {"max_position_embeddings": 3000, "rope_theta": 10000.0, **top}
    if rope_scaling is not None:
        cfg["rope_scaling"] = rope_scaling
    return cfg


def assert_matches_hf(config, seq_len=None):
    kwargs = from_hf(config)
    cfg = AutoConfig.for_model(**copy.deepcopy(config))
    inv, scale = frequencies(kwargs, seq_len)
    inv_hf, scale_hf = hf_frequencies(cfg, llama, seq_len)
    np.testing.assert_allclose(inv, inv_hf, rtol=1e-6)
    assert scale == pytest.approx(scale_hf, rel=1e-6)
    return kwargs


YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512}
YARN_VARIANTS = {  # each leaves out or sets one key HF has a rule for
    "defaults": YARN,
    "no_original": {"rope_type": "yarn", "factor": 8.0},  # -> max_position_embeddings (3000)
    "factor_null": {**YARN, "factor": None},  # -> max_position_embeddings / original = 8
    "mscale_alone": {**YARN, "mscale": 0.707},  # ignored without mscale_all_dim
    "mscale_pair": {**YARN, "mscale": 0.707, "mscale_all_dim": 1.0},  # DeepSeek's ratio
    "mscale_zero": {**YARN, "mscale": 0.0, "mscale_all_dim": 1.0},  # falsy: plain rule
    "attention_factor": {**YARN, "attention_factor": 0.9},
    "betas": {**YARN, "beta_fast": 16, "beta_slow": 2},
    "betas_zero": {**YARN, "beta_fast": 0, "beta_slow": 0},  # `or`: back to 32 and 1
    "no_truncate": {**YARN, "truncate": False},
    "factor_below_one": {**YARN, "factor": 0.5},  # attention factor 1
}


@pytest.mark.parametrize("variant", list(YARN_VARIANTS))
def test_yarn_defaults_match_hf(variant):
    kwargs = assert_matches_hf(small(YARN_VARIANTS[variant]))
    assert isinstance(kwargs["scaling"], YaRN)


LONGROPE = {"rope_type": "longrope", "short_factor": [1 + j / 16 for j in range(32)]}
LONGROPE["long_factor"] = [1.1**j for j in range(32)]
LONGROPE_VARIANTS = {
    "factor_from_lengths": {**LONGROPE, "original_max_position_embeddings": 512},  # 8
    "factor_given": {**LONGROPE, "original_max_position_embeddings": 512, "factor": 2.0},
    "attention_factor": {**LONGROPE, "original_max_position_embeddings": 512, "factor": 2.0}
    | {"attention_factor": 1.5},
    "no_original": LONGROPE,  # -> max_position_embeddings (3000): factor 1, attention 1
}


@pytest.mark.parametrize("seq_len", [None, 512, 513, 5000])
@pytest.mark.parametrize("variant", list(LONGROPE_VARIANTS))
def test_longrope_defaults_match_hf(variant, seq_len):
    assert_matches_hf(small(LONGROPE_VARIANTS[variant]), seq_len)


@pytest.mark.parametrize("seq_len", [None, 100, 3000, 3001, 10000])
def test_dynamic_and_linear_match_hf(seq_len):
    kwargs = assert_matches_hf(small({"type": "dynamic", "factor": 3.0}), seq_len)
    assert kwargs["scaling"] == DynamicNTK(3.0, 3000)  # original length: max_position_embeddings
    # HF's dynamic type ignores an original_max_position_embeddings in rope_scaling
    dynamic = {"type": "dynamic", "factor": 3.0, "original_max_position_embeddings": 1000}
    assert assert_matches_hf(small(dynamic), seq_len)["scaling"] == DynamicNTK(3.0, 3000)
    kwargs = assert_matches_hf(small({"type": "linear", "factor": 3.0}), seq_len)
    assert kwargs["scaling"] == Linear(3.0)


def test_partial_rotary_factor_matches_hf():
    kwargs = assert_matches_hf(small(YARN, partial_rotary_factor=0.5))
    assert kwargs["rotary_dim"] == 32


@pytest.mark.parametrize("fraction", [0.25, 0.3])  # 0.3: 19.2 // 2 = 9 rotated pairs
def test_proportional_matches_hf(fraction):
    """Gemma 4's global layers: the exponent keeps the full head width, the rest is not rotated."""
    params = {"rope_type": "proportional", "partial_rotary_factor": fraction, "factor": 2.0}
    kwargs = assert_matches_hf(small(params))
    assert kwargs["rotary_dim"] is None and kwargs["scaling"] == Proportional(fraction, 2.0)
    torch.manual_seed(2)
    q, k = torch.randn(2, 1, 2, 10, 64, dtype=torch.float64).unbind(0)
    positions = torch.randint(0, 3000, (1, 10))
    cos, sin = llama.LlamaRotaryEmbedding(AutoConfig.for_model(**small(params)))(q, positions)
    q_hf, _ = llama.apply_rotary_pos_emb(q, k, cos, sin)
    got = apply_rope(q, positions, base=kwargs["base"], scaling=kwargs["scaling"])
    inv, _ = frequencies(kwargs)
    angles = positions.double()[..., None] * torch.from_numpy(inv)
    assert_rotation_close(q, got, q_hf, angles, 1.0, 64)


def test_type_and_rope_type_keys():
    by_type = from_hf(
        small({"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512})
    )
    assert by_type == from_hf(small(YARN))
    both = small({"type": "linear", "rope_type": "dynamic", "factor": 2.0})
    assert AutoConfig.for_model(**copy.deepcopy(both)).rope_parameters["rope_type"] == "dynamic"
    assert isinstance(from_hf(both)["scaling"], DynamicNTK)  # rope_type wins, as in HF


def test_rope_scaling_wins_over_rope_parameters_and_theta_inside_wins():
    cfg = small({"rope_type": "linear", "factor": 2.0}, rope_parameters={"rope_type": "default"})
    assert from_hf(cfg)["scaling"] == Linear(2.0)
    assert_matches_hf(cfg)
    cfg = small(None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    assert from_hf(cfg)["base"] == 500.0
    assert_matches_hf(cfg)


def test_top_level_original_max_position_embeddings_wins():
    cfg = small(YARN, original_max_position_embeddings=1024)  # rope_scaling says 512
    assert from_hf(cfg)["scaling"].original_max_len == 1024
    assert_matches_hf(cfg)  # HF re-standardizes when it builds the frequencies
    # Phi3Config declares it (default 4096): it overrides the rope_scaling value when absent
    phi = copy.deepcopy(PHI35_MINI)
    del phi["original_max_position_embeddings"]
    phi["rope_scaling"]["original_max_position_embeddings"] = 2048
    kwargs = from_hf(phi)
    assert kwargs["scaling"].original_max_len == 4096
    assert kwargs["scaling"] == from_hf(hf_config(phi))["scaling"]


def test_legacy_su_is_longrope_which_hf_5_23_cannot_load():
    with pytest.raises(KeyError, match="original_max_position_embeddings"):
        AutoConfig.for_model(**copy.deepcopy(PHI3_MINI_128K))  # standardizes before renaming
    scaling = from_hf(PHI3_MINI_128K)["scaling"]
    assert isinstance(scaling, LongRoPE) and scaling.factor == 32.0
    assert scaling.short_factor[5] == 1.1500000000000001 and scaling.long_factor[-1] > 64
    # a model type HF does not know (Phi-3-small's remote-code "phi3small" says "su" too)
    other = {**copy.deepcopy(PHI3_MINI_128K), "model_type": "phi3small"}
    assert from_hf(other, pairing="half")["scaling"] == scaling
    # Phi3Config also renames "yarn" to "longrope" (its early configs said "yarn")
    phi = copy.deepcopy(PHI35_MINI)
    phi["rope_scaling"]["type"] = "yarn"
    assert from_hf(phi) == from_hf(PHI35_MINI) == from_hf(hf_config(phi))
    assert hf_config(phi).rope_parameters["rope_type"] == "longrope"


@pytest.mark.parametrize("pct, base", [(0.5, 1000), (1.0, 10000)])
def test_gpt_neox_legacy_keys_match_hf(pct, base):
    config = {**GPT_NEOX_20B, "rotary_pct": pct, "rotary_emb_base": base}
    kwargs = from_hf(config)
    assert kwargs["rotary_dim"] == (None if pct == 1 else int(96 * pct))
    inv, _ = frequencies(kwargs)
    inv_hf, _ = hf_frequencies(hf_config(config), neox, None)
    np.testing.assert_allclose(inv, inv_hf, rtol=1e-6)


def test_class_defaults_come_with_the_config_object():
    neox = {k: v for k, v in GPT_NEOX_20B.items() if k not in ("rotary_pct", "rotary_emb_base")}
    assert from_hf(neox)["rotary_dim"] == 24  # GPTNeoXConfig: rotary_pct 0.25, base 10000
    assert from_hf(AutoConfig.for_model(**neox))["rotary_dim"] == 24
    mixtral = {"model_type": "mixtral", "hidden_size": 64, "num_attention_heads": 4}
    mixtral["max_position_embeddings"] = 4096
    with pytest.raises(ValueError, match="config has no rope_theta"):
        from_hf(mixtral)  # HF's default depends on the class: 1e6 for Mixtral
    assert from_hf(AutoConfig.for_model(**mixtral))["base"] == 1e6


def test_no_rope_scaling_gives_no_scaling():
    for cfg in (small(), {**small(), "rope_scaling": None}, small({})):
        kwargs = from_hf(cfg)
        assert kwargs["scaling"] is None and kwargs["rotary_dim"] is None
        expected = {"head_dim": 64, "base": 1e4, "scaling": None, "rotary_dim": None}
        assert kwargs == expected | {"max_len": 3000, "pairing": "half"}
    assert from_hf(small(head_dim=32))["head_dim"] == 32


def test_unknown_and_unsupported_types_raise():
    with pytest.raises(ValueError, match=r"unknown rope_type 'ntk_alpha'; .*5\.23\.0.*'yarn'"):
        from_hf(small({"rope_type": "ntk_alpha", "factor": 2.0}))
    with pytest.raises(ValueError, match="'axial' is the multi-axis RoPE of vision models"):
        from_hf(small({"rope_type": "axial"}))
    nested = small(None, layer_types=["full_attention", "sliding_attention"])
    nested["rope_parameters"] = {"full_attention": {"rope_type": "default"}}
    with pytest.raises(ValueError, match=r"per layer type \['full_attention'\]"):
        from_hf(nested)


def test_bad_values_raise_naming_the_parameter():
    cases = [
        (small({"rope_type": "linear", "factor": 0.0}), "factor must be a positive finite"),
        (small({"rope_type": "linear"}), "'linear' needs 'factor'"),
        (small({"rope_type": "llama3", "factor": 8.0}), "needs 'low_freq_factor'"),
        (small({**YARN, "attention_factor": -1.0}), "attention_factor must be a positive"),
        (small(YARN, original_max_position_embeddings=0), "original_max_position_embeddings"),
        (small(rope_theta=-1.0), "rope_theta must be a positive finite number, got -1.0"),
        (small(partial_rotary_factor=0.328125), "rotary width of 21 for head_dim=64"),
        ({"hidden_size": 64, "rope_theta": 1.0}, "no head_dim and no num_attention_heads"),
        ({"text_config": small(), "rope_theta": 1.0}, "multimodal config holds them in text_"),
        ({"head_dim": 8, "rope_theta": 1.0}, "no max_position_embeddings"),
        ("llama", "config must be a dict or a transformers config"),
    ]
    for cfg, message in cases:
        with pytest.raises(ValueError, match=message):
            from_hf(cfg)


def test_longrope_has_no_silent_defaults():
    with pytest.raises(TypeError):
        LongRoPE((1.0, 1.0), (2.0, 2.0))  # factor 1 (scale 1.0) would hide HF's 1.19
    with pytest.raises(ValueError, match="attention_factor must be a positive"):
        LongRoPE((1.0,), (2.0,), 10, 2.0, attention_factor=0.0)


def test_from_hf_does_not_mutate_or_import():
    config = copy.deepcopy(PHI3_MINI_128K)
    from_hf(config)
    assert config == PHI3_MINI_128K
    code = "import posenc, sys; posenc.scaling.from_hf({'head_dim': 8, 'rope_theta': 1.0, "
    code += "'max_position_embeddings': 4}); print('torch' in sys.modules, "
    code += "'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_rotary_embedding_from_hf_builds_the_module():
    from posenc.torch import RotaryEmbedding

    cfg = MODELS["phi-3-mini-128k"][0]
    rot = RotaryEmbedding.from_hf(cfg)
    kwargs = from_hf(cfg)
    assert (rot.head_dim, rot.base, rot.scaling, rot.max_len) == (
        kwargs["head_dim"],
        kwargs["base"],
        kwargs["scaling"],
        kwargs["max_len"],
    )
    assert rot.pairing == "half" and rot.scale == pytest.approx(1.1902, abs=1e-4)
    assert RotaryEmbedding.from_hf(cfg, pairing="interleaved", max_len=64).max_len == 64


# -- issue 17, item 5: class defaults, Phi-3.5-MoE, and configs HF refuses -----------------------


def _hf_config_modules():
    """(model_type, class) for every config class whose source sets partial_rotary_factor."""
    import importlib.util
    import pathlib

    from transformers import CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    models = pathlib.Path(importlib.util.find_spec("transformers.models").origin).parent
    texts = [p.read_text() for p in models.glob("*/configuration_*.py")]
    texts = [t for t in texts if "partial_rotary_factor" in t]
    return [
        (model_type, CONFIG_MAPPING[model_type])
        for model_type, cls_name in sorted(CONFIG_MAPPING_NAMES.items())
        if any(f"class {cls_name}(" in t for t in texts)
    ]


def test_partial_rotary_factor_defaults_are_those_of_hf_config_classes():
    from posenc.hf import config as _hf
    from posenc.hf import defaults

    checked = []
    for model_type, cls in _hf_config_modules():
        try:
            params = cls().rope_parameters
        except Exception:  # classes that need arguments to exist at all
            continue
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            continue  # per layer type: from_hf refuses those (tested above)
        want = params.get("partial_rotary_factor", 1.0)
        cfg = {"model_type": model_type}
        if model_type in defaults.DERIVED_PARTIAL and model_type not in defaults.LEGACY_PARTIAL:
            with pytest.raises(ValueError, match="config has no partial_rotary_factor"):
                _hf.partial_factor(cfg, {}, model_type)
        else:
            assert _hf.partial_factor(cfg, {}, model_type) == want, model_type
        checked.append(model_type)
    for name in ("phi", "glm", "nemotron", "persimmon", "stablelm", "qwen3_next", "gpt_neox"):
        assert name in checked


def _latent_attention_classes():
    from transformers import CONFIG_MAPPING

    found = []
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:  # per-layer (heterogeneous) classes cannot be built from uniform settings
            cfg = CONFIG_MAPPING[model_type](hidden_size=1200, num_attention_heads=12)
        except Exception:
            continue
        if hasattr(cfg, "qk_rope_head_dim") and hasattr(cfg, "head_dim"):
            found.append(model_type)
    return found


def test_latent_attention_head_dim_is_that_of_hf_config_classes():
    # multi-head latent attention: the class derives head_dim from qk_rope_head_dim (or
    # from qk_nope_head_dim + qk_rope_head_dim), overriding a given head_dim or not; a dict
    # read by posenc gives each class's head_dim for every combination
    from transformers import CONFIG_MAPPING

    from posenc.hf import config as _hf

    types = _latent_attention_classes()
    assert {"deepseek_v2", "deepseek_v3", "kimi_linear", "mistral4", "minicpm3"} <= set(types)
    variants = [{}, {"head_dim": 128}, {"qk_rope_head_dim": 16},
                {"qk_rope_head_dim": 32, "qk_nope_head_dim": 64},
                {"qk_rope_head_dim": 32, "qk_nope_head_dim": 96},
                {"qk_rope_head_dim": 32, "qk_nope_head_dim": 96, "head_dim": 128}]  # fmt: skip
    for model_type in types:
        for keys in variants:
            cfg = {"hidden_size": 1200, "num_attention_heads": 12, **keys}
            want = CONFIG_MAPPING[model_type](**cfg).head_dim
            assert _hf.head_dim({"model_type": model_type, **cfg}) == want, (model_type, keys)


def test_latent_attention_head_dims_are_checked_by_name():
    from posenc.hf import config as _hf

    for model_type, key in [("deepseek_v2", "qk_rope_head_dim"), ("mistral4", "qk_nope_head_dim"),
                            ("mistral4", "qk_rope_head_dim")]:  # fmt: skip
        with raises_exactly(f"{key} must be >= 1, got 0"):
            _hf.head_dim({"model_type": model_type, key: 0})
    assert _hf.head_dim({"model_type": "deepseek_v2", "qk_rope_head_dim": 1}) == 1
    assert _hf.head_dim({"model_type": "mistral4", "qk_nope_head_dim": 1}) == 1 + 64
    assert _hf.head_dim({"model_type": "mistral4", "qk_rope_head_dim": 1}) == 64 + 1


def test_a_derived_partial_factor_uses_the_class_head_dim_where_the_config_has_none():
    # MiniMax-M2 with the legacy rotary_dim and no head_dim: 32 / 128 (the class's), as HF
    from transformers import CONFIG_MAPPING

    cfg = {"hidden_size": 256, "num_attention_heads": 4, "rotary_dim": 32,
           "max_position_embeddings": 512, "rope_theta": 10000.0}  # fmt: skip
    hf = CONFIG_MAPPING["minimax_m2"](**cfg)
    assert hf.head_dim * hf.rope_parameters["partial_rotary_factor"] == 32  # the oracle
    got = from_hf({"model_type": "minimax_m2", **cfg})
    assert (got["head_dim"], got["rotary_dim"]) == (128, 32)


@pytest.mark.parametrize(
    ("model_type", "keys", "want"),
    [
        ("mistral4", {"qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "head_dim": 96}, 1 / 3),
        ("deepseek_v4", {"qk_rope_head_dim": 64, "head_dim": 512}, 0.125),
        ("minimax_m2", {"rotary_dim": 32, "head_dim": 128}, 0.25),
        ("minimax_m2", {"head_dim": 128}, 1.0),  # no legacy key: the whole head
    ],
)
def test_a_derived_partial_factor_is_the_ratio_hf_derives(model_type, keys, want):
    from transformers import CONFIG_MAPPING

    from posenc.hf import config as _hf

    hf = CONFIG_MAPPING[model_type](**keys)
    got = hf.rope_parameters.get("partial_rotary_factor")
    got = getattr(hf, "partial_rotary_factor", None) if got is None else got
    assert (1.0 if got is None else got) == pytest.approx(want, rel=1e-15)  # the oracle
    assert _hf.partial_factor(dict(keys), {}, model_type) == pytest.approx(want, rel=1e-15)
    if model_type != "minimax_m2":  # the numerator alone, or the denominator alone
        for part in (
            {"qk_rope_head_dim": keys["qk_rope_head_dim"]},
            {"head_dim": keys["head_dim"]},
        ):
            with pytest.raises(ValueError, match="HF derives it"):
                _hf.partial_factor(part, {}, model_type)


@pytest.mark.parametrize(
    "model_type", ["phi", "glm", "nemotron", "persimmon", "stablelm", "qwen3_next"]
)
def test_a_dict_without_partial_rotary_factor_gets_the_class_default(model_type):
    cfg = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 4}
    cfg |= {"max_position_embeddings": 512, "rope_theta": 10000.0, "head_dim": 64}
    want = from_hf(AutoConfig.for_model(**copy.deepcopy(cfg)))["rotary_dim"]
    assert from_hf(cfg)["rotary_dim"] == want and want in (16, 32)


PHI35_MOE = {  # microsoft/Phi-3.5-MoE-instruct's RoPE keys, with 4 pairs instead of 64
    "model_type": "phimoe", "hidden_size": 32, "num_attention_heads": 4,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "type": "longrope", "short_factor": [1.0, 1.05, 1.9, 2.8],
        "long_factor": [1.0, 1.6, 14.0, 38.0], "short_mscale": 1.243163121016122,
        "long_mscale": 1.2, "original_max_position_embeddings": 4096,
    },
}  # fmt: skip


@pytest.mark.parametrize("positions", [[0, 1, 2, 4095], [0, 4096, 9000, 20000]])
def test_phi35_moe_mscales_match_hf(positions):
    from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

    cfg = AutoConfig.for_model(**copy.deepcopy(PHI35_MOE))
    kwargs = from_hf(PHI35_MOE)
    rope = RotaryEmbedding(**kwargs)
    seq_len = max(positions) + 1
    inv, scale = frequencies(kwargs, seq_len)
    # HF's rope init (called without a length: the short factors at every length) and
    # PhimoeRotaryEmbedding's rule: long_mscale beyond the original length, else short_mscale
    inv_hf, _ = ROPE_INIT_FUNCTIONS["longrope"](cfg, None)
    np.testing.assert_allclose(inv, inv_hf.double().numpy(), rtol=1e-6)
    assert scale == PHI35_MOE["rope_scaling"]["long_mscale" if seq_len > 4096 else "short_mscale"]
    pos = torch.tensor([positions])
    angles = pos[0, :, None].double() * torch.from_numpy(inv)  # (seq, 4), float64
    want = scale * torch.stack([angles.cos(), angles.sin()], -1)
    got = rope.table(pos, torch.float64)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    cos, sin = PhimoeRotaryEmbedding(cfg)(torch.zeros(1), pos)  # HF's float32 angles
    torch.testing.assert_close(got[..., 0].float(), cos[0, :, :4], rtol=0, atol=5e-3)
    torch.testing.assert_close(got[..., 1].float(), sin[0, :, :4], rtol=0, atol=5e-3)


def test_configs_hf_refuses_or_reads_elsewhere_raise_clearly():
    with pytest.raises(ValueError, match="hidden_size must be divisible by num_attention_heads"):
        from_hf(small(hidden_size=250))
    with pytest.raises(ValueError, match="head_dim must be >= 1, got 0"):
        from_hf(small(head_dim=0))
    gemma3 = {"model_type": "gemma3", "text_config": small(), "vision_config": {}}
    with pytest.raises(ValueError, match=r"pass config\['text_config'\]"):
        from_hf(gemma3)
    assert from_hf(gemma3["text_config"])["head_dim"] == 64
    with pytest.raises(ValueError, match="HF derives it"):
        from_hf({**small(), "model_type": "mistral4"})


def test_head_dim_defaults_are_those_of_hf_config_classes():
    # a dict without head_dim: every config class of transformers says what head_dim is
    # for hidden_size=1200 and 12 heads (100 when derived, the class default when fixed;
    # no class default is 100, so a class missing from posenc's table cannot pass)
    import warnings

    from transformers import CONFIG_MAPPING

    from posenc.hf import config as _hf

    checked = 0
    for model_type, cls in sorted(CONFIG_MAPPING.items()):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = cls(hidden_size=1200, num_attention_heads=12).to_dict().get("head_dim")
        except Exception:  # classes that need other arguments to exist at all
            continue
        if want is None:
            continue
        cfg = {"model_type": model_type, "hidden_size": 1200, "num_attention_heads": 12}
        assert _hf.head_dim(cfg) == want, model_type
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("model_type, head_dim", [("gemma", 256), ("qwen3", 128), ("glm", 128)])
def test_a_dict_without_head_dim_gets_the_class_default(model_type, head_dim):
    cfg = {"model_type": model_type, "hidden_size": 1024, "num_attention_heads": 16,
           "max_position_embeddings": 512, "rope_theta": 10000.0}  # fmt: skip
    hf = AutoConfig.for_model(**copy.deepcopy(cfg))
    assert hf.head_dim == head_dim != 1024 // 16
    assert from_hf(cfg)["head_dim"] == from_hf(hf)["head_dim"] == head_dim
