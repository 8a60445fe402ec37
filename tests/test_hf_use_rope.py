"""posenc.hf.use and to_hf with RoPE: equal to HF's own model built with the same parameters.

Oracle: transformers' Llama and Gemma 3 built from hand-written ``rope_parameters`` (HF's
own rotary code), run in float64 throughout (``hf_use_models.float64_everywhere``: HF's
rates are not rounded to float32 there). Both ways in are checked: HF's rotary replaced (``"rotary"``) and posenc's attention
(``"attention"``, asked for with ``path="attention"``).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from hf_use_models import V, build, float64_everywhere, gemma3_config, llama_config, rel

from posenc.hf import to_hf, use
from posenc.scaling import NTK, DynamicNTK, Linear, Llama3, LongRoPE, YaRN
from posenc.torch import Layer, RotaryEmbedding, Schedule

TOL = 1e-10  # float64 throughout
# HF recomputes a length-dependent scaling's rates from a base it computes as a float32
# tensor (max(position_ids) + 1 in _compute_dynamic_ntk_parameters, LongRoPE's choice of
# factors likewise): ~1e-8 there, within the 1e-6 asked of float64
LENGTH_TOL = {"dynamic": 1e-6, "longrope": 1e-6}
D = 8  # Llama's head_dim: 32 / 4

# posenc's RoPE, and the rope_parameters HF builds the same rotation from (written by hand)
SCALINGS = {
    "base": (dict(base=5e5), {"rope_type": "default", "rope_theta": 5e5}),
    "linear": (dict(scaling=Linear(2.0)), {"rope_type": "linear", "factor": 2.0}),
    "ntk": (dict(scaling=NTK(3.0)), {"rope_type": "default",
                                     "rope_theta": 1e4 * 3.0 ** (D / (D - 2))}),
    "dynamic": (dict(scaling=DynamicNTK(2.0, 64), max_len=512),
                {"rope_type": "dynamic", "factor": 2.0}),
    "yarn": (dict(scaling=YaRN(4.0, 16), max_len=256),
             {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    "llama3": (dict(scaling=Llama3(8.0, 1.0, 4.0, 16), max_len=512),
               {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "longrope": (dict(scaling=LongRoPE([1, 1.5, 2, 3], [1, 2, 4, 8], 16, 4.0), max_len=512),
                 {"rope_type": "longrope", "short_factor": [1, 1.5, 2, 3],
                  "long_factor": [1, 2, 4, 8], "factor": 4.0,
                  "original_max_position_embeddings": 16}),
}  # fmt: skip


def _hf_params(p):
    return {"rope_theta": 1e4} | p


@pytest.mark.parametrize("name", sorted(SCALINGS))
@pytest.mark.parametrize("path", ["rotary", "attention"])
def test_a_llama_with_each_scaling_put_in_equals_hf_built_with_it(name, path):
    kw, params = SCALINGS[name]
    ids = torch.randint(1, V, (2, 100), generator=torch.Generator().manual_seed(1))  # > 64
    with torch.no_grad(), float64_everywhere():
        want = build(llama_config(rope_parameters=_hf_params(params)))(ids).logits
        model = use(build(llama_config()), RotaryEmbedding(D, **kw), path=path)
        assert model.posenc_path == path
        assert rel(model(ids).logits, want) < LENGTH_TOL.get(name, TOL)
        again = build(transformers.LlamaConfig.from_dict(to_hf(RotaryEmbedding(D, **kw),
                                                               llama_config())))  # fmt: skip
        assert rel(again(ids).logits, want) < 1e-12  # HF's own, from to_hf's config


# the global layers' RoPE of a Gemma 3 (head_dim 16, max_position_embeddings 64), each scaling
GEMMA_GLOBAL = {
    "base": (dict(), {"rope_type": "default"}),
    "linear": (dict(scaling=Linear(8.0)), {"rope_type": "linear", "factor": 8.0}),
    "ntk": (dict(scaling=NTK(3.0)), {"rope_type": "default",
                                     "rope_theta": 1e6 * 3.0 ** (16 / 14)}),
    "dynamic": (dict(scaling=DynamicNTK(2.0, 64), max_len=512),
                {"rope_type": "dynamic", "factor": 2.0}),
    "yarn": (dict(scaling=YaRN(8.0, 16), max_len=256),
             {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16}),
    "llama3": SCALINGS["llama3"],
    "longrope": (dict(scaling=LongRoPE([1, 1.5, 2, 3, 4, 5, 6, 8], [1, 2, 4, 8, 8, 8, 8, 8],
                                       16, 4.0), max_len=512),
                 {"rope_type": "longrope", "short_factor": [1, 1.5, 2, 3, 4, 5, 6, 8],
                  "long_factor": [1, 2, 4, 8, 8, 8, 8, 8], "factor": 4.0,
                  "original_max_position_embeddings": 16}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GEMMA_GLOBAL))
@pytest.mark.parametrize("path", ["rotary", "attention"])
def test_a_gemma3_with_a_scaled_global_rope_equals_hf_built_with_it(name, path):
    kw, params = GEMMA_GLOBAL[name]
    hf = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
          "full_attention": {"rope_theta": 1e6} | params}  # fmt: skip
    ids = torch.randint(1, V, (2, 100), generator=torch.Generator().manual_seed(2))  # > 64
    local, far = RotaryEmbedding(16), RotaryEmbedding(16, base=1e6, **kw)  # max_len 4096
    types = gemma3_config().layer_types
    scheme = Schedule([Layer(far) if t == "full_attention" else Layer(local, window=8)
                       for t in types])  # fmt: skip
    with torch.no_grad(), float64_everywhere():
        want = build(gemma3_config(rope_parameters=hf))(ids).logits
        model = use(build(gemma3_config()), scheme, path=path)
        assert model.posenc_path == path
        assert rel(model(ids).logits, want) < LENGTH_TOL.get(name, TOL)
        exported = transformers.Gemma3TextConfig.from_dict(to_hf(scheme, gemma3_config()))
        assert exported.rope_parameters["full_attention"]["rope_type"] == params["rope_type"]
        assert rel(build(exported)(ids).logits, want) < 1e-12


@pytest.mark.parametrize("make", [lambda: llama_config(rope_parameters=_hf_params(
    SCALINGS["yarn"][1])), gemma3_config])  # fmt: skip
@pytest.mark.parametrize("path", ["rotary", "attention"])
def test_the_models_own_schedule_changes_nothing(make, path):
    ids = torch.randint(1, V, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), float64_everywhere():
        hf = build(make())
        want = hf(ids).logits
        model = use(build(make()), Schedule.from_hf(make()), path=path)
        assert rel(model(ids).logits, want) < TOL
        kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(model.generate(ids[:, :8], **kw), hf.generate(ids[:, :8], **kw))


def test_to_hf_refuses_what_hf_would_build_otherwise():
    cfg = llama_config()
    with pytest.raises(ValueError, match="interleaved"):  # Llama rotates halves
        to_hf(RotaryEmbedding(D, pairing="interleaved"), cfg)
    with pytest.raises(ValueError, match="rotary_dim=4"):  # Llama's default RoPE: whole head
        to_hf(RotaryEmbedding(D, rotary_dim=4), cfg)
    with pytest.raises(ValueError, match="max_position_embeddings|DynamicNTK"):
        to_hf(RotaryEmbedding(D, scaling=DynamicNTK(2.0, 32)), cfg)  # HF's counts from 64
    from posenc.torch import ALiBi

    with pytest.raises(ValueError, match="ALiBi"):
        to_hf(Schedule.uniform(ALiBi(4), 4), cfg)
    mixed = Schedule([Layer(RotaryEmbedding(D)), Layer(RotaryEmbedding(D, base=5e5))] * 2)
    with pytest.raises(ValueError, match="differ"):
        to_hf(mixed, cfg)
    windowed = Schedule([Layer(RotaryEmbedding(D), window=4)] * 4)
    with pytest.raises(ValueError, match="window"):
        to_hf(windowed, cfg)


def test_to_hf_writes_no_older_rope_keys_and_no_attention_implementation():
    cfg = llama_config(rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    cfg._attn_implementation = "eager"
    out = to_hf(RotaryEmbedding(D, scaling=Linear(2.0)), cfg)
    assert not any(k in out for k in ("rope_scaling", "rope_theta", "_attn_implementation"))
    assert out["rope_parameters"] == {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}
