"""posenc.hf.use where a review found it silently wrong or crashing (each fixed, each here).

Oracles: HF's own model, a full forward without cache, and the refusals' messages.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from hf_use_models import V, build, gemma3_config, llama_config, rel

from posenc.hf import use
from posenc.torch import ALiBi, Layer, RotaryEmbedding, Schedule, SoftmaxFactor


def _ids(b, n, seed):
    return torch.randint(3, V, (b, n), generator=torch.Generator().manual_seed(seed))


def test_one_encoding_keeps_the_models_windows_and_its_cache_decodes_exactly():
    model = use(build(gemma3_config()), ALiBi(2))  # Gemma 3: sliding layers of window 8
    assert [lay.window for lay in model.posenc_schedule] == [8] * 5 + [None]
    x = _ids(1, 20, 1)
    with torch.no_grad():
        full = model(x, use_cache=False).logits[:, -1]
        first = model(x[:, :-1], use_cache=True)
        step = model(x[:, -1:], past_key_values=first.past_key_values, use_cache=True)
    assert rel(step.logits[:, -1], full) < 1e-12


def test_a_window_wider_than_hfs_sliding_cache_is_refused():
    wide = Schedule([Layer(ALiBi(2))] * 6)  # no window where HF's cache keeps 8 positions
    with pytest.raises(ValueError, match="cache keeps the last 8 positions"):
        use(build(gemma3_config()), wide)


def test_a_static_cache_is_refused_not_misread():
    model = use(build(llama_config()), ALiBi(4))
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static")
    with pytest.raises(ValueError, match="static cache"):
        model.generate(_ids(1, 6, 2), **kw)


def test_packed_position_ids_of_one_row_serve_a_batch_of_two():
    model = use(build(llama_config()), ALiBi(4))
    x = _ids(2, 12, 3)
    pos = torch.cat([torch.arange(7), torch.arange(5)])[None]  # (1, 12): two documents
    with torch.no_grad():
        packed = model(x, position_ids=pos).logits
        assert rel(packed[:, 7:], model(x[:, 7:]).logits) < 1e-12


def test_a_softmax_factor_sets_the_scale_and_is_continuous():
    f0 = (16 / 12) ** 0.5  # Gemma's query_pre_attn_scalar=12 on heads of 16
    x = _ids(1, 16, 4)

    def logits(factor):
        rope = lambda base: RotaryEmbedding(16, base=base)  # noqa: E731
        enc = {1e4: rope(1e4), 1e6: rope(1e6)}
        if factor is not None:
            enc = {k: SoftmaxFactor(v, factor=factor) for k, v in enc.items()}
        scheme = Schedule([Layer(enc[1e4], window=8)] * 5 + [Layer(enc[1e6])])
        with torch.no_grad():
            return use(build(gemma3_config()), scheme, path="attention")(x).logits

    own = logits(None)
    assert rel(logits(f0), own) < 1e-12  # the model's own factor, given or not
    assert rel(logits(f0 * (1 + 1e-9)), own) < 1e-6  # a factor near it: near it
    assert rel(logits(1.0), own) > 1e-3  # another factor: another scale


def test_use_leaves_another_model_of_the_same_config_alone():
    config = llama_config()
    torch.manual_seed(0)
    a = transformers.LlamaForCausalLM(config).double().eval()
    torch.manual_seed(0)
    b = transformers.LlamaForCausalLM(config).double().eval()
    x = _ids(1, 8, 5)
    with torch.no_grad():
        before = b(x).logits
        use(a, ALiBi(4))
        assert torch.equal(b(x).logits, before)
    assert b.config._attn_implementation != "posenc"


def test_changing_the_attention_after_use_is_refused():
    model = use(build(llama_config()), ALiBi(4))
    model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="without positions"):
        model(_ids(1, 4, 6))


def test_gradient_checkpointing_without_position_ids_is_refused():
    cfg = transformers.Llama4TextConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        attention_chunk_size=8, num_local_experts=1, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(cfg)
    use(model, Schedule.from_hf(cfg), path="attention")  # Llama 4 passes no position_ids
    model.activation_checkpointing_enable()
    model.train()
    with pytest.raises(ValueError, match="gradient checkpointing"):
        model(_ids(1, 8, 7), labels=_ids(1, 8, 7)).loss.backward()


def _gemma3_composite():
    text = gemma3_config(vocab_size=300, num_hidden_layers=2)
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             image_size=28, patch_size=14)  # fmt: skip
    return transformers.Gemma3Config(text_config=text, vision_config=vision,
                                     mm_tokens_per_image=4, image_token_index=299)  # fmt: skip


def test_a_composite_model_saves_reloads_and_leaves_its_twin_alone(tmp_path):
    from posenc.hf import from_pretrained

    config = _gemma3_composite()  # one config object, two models (transformers shares it)
    torch.manual_seed(0)
    a = transformers.Gemma3ForConditionalGeneration(config).eval()
    torch.manual_seed(0)
    b = transformers.Gemma3ForConditionalGeneration(config).eval()
    x = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])  # longer than the window 8
    with torch.no_grad():
        before = b(input_ids=x).logits
        use(a, ALiBi(2))
        assert torch.equal(b(input_ids=x).logits, before)
        assert b.config.text_config.rope_parameters["full_attention"]["rope_type"] == "default"
        want = a(input_ids=x).logits
    a.save_pretrained(tmp_path)
    again = from_pretrained(transformers.AutoModelForImageTextToText, tmp_path, ALiBi(2))
    with torch.no_grad():
        assert torch.equal(again.eval()(input_ids=x).logits, want)


def test_packed_rows_stay_apart_with_a_padding_mask():
    model = use(build(llama_config()), RotaryEmbedding(8), path="attention")
    a, b = _ids(1, 4, 8), _ids(1, 3, 9)
    ids = torch.cat([torch.zeros(1, 2, dtype=torch.long), a, b], 1)  # two pads, two documents
    pos = torch.tensor([[0, 0, 0, 1, 2, 3, 0, 1, 2]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        out = model(ids, position_ids=pos, attention_mask=mask).logits[:, 2:]
        alone = torch.cat([model(a).logits, model(b).logits], 1)
    assert rel(out, alone) < 1e-12


def test_softcapped_logits_are_refused_when_use_is_called():
    config = transformers.Gemma2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
    )  # fmt: skip
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        use(transformers.Gemma2ForCausalLM(config), ALiBi(2))


def test_a_model_cast_to_bf16_keeps_the_rotary_way():
    # its rotary's rates are bf16: the layout probe allows their rounding
    model = transformers.LlamaForCausalLM(llama_config()).to(torch.bfloat16)
    assert use(model, Schedule.from_hf(llama_config())).posenc_path == "rotary"
