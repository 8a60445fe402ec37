"""The atlas's end-to-end configs: a tiny config derived from a config class's default, and
the transformers 4.x flat layout (``rope_theta``, ``rope_scaling``, ``rope_local_base_freq``
...) written back from it.

Both are plain dicts, as a user downloads them: HF's config class is built from the dict
(``from_dict``, so HF converts a flat layout itself) and posenc reads the same dict.
"""

from __future__ import annotations

import copy
import inspect

S = 12  # sequence length: longer than every window and chunk below
WINDOW = 4
CHUNK = 4
VOCAB = 128
HEADS, KV_HEADS = 2, 1
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
SMALL = {"intermediate_size": 32, "moe_intermediate_size": 16,
         "shared_expert_intermediate_size": 16,
         "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_k": 2, "n_group": 1,
         "num_expert_group": 1, "topk_group": 1,
         "n_shared_experts": 1, "num_shared_experts": 1, "attention_dropout": 0.0,
         "num_kv_shared_layers": 0}  # fmt: skip
# keys of the 4.x layout that carry the sliding layers' base beside rope_theta
LOCAL_KEYS = ("rope_local_base_freq", "local_rope_theta", "swa_rope_theta")


def _head_dim(d):
    if d.get("head_dim"):
        return int(d["head_dim"])
    return int(d["hidden_size"]) // int(d["num_attention_heads"])


def _depth(d):
    """The fewest first layers that hold every layer type (and, for Llama 4 and SmolLM3,
    both values of ``no_rope_layers``), at least 2."""
    n = 2
    for key in ("layer_types", "no_rope_layers"):
        seq = d.get(key) or []
        if isinstance(seq, list) and seq:
            firsts = [seq.index(v) for v in dict.fromkeys(seq)]
            n = max(n, max(firsts) + 1)
    if d.get("no_rope_layer_interval") and not d.get("no_rope_layers"):
        n = max(n, int(d["no_rope_layer_interval"]))
    return n


def tiny(d, model_type):
    """A tiny config dict from a class-default ``to_dict()``: few layers covering every layer
    type, 2 query heads and 1 key/value head of the model's head width, a small vocabulary and
    MLP, window and chunk 4, float64. Returns ``(dict, notes)``: what was changed beyond size
    (non-positional features switched off, limits shrunk so they act within ``S`` tokens)."""
    d, notes = copy.deepcopy(d), []
    old_depth = int(d.get("num_hidden_layers") or 2)
    depth = _depth(d)
    for key, value in list(d.items()):  # every per-layer list follows the depth
        if isinstance(value, list) and len(value) == old_depth and old_depth != depth:
            d[key] = value[:depth]
    d["num_hidden_layers"] = depth
    if isinstance(d.get("per_layer_config"), dict):  # heterogeneous configs (Gemma 4)
        d["per_layer_config"] = {k: v for k, v in d["per_layer_config"].items() if int(k) < depth}
    if d.get("hidden_size") and d.get("num_attention_heads"):
        hd = _head_dim(d)
        d["hidden_size"] = HEADS * hd  # the model's head width, fewer heads
        if "head_dim" in d:
            d["head_dim"] = hd  # explicit (Ministral's class default of None fails in HF)
    d["num_attention_heads"] = HEADS
    if "num_key_value_heads" in d:  # latent attention expands its keys to every head
        d["num_key_value_heads"] = HEADS if d.get("kv_lora_rank") else KV_HEADS
    for key in d:  # Gemma 3n's per-layer inputs, Kyutai's audio: vocabularies of their own
        if "vocab_size" in key and isinstance(d[key], int):
            d[key] = VOCAB
    for key in d:
        if key.endswith("token_id") and isinstance(d[key], int) and d[key] >= VOCAB:
            d[key] = 0
    if d.get("mamba_d_head") and d.get("mamba_n_heads"):  # Granite 4's check of the state width
        width = d.get("mamba_expand", 2) * d["hidden_size"]
        d["mamba_n_heads"] = max(1, width // d["mamba_d_head"])
    for key, value in SMALL.items():
        if key in d and d[key] is not None:
            d[key] = value
    for key in d:  # linear-attention layers (Gated DeltaNet, KDA): 2 heads
        if key.startswith("linear_num_") and isinstance(d[key], int):
            d[key] = 2
    for key in EXPERTS:
        if isinstance(d.get(key), int) and d[key] > 4:
            d[key] = 4
            if d.get("num_experts_per_tok", 0) is None:  # DeepSeek-V2's default fails in HF
                d["num_experts_per_tok"] = 2
    if d.get("sliding_window"):
        d["sliding_window"] = WINDOW
    elif "sliding_window" in d and "sliding_attention" in (d.get("layer_types") or ()):
        d["sliding_window"] = WINDOW  # Step 3.5's class default (None) fails in HF's mask
        notes.append(f"sliding_window {WINDOW}: the class default None fails in HF's mask")
    if d.get("attention_window_size"):  # RecurrentGemma
        d["attention_window_size"] = WINDOW
    if d.get("local_attention"):  # ModernBERT: the whole window |i - j| <= local_attention / 2
        d["local_attention"] = 2 * WINDOW
    if d.get("attention_chunk_size"):
        d["attention_chunk_size"] = CHUNK
    if d.get("floor_scale"):
        d["floor_scale"] = CHUNK
        notes.append(f"floor_scale {CHUNK}: the query temperature changes within {S} tokens")
    if d.get("use_qk_norm") and str(model_type).startswith("llama4"):
        d["use_qk_norm"] = False
        notes.append("use_qk_norm off: Llama 4 normalises q and k after RoPE (not a position)")
    if d.get("attn_logit_softcapping"):
        d["attn_logit_softcapping"] = None
        notes.append("attn_logit_softcapping off: score soft-capping is not a position scheme")
    params = d.get("rope_parameters")
    if isinstance(params, dict) and params.get("llama_4_scaling_beta"):
        params["original_max_position_embeddings"] = CHUNK
        notes.append(f"original_max_position_embeddings {CHUNK}: the beta temperature acts "
                     f"within {S} tokens")  # fmt: skip
    return d, notes


def _converter_keys(cfg_cls):
    """The legacy keys HF's config class pops in its own ``convert_rope_params_to_dict``."""
    fn = getattr(cfg_cls, "convert_rope_params_to_dict", None)
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return set()
    return {k for k in (*LOCAL_KEYS, "global_rope_theta") if f'"{k}"' in src}


def _flat(params):
    """``rope_theta``, ``partial_rotary_factor`` and ``rope_scaling`` of one flat dict."""
    out, rest = {}, dict(params)
    out["rope_theta"] = rest.pop("rope_theta", None)
    if rest.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = rest.pop("partial_rotary_factor")
    rest.pop("partial_rotary_factor", None)
    if rest.get("rope_type", rest.get("type", "default")) != "default" or len(rest) > 1:
        out["rope_scaling"] = rest
    if out["rope_theta"] is None:
        out.pop("rope_theta")
    return out


def v4_layout(d, cfg_cls):
    """The 4.x layout of a v5 dict: ``rope_parameters`` written back as ``rope_theta`` /
    ``rope_scaling`` / ``partial_rotary_factor``, and per layer type as the full layers'
    ``rope_theta`` + ``rope_scaling`` beside the sliding layers' base under the key the
    config class reads (``rope_local_base_freq``, ``local_rope_theta`` ...). ``None`` where
    the dict has no ``rope_parameters``."""
    d = copy.deepcopy(d)
    params = d.pop("rope_parameters", None)
    if not isinstance(params, dict) or not params:
        return None
    labels = set(d.get("layer_types") or ()) | {"full_attention", "sliding_attention"}
    nested = [k for k in params if k in labels]
    if not nested:
        return d | _flat(params)
    keys = _converter_keys(cfg_cls)
    full = params.get("full_attention") or next(
        (params[k] for k in nested if params[k] and k != "sliding_attention"), None
    )  # fmt: skip
    sliding = params.get("sliding_attention")
    if full:
        flat = _flat(full)
        if "global_rope_theta" in keys:
            flat["global_rope_theta"] = flat.pop("rope_theta")
        d |= flat
    local = next((k for k in LOCAL_KEYS if k in keys), None)
    if sliding and local:
        d[local] = sliding["rope_theta"]
    elif sliding and not full:
        d |= _flat(sliding)
    return d
