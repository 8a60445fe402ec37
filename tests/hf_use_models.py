"""Tiny float64 transformers models for the tests of ``posenc.hf.use`` (shared helpers).

The oracle is transformers' own modeling code: HF's model built with the same rope
parameters, or -- for schemes HF does not have -- an independent forward of the Llama
decoder written here from its modules, with posenc's ``attend`` on the layer's q, k, v.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import atlas_e2e_capture as capture  # noqa: E402

V = 64  # vocabulary


def llama_config(**kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return transformers.LlamaConfig(**(base | kw))


def gemma3_config(**kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                max_position_embeddings=64, sliding_window=8, query_pre_attn_scalar=12)  # fmt: skip
    return transformers.Gemma3TextConfig(**(base | kw))


def build(config, seed=0):
    """HF's causal LM for ``config`` (a copy: ``use`` changes its model's config), float64."""
    config = copy.deepcopy(config)
    cls = transformers.Gemma3ForCausalLM if config.model_type == "gemma3_text" else (
        transformers.LlamaForCausalLM)  # fmt: skip
    torch.manual_seed(seed)
    return cls(config).to(torch.float64).eval()


@contextlib.contextmanager
def float64_everywhere():
    """HF in float64 throughout: its rotary's ``.float()``, its ``dtype=torch.float`` (the
    rates at init and per call) and its float32 softmax keep float64 (the atlas's harness,
    tools/atlas_e2e_capture.py). Build the HF models inside it too."""
    with capture.float64_everywhere(), capture.float_is_float64():
        yield


def rel(got, want):
    return float((got - want).abs().max() / want.abs().max())


def llama_by_hand(model, schedule, ids):
    """Logits of a Llama decoder computed from its modules, each layer's attention being
    posenc's ``attend`` on the layer's own q, k, v with the schedule's encoding and limits."""
    from posenc.torch import attend

    base = model.model
    x = base.embed_tokens(ids)  # (b, s, hidden)
    b, s, _ = x.shape
    for i, layer in enumerate(base.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(b, s, -1, a.head_dim).transpose(1, 2)  # (b, heads, s, d)
        k = a.k_proj(h).view(b, s, -1, a.head_dim).transpose(1, 2)  # (b, kv_heads, s, d)
        v = a.v_proj(h).view(b, s, -1, a.head_dim).transpose(1, 2)
        lay = schedule[i]
        o = attend(q, k, v, schedule.encoding_of(i), window=lay.window, chunk=lay.chunk,
                   backend="sdpa")  # (b, heads, s, d)  # fmt: skip
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, s, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(base.norm(x))  # (b, s, V)


def greedy_without_cache(model, ids, steps, attention_mask=None):
    """Greedy decoding by a full forward per token (no KV cache): the reference of generate."""
    for _ in range(steps):
        kw = {} if attention_mask is None else {"attention_mask": attention_mask}
        if attention_mask is not None:
            kw["position_ids"] = (attention_mask.cumsum(1) - 1).clamp_min(0)
        nxt = model(ids, use_cache=False, **kw).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, torch.ones_like(nxt)], 1)
    return ids
