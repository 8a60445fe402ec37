"""Windows HF applies under other names or by other rules, against HF's own models (5.23.0).

Each case runs a tiny HF model (float64, eager attention) to show what its attention does,
then checks that posenc's ``schedule_from_hf`` (what ``Schedule.from_hf`` builds) matches it
exactly or refuses by name: UnlimitedOCR's reference layers (the prefill plus a window over the
generated tokens), BLT's ``local_attention_window_len``, Qwen2-MoE's sliding layers without
``use_sliding_window``, Inkling's relative bias (no RoPE), Doge's content-selected keys, and
Qwen2.5-Omni's DiT (one rotated head, blocks that look both ways).
"""

from __future__ import annotations

import pytest
import torch

from posenc.hf import schedule_from_hf

transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "intermediate_size": 32, "vocab_size": 16, "max_position_embeddings": 1024}  # fmt: skip
MIN = torch.finfo(torch.float64).min


def _eager(config):
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def _grab_masks(model):
    """Per self-attention module path, the keys each query sees (filled by a forward)."""
    seen = {}
    for path, attn in model.named_modules():
        if path.endswith("self_attn"):

            def grab(mod, args, kwargs, path=path):
                mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
                seen[path] = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0

            attn.register_forward_pre_hook(grab, with_kwargs=True)
    return seen


def _causal(n, window=None):
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (k <= q) & (q - k < (window or n))


def test_unlimited_ocr_reference_layers_are_refused_by_name():
    from transformers.models.unlimited_ocr import modeling_unlimited_ocr as hf

    cfg = transformers.AutoConfig.for_model(
        "unlimited_ocr_text", **TINY | {"num_key_value_heads": 2}, num_hidden_layers=1,
        sliding_window=3, moe_intermediate_size=16, n_routed_experts=2, num_experts_per_tok=1,
    )  # fmt: skip
    assert cfg.layer_types == ["reference_sliding_attention"]
    torch.manual_seed(0)
    model = hf.UnlimitedOcrTextModel(_eager(cfg)).double().eval()
    ids, prefill = torch.tensor([[3, 7, 1, 9, 4, 2, 11, 5, 8]]), 4
    n = ids.shape[1]

    def under(visible):  # HF's model with the mask of its one layer given
        add = torch.zeros(n, n, dtype=torch.float64).masked_fill(~visible, MIN)[None, None]
        masks = {"full_attention": add, "reference_sliding_attention": add}
        return model(input_ids=ids, attention_mask=masks, use_cache=False).last_hidden_state

    with torch.no_grad():
        whole = model(input_ids=ids, use_cache=False).last_hidden_state  # one forward
        out = model(input_ids=ids[:, :prefill], use_cache=True)  # prefill, then decode
        steps = [out.last_hidden_state]
        for t in range(prefill, n):
            step = model(input_ids=ids[:, t : t + 1], past_key_values=out.past_key_values)
            steps.append(step.last_hidden_state)
        decoded = torch.cat(steps, 1)
        windowed = under(_causal(n, 3))
        k = torch.arange(n)[None, :]
        reference = under(_causal(n, 3) | (_causal(n) & (k < prefill)))
    # without a cache every earlier key is seen; decoding sees the prefill and the last 3
    # generated keys: neither posenc's full layer nor its window of 3
    assert torch.equal(whole, under(_causal(n)))
    torch.testing.assert_close(decoded, reference, rtol=0, atol=1e-12)
    assert (decoded - whole)[0, -1].abs().max() > 1e-3
    assert (decoded - windowed)[0, -1].abs().max() > 1e-3
    silent = {k: v for k, v in cfg.to_dict().items() if k not in ("layer_types", "sliding_window")}
    for given in (cfg, cfg.to_dict(), silent):  # (silent: the class's types and window of 128)
        with pytest.raises(ValueError, match="Schedule.from_hf.*'reference_sliding_attention'"):
            schedule_from_hf(given)


def _blt():
    sub = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2,
           "intermediate_size": 32, "max_position_embeddings": 64}  # fmt: skip
    local = sub | {"hidden_size_global": 32, "cross_attn_k": 1}
    return transformers.BltConfig(
        local_attention_window_len=3, patch_in_forward=False, cross_attn_k=1,
        encoder_hash_byte_group_vocab=64, encoder_hash_byte_group_size=[3],
        encoder_config=local, decoder_config=local, global_config=sub, patcher_config=sub,
    )  # fmt: skip


def test_blts_local_window_is_refused_by_name():
    from transformers.models.blt.modeling_blt import BltModel

    cfg = _blt()
    model = BltModel(_eager(cfg)).eval()
    seen = _grab_masks(model)
    with torch.no_grad():
        model(input_ids=torch.arange(6)[None] + 4, use_cache=False)
    # local_attention_window_len slides every layer of the local encoder and decoder, and the
    # decoder's config holds no window
    for path, mask in seen.items():
        if path.startswith(("local_encoder.", "local_decoder.")):
            assert torch.equal(mask, _causal(6, 3)), path
    assert getattr(cfg.decoder_config, "sliding_window", None) is None
    for given in (cfg, cfg.to_dict(), cfg.encoder_config, cfg.decoder_config,
                  cfg.decoder_config.to_dict()):  # fmt: skip
        with pytest.raises(ValueError, match="Schedule.from_hf.*local_attention_window_len"):
            schedule_from_hf(given)


@pytest.mark.parametrize("used", [False, True])
def test_qwen2_moe_sliding_layers_without_use_sliding_window_are_refused(used):
    cfg = transformers.AutoConfig.for_model(
        "qwen2_moe", **TINY, num_hidden_layers=3, sliding_window=3, use_sliding_window=used,
        layer_types=["full_attention", "sliding_attention", "full_attention"], num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(_eager(cfg)).double().eval()
    seen = _grab_masks(model)
    with torch.no_grad():
        model(input_ids=torch.arange(6)[None] % 16, use_cache=False)
    want = [seen[f"layers.{i}.self_attn"] for i in range(3)]
    if not used:  # Qwen2MoeConfig sets sliding_window = 0: the sliding layer sees no key
        assert cfg.sliding_window == 0 and not want[1].any()
        for given in (cfg, cfg.to_dict()):
            with pytest.raises(ValueError, match="Schedule.from_hf.*use_sliding_window"):
                schedule_from_hf(given)
        return
    for given in (cfg, cfg.to_dict()):
        got = [_causal(6, layer["window"]) for layer in schedule_from_hf(given)["layers"]]
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("model_type", ["inkling_text", "inkling2_text"])
def test_inkling_has_no_rope_and_is_refused_even_given_a_rope_theta(model_type):
    cfg = transformers.AutoConfig.for_model(
        model_type, **TINY | {"num_key_value_heads": 2}, num_hidden_layers=2,
        swa_num_attention_heads=2, swa_num_key_value_heads=2, swa_head_dim=16, d_rel=4,
        rel_extent=8, sliding_window_size=3, moe_intermediate_size=16, n_routed_experts=2,
        num_experts_per_tok=1, n_shared_experts=1,
    )  # fmt: skip
    model = transformers.AutoModel.from_config(_eager(cfg))
    kinds = {type(m).__name__ for m in model.modules()}
    assert not any("Rotary" in k for k in kinds)  # no rotation: a relative bias instead
    assert any(k.endswith("RelativeLogits") for k in kinds)
    assert cfg.sliding_window == 3 and "sliding_window" not in cfg.to_dict()  # attribute_map
    from posenc.torch import RotaryEmbedding

    for given in (cfg, cfg.to_dict(), {**cfg.to_dict(), "rope_theta": 1e4}):
        with pytest.raises(ValueError, match=f"{model_type}.*no RoPE.*sliding_window_size"):
            schedule_from_hf(given)
    with pytest.raises(ValueError, match=f"{model_type}.*no RoPE"):  # a pairing given
        RotaryEmbedding.from_hf({**cfg.to_dict(), "rope_theta": 1e4}, pairing="half")


def _doge_seen(**kw):
    """The keys each query of a one-layer Doge sees (its attention weights), and its config."""
    from transformers.models.doge.modeling_doge import DogeModel

    cfg = transformers.AutoConfig.for_model("doge", **TINY | kw, num_hidden_layers=1)
    torch.manual_seed(0)
    model = DogeModel(_eager(cfg)).double().eval()
    torch.nn.init.normal_(model.layers[0].self_attn.A)  # a content score that varies
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[3, 7, 1, 9, 4, 2, 11, 5]]), output_attentions=True)
    return out.attentions[0][0] > 0, cfg


def test_doges_content_selected_keys_are_refused_where_they_can_differ():
    seen, cfg = _doge_seen(keep_window_size=4)  # no window: up to 1024 keys, 4 kept
    assert all(torch.equal(h, seen[0]) for h in seen)  # (one key-value head)
    assert not torch.equal(seen[0], _causal(8)) and seen[0].sum(-1).max() == 4
    for given in (cfg, cfg.to_dict()):
        with pytest.raises(ValueError, match="Schedule.from_hf.*doge.*keep_window_size=4"):
            schedule_from_hf(given)


@pytest.mark.parametrize(
    "kw",
    [
        {"keep_window_size": 4, "sliding_window": 3},
        {"keep_window_size": 8, "max_position_embeddings": 8},
    ],
)
def test_doge_is_read_where_no_query_sees_more_keys_than_it_keeps(kw):
    seen, cfg = _doge_seen(**kw)
    for given in (cfg, cfg.to_dict()):
        (layer,) = schedule_from_hf(given)["layers"]
        assert torch.equal(seen[0], _causal(8, layer["window"]))


def test_qwen2_5_omni_dit_rotates_one_head_in_blocks_and_is_refused():
    from types import SimpleNamespace

    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf

    from posenc.torch import RotaryEmbedding

    cfg = transformers.AutoConfig.for_model(
        "qwen2_5_omni_dit", hidden_size=32, num_attention_heads=2, head_dim=16, depth=2,
        block_size=2, look_ahead_layers=[], look_backward_layers=[],
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"  # (its attention has no eager path)
    torch.manual_seed(0)
    attn = hf.DiTAttention(cfg).double().eval()
    out = attn.to_out[0]
    torch.nn.init.eye_(out.weight), torch.nn.init.zeros_(out.bias)  # heads side by side
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    cos, sin = hf.Qwen2_5OmniDiTRotaryEmbedding(cfg)(x, torch.arange(6)[None])
    with torch.no_grad():
        rotated = attn(x, (cos.double(), sin.double()))
        plain = attn(x, (torch.ones_like(cos).double(), torch.zeros_like(sin).double()))
    assert not torch.allclose(rotated[..., :16], plain[..., :16])  # head 0 rotates
    assert torch.equal(rotated[..., 16:], plain[..., 16:])  # head 1 does not
    fake = SimpleNamespace(block_size=2, num_attention_heads=1)
    diff = hf.Qwen2_5OmniToken2WavDiTModel._create_block_diff(fake, x)[0, 0]
    q, k = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert torch.equal((diff >= 0) & (diff <= 0), q // 2 == k // 2)  # a block, both ways
    for given in (cfg, cfg.to_dict()):
        for build in (schedule_from_hf, RotaryEmbedding.from_hf):
            with pytest.raises(ValueError, match="qwen2_5_omni_dit.*first head only"):
                build(given)
