"""End-to-end conformance: per layer, HF's own attention against posenc's, in float64.

For a model type, HF's text model runs once on a tiny config derived from the class default
(:mod:`atlas_e2e_config`), in float64 with eager attention. Inside that forward the harness
records, per attention layer, what the model's ``apply_rotary*`` function received and
returned and what ``eager_attention_forward`` received (q, k, v) and returned (the attention
output before ``o_proj``). The pre-position q and k are the apply function's inputs, set back
into the channels where the attention module places the rotated slice (DeepSeek's latent
attention rotates the trailing channels), with any factor the module puts on the rotated
queries afterwards divided out (Ministral 3's and Mistral 4's query temperature); on a layer
without RoPE, what the attention received (Llama 4: ``q_proj``'s output, before its
temperature). posenc's ``attend`` then runs on the same q, k, v with the layer's encoding,
window and chunk from ``Schedule.from_hf`` built from the same dict, and the outputs are
compared (relative to the largest output). The same is done for the config written back in
the 4.x flat layout. HF's rotary class and its softmax cast to float32; the harness keeps
float64 there (``Tensor.float`` and ``softmax(dtype=float32)`` leave float64 as is during the
forward), so the tolerance is float64's.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import traceback

import torch
from atlas_e2e_capture import capture, float64_everywhere, pre_position
from atlas_e2e_config import S, tiny, v4_layout

_DONE = {}  # model class -> its result, within one run
TOL = 1e-6  # relative: HF computes inv_freq in float32 at init (rounded ~6e-8), the rest in float64
# a sample of models with one plain RoPE scheme, checked like the per-layer ones: half and
# adjacent pairs, partial rotary, scaled RoPE, parallel attention, M-RoPE text positions
SAMPLE = ("llama", "qwen2", "qwen3", "phi3", "olmo2", "stablelm", "gpt_neox", "cohere",
          "glm", "qwen2_vl_text")  # fmt: skip
PER_LAYER_KEYS = ("no_rope_layers", "attention_chunk_size", "sliding_window",
                  "attn_temperature_tuning", "qk_nope_head_dim", "query_pre_attn_scalar",
                  "attention_multiplier")  # fmt: skip


def per_layer_scheme(config):
    """Why ``config`` (a config object) has a per-layer scheme, or ``None``."""
    from posenc.hf.schedule import SCALE_ONE

    def get(key):
        try:
            return getattr(config, key, None)
        except Exception:  # a per-layer attribute of a heterogeneous config
            return "per layer"

    found = []
    types = get("layer_types")
    if isinstance(types, (list, tuple)) and len(set(types)) > 1:
        found.append("layer types " + ", ".join(sorted(set(types))))
    found += [key for key in PER_LAYER_KEYS if get(key)]
    params = get("rope_parameters")
    if isinstance(params, dict) and "llama_4_scaling_beta" in repr(params):
        found.append("llama_4_scaling_beta")
    if getattr(config, "model_type", None) in SCALE_ONE:
        found.append("softmax scale 1")
    return ", ".join(found) or None


def model_class(module, config):
    """HF's text model class for ``config`` in its modeling module (the base model)."""
    from transformers import PreTrainedModel

    found = [
        obj for name, obj in vars(module).items()
        if inspect.isclass(obj) and issubclass(obj, PreTrainedModel) and "For" not in name
        and "PreTrained" not in name and getattr(obj, "config_class", None) is type(config)
        and name.endswith("Model")
    ]  # fmt: skip
    found.sort(key=lambda c: (not c.__name__.endswith("TextModel"), len(c.__name__)))
    if found:
        return found[0]
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(config.model_type)  # a config class another module reuses
    return getattr(transformers, name, None) if isinstance(name, str) else None


def _posenc_layer(schedule, i, q, k, v, causal, module):
    from posenc.torch import attend

    layer = schedule[i]
    params = inspect.signature(attend).parameters
    extra = {f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)
             if f.name not in ("encoding", "sinks") and f.name in params}  # fmt: skip
    if layer.sinks:  # the layer's learned logits: the HF module's own
        extra["sinks"] = getattr(module, "sinks", None)
    return attend(q, k, v, schedule.encoding_of(i), causal=causal, backend="sdpa", **extra)


def run_layout(cfg_cls, model_cls, module, d):
    """One layout: HF's model from ``d`` against posenc from ``d``, per layer."""
    from posenc.torch import Schedule

    torch.manual_seed(0)
    try:
        config = cfg_cls.from_dict(d)
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"  # the grouped kernels take no float64
        model = model_cls(config).to(torch.float64).eval()
        with torch.no_grad():
            for m in model.modules():  # O(1) scores: q, k of unit variance per channel
                if isinstance(m, torch.nn.Linear):
                    m.weight.normal_(0, m.in_features**-0.5)
            sinks = [p for name, p in model.named_parameters() if name.endswith("sinks")]
            for p in sinks:  # logits of the order of the scores: the sinks take weight
                p.normal_(0, 1)
            ids = torch.randint(0, d["vocab_size"], (1, S))
            with capture(module, model) as calls, float64_everywhere():
                model(input_ids=ids, use_cache=False)
    except Exception as err:
        at = traceback.extract_tb(err.__traceback__)[-1]
        where = f"{at.filename.rsplit('/', 1)[-1]}:{at.lineno}"
        return {"status": "not-captured", "reason": f"HF's model fails on the tiny config "
                f"({where}): {type(err).__name__}: {err}"[:300]}  # fmt: skip
    if not calls:
        kinds = sorted(set(getattr(config, "layer_types", None) or ["?"]))
        return {"status": "not-captured", "reason": "no layer of the tiny model (layer types "
                f"{', '.join(map(str, kinds))}) calls eager_attention_forward: its attention "
                "is a function of its own"}  # fmt: skip
    try:
        schedule = Schedule.from_hf(d)
    except ValueError as err:
        return {"status": "refused", "reason": f"Schedule.from_hf: {err}"[:300]}
    types = list(getattr(config, "layer_types", None) or [None] * config.num_hidden_layers)
    seen, worst, notes = {}, 0.0, []
    for n, call in enumerate(calls):
        seen[getattr(call["module"], "layer_idx", n)] = call
    if len(schedule) != len(types):
        return {"status": "differs", "reason": f"posenc's schedule has {len(schedule)} layers, "
                f"HF's model {len(types)}"}  # fmt: skip
    for i, kind in enumerate(types):
        if i not in seen:
            has = schedule[i].encoding is not None
            notes.append(f"{i} {kind}: no attention" + ("; posenc gives it "
                         f"{type(schedule[i].encoding).__name__}" if has else ""))  # fmt: skip
            worst = max(worst, float("inf") if has else 0.0)
            continue
        call = seen[i]
        pre = pre_position(call)
        if isinstance(pre, str):
            return {"status": "not-captured", "reason": f"layer {i}: {pre}"}
        causal = bool(getattr(call["module"], "is_causal", True))
        try:
            got = _posenc_layer(schedule, i, *pre, call["v"], causal, call["module"])
        except ValueError as err:  # built, then refused at apply time: a wrong build
            return {"status": "differs", "reason": f"layer {i}: posenc's layer does not fit "
                    f"HF's q, k: {err}"[:300]}  # fmt: skip
        want = call["out"].transpose(1, 2)
        err = float((got - want).abs().max() / want.abs().max())
        worst = max(worst, err)
        notes.append(f"{i} {kind}: {err:.1e}")
    status = "exact" if worst <= TOL else "differs"
    out = {"status": status, "error": f"{worst:.1e}", "layers": notes}
    wide = [
        f"{key}={getattr(config, key)}"
        for key in ("sliding_window", "attention_chunk_size")
        if isinstance(getattr(config, key, None), int) and getattr(config, key) >= S - 1
    ]
    if wide:  # HF derived a limit the tiny config did not shrink: it does not act here
        out["unexercised"] = f"{', '.join(wide)} >= {S - 1} tokens: not exercised"
    if sinks:
        out["sinks"] = "learned sink logits drawn from N(0, 1), posenc's layers given the same"
    if status == "differs":
        bad = [n for n in notes if "posenc gives" in n or float(n.rsplit(" ", 1)[1]) > TOL]
        out["reason"] = "layers " + "; ".join(bad)
    return out


def run_e2e(module, config):
    """Both layouts of one config class: ``{"default": ..., "v4": ...}`` plus ``notes``."""
    model_cls = model_class(module, config)
    if model_cls is None:
        return {"status": "not-captured", "reason": f"no base model class of "
                f"{type(config).__name__} in {module.__name__}"}  # fmt: skip
    if model_cls in _DONE:  # a config class that several modeling modules reuse
        return _DONE[model_cls]
    module = importlib.import_module(model_cls.__module__)  # where its attention runs
    d, notes = tiny(config.to_dict(), config.model_type)
    result = {"model": model_cls.__name__, "notes": notes,
              "default": run_layout(type(config), model_cls, module, d)}  # fmt: skip
    flat = v4_layout(d, type(config))
    if flat is None:
        result["v4"] = {"status": "exact", "reason": "no rope_parameters: one layout"}
    else:
        v4 = run_layout(type(config), model_cls, module, flat)
        v4["keys"] = sorted(k for k in flat if k.startswith(("rope", "local", "global", "swa",
                                                             "partial")))  # fmt: skip
        if v4["status"] == "not-captured" and result["default"]["status"] != "not-captured":
            v4 |= {"status": "no-v4", "reason": "HF's config class does not take this "
                   f"model's parameters in the 4.x layout ({v4['reason']})"[:300]}  # fmt: skip
        result["v4"] = v4 | _reads_back(type(config), d, flat)
    order = ("differs", "not-captured", "refused", "no-v4", "exact")
    result["status"] = min((result[k]["status"] for k in ("default", "v4")), key=order.index)
    result["status"] = "exact" if result["status"] == "no-v4" else result["status"]
    _DONE[model_cls] = result
    return result


def _reads_back(cfg_cls, d, flat):
    """Whether HF reads the 4.x write-back as the same RoPE parameters as the v5 dict."""
    try:
        same = cfg_cls.from_dict(flat).rope_parameters == cfg_cls.from_dict(d).rope_parameters
    except Exception:
        return {}
    return {} if same else {"hf_reads": "HF's config class reads the 4.x write-back as other "
                            "RoPE parameters than the class default"}  # fmt: skip


def check(row, module, config):
    """``row`` with the end-to-end check merged in, for a model type with a per-layer scheme
    (or in :data:`SAMPLE`) whose rotary comparison ran: ``exact`` stays only if the attention
    output matches in every layer of both layouts."""
    if config is None or row["status"] not in ("exact", "differs"):
        return row
    why = per_layer_scheme(config)
    if why is None and row["model_type"] not in SAMPLE:
        return row
    e2e = run_e2e(module, config) | {"why": why or "a sample of plain RoPE"}
    row = row | {"e2e": e2e}
    if e2e["status"] == "exact":
        return row
    parts = [f"{k} layout {e2e[k]['status']}: {e2e[k].get('reason', '')}"
             for k in ("default", "v4") if k in e2e
             and e2e[k]["status"] not in ("exact", "no-v4")] or [e2e["reason"]]  # fmt: skip
    reason = "end to end against HF's attention, " + "; ".join(parts)
    if row["status"] == "exact":
        return row | {"status": e2e["status"], "reason": reason[:600]}
    return row | {"reason": f"{row.get('reason', '')}; {reason}"[:600]}
