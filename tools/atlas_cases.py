"""One modeling module of the atlas: HF's rotary class and apply function against posenc."""

from __future__ import annotations

import inspect

import torch
from atlas import S, config_class_of, hf_cos_sin, rotary_classes, tolerance
from atlas_e2e_mrope import compare_grid, is_mrope

HEADS = 2


def _build(cls, config):
    """HF's rotary class on ``config``, or on the sub-config it reads (a multimodal class's
    text config): the first that builds."""
    try:
        return config, cls(config=config)
    except AttributeError:
        for sub in _sub_configs(config):
            try:
                return sub, cls(config=sub)
            except Exception:
                continue
        raise


def _sub_configs(config):
    from transformers import PretrainedConfig

    text = getattr(config, "get_text_config", None)
    found = [text()] if callable(text) else []
    found += [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]
    return [c for c in found if c is not config]


def _apply_fn(module, config):
    """The apply function of the model's main attention: DeepSeek's interleaved one for a
    latent-attention config (unless its ``rope_interleave`` is false), else
    ``apply_rotary_pos_emb``, else the module's one ``apply_rotary*`` function."""
    fns = {name: obj for name, obj in vars(module).items()
           if name.startswith("apply_rotary") and inspect.isfunction(obj)}  # fmt: skip
    inter = fns.get("apply_rotary_pos_emb_interleave")
    mla = getattr(config, "qk_rope_head_dim", None)  # DeepSeek's latent attention uses it
    if inter is not None and mla and getattr(config, "rope_interleave", True):
        return inter
    if "apply_rotary_pos_emb" in fns:
        return fns["apply_rotary_pos_emb"]
    return next(iter(fns.values()), None)


def _call_apply(apply, q, k, table):
    """HF's apply on q, k: ``(q, k, cos, sin)``, ``(x, cos, sin)`` one tensor at a time
    (Gemma 3n), or ``(xq, xk, freqs_cis)`` with complex rates (Llama 4, DeepSeek-V2)."""
    if torch.is_tensor(table):  # complex freqs_cis
        try:
            return apply(q, k, table)
        except Exception:  # (batch, seq, heads, dim) layouts
            qr, kr = apply(q.transpose(1, 2), k.transpose(1, 2), table)
            return qr.transpose(1, 2), kr.transpose(1, 2)
    cos, sin = table
    first = next(iter(inspect.signature(apply).parameters))
    if first == "x":
        return apply(q, cos, sin), apply(k, cos, sin)
    return apply(q, k, cos, sin)


def _hf_rotate(apply, q, k, table):
    """HF's apply function on q, k (its partial-rotary convention: inside the function, or
    the first channels as most attention modules slice them)."""
    width = table.shape[-1] * 2 if torch.is_tensor(table) else table[0].shape[-1]
    if width == q.shape[-1]:
        return _call_apply(apply, q, k, table)
    try:
        return _call_apply(apply, q, k, table)
    except Exception:
        if width > q.shape[-1]:
            raise
        qr, kr = _call_apply(apply, q[..., :width], k[..., :width], table)
        return torch.cat([qr, q[..., width:]], -1), torch.cat([kr, k[..., width:]], -1)


def _layer_types(config, rot):
    params = inspect.signature(rot.forward).parameters
    kinds = getattr(rot, "layer_types", None) or getattr(config, "layer_types", None) or []
    kinds = sorted(set(kinds))
    return kinds if "layer_type" in params and kinds else [None]


def _posenc(config, layer_type):
    """posenc's rotation for ``config`` (one layer type), and the call that builds it: the
    model's :meth:`Schedule.from_hf` where the config describes layers, its first layer of
    the type, unwrapped to the rotation HF's apply function performs."""
    from posenc.torch import ChannelSlice, RotaryEmbedding, Schedule

    if not getattr(config, "num_hidden_layers", None):
        return RotaryEmbedding.from_hf(config), "RotaryEmbedding.from_hf(config)", False
    schedule = Schedule.from_hf(config)
    types = list(getattr(config, "layer_types", None) or [None] * len(schedule))
    if layer_type in types:
        i = types.index(layer_type)
    else:  # the first layer with a position (Cohere 2's full layers have none)
        i = next((j for j, layer in enumerate(schedule) if layer.encoding is not None), None)
        if i is None:  # no layer rotates: HF builds its rotary class and never applies it
            return None, "Schedule.from_hf(config)", False
    enc, sliced = schedule.encoding_of(i), False
    while hasattr(enc, "inner"):  # QueryTemperature, SoftmaxFactor: outside HF's apply
        if isinstance(enc, ChannelSlice):
            enc, sliced = enc.inner, True  # HF's rotary gives the rotated slice alone
            break
        enc = enc.inner
    if enc is None or "qk" not in enc.places:  # a softmax factor around no rotation (Zamba2)
        return None, "Schedule.from_hf(config)", False
    return enc, "Schedule.from_hf(config)", sliced


def run_case(name, module):
    rows = []
    for cls in rotary_classes(module):
        cfg_cls = config_class_of(cls, module)
        row = {"directory": name, "rotary_class": cls.__name__, "model_type": name}
        if cfg_cls is None:
            rows.append(row | {"status": "not-config", "reason": "the rotary class is not "
                               "built from a config (a helper of another class)"})  # fmt: skip
            continue
        takes = list(inspect.signature(cls.forward).parameters)[1:]
        if len(takes) < 2 or takes[1] not in ("position_ids", "pos", "positions"):
            why = (
                f"{cls.__name__}.forward takes {tuple(takes)}, no position ids: the model "
                "computes its positions inside (a vision or audio encoder's own scheme)"
            )
            rows.append(row | {"status": "not-compared", "reason": why})
            continue
        try:
            config, rot = _build(cls, cfg_cls())
            row["model_type"] = getattr(config, "model_type", name) or name
        except Exception as err:
            why = f"its class-default config: {type(err).__name__}: {err}"
            rows.append(
                row | {"status": "hf-fails", "reason": f"HF's {cls.__name__} fails on {why}"[:300]}
            )
            continue
        if _rope_type(config) == "axial":
            rows.append(_compare_axial(row, config, rot, module))
            continue
        apply = _apply_fn(module, config)
        if apply is None:
            why = "the module has no apply function: its rotation is inside the attention"
            rows.append(row | {"status": "no-apply", "reason": why})
            continue
        rows.append(_compare(row, config, rot, apply) | {"_config": config})
    return rows


def _compare(row, config, rot, apply):
    worst, calls, kinds, encs = 0.0, [], [], []
    for layer_type in _layer_types(config, rot):
        kw = {} if layer_type is None else {"layer_type": layer_type}
        params = getattr(config, "rope_parameters", None)
        if (
            layer_type is not None
            and isinstance(params, dict)
            and params.get(layer_type, 0) is None
        ):
            kinds.append(f"{layer_type} (no RoPE)")  # NoPE layers of this type
            continue

        def call_rot(x, p, kw=kw):
            return rot(x, p, **kw)

        try:
            full = hf_cos_sin(call_rot, config, list(range(S)))
            last = hf_cos_sin(call_rot, config, [S - 1])
        except Exception as err:
            return row | {"status": "hf-fails", "reason": f"HF's rotary class fails: "
                          f"{type(err).__name__}: {err}"[:300]}  # fmt: skip
        rot_width = full.shape[-1] * 2 if torch.is_tensor(full) else full[0].shape[-1]
        width = _model_head_dim(_layer_config(config, layer_type)) or rot_width
        refused = None
        try:
            enc, call, sliced = _posenc(config, layer_type)
        except Exception as err:  # reported after HF's own code has run (or failed)
            refused, sliced = str(err)[:400], False
        if refused is None and enc is None:
            why = (
                "no layer of the class-default config rotates (Schedule.from_hf: "
                f"{call}); HF builds {row['rotary_class']} but its model never applies it"
            )
            return row | {"status": "not-compared", "reason": why}
        if sliced:
            width = rot_width  # latent attention: HF rotates the slice q_pe alone
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, HEADS, S, width, generator=g)
        k = torch.randn(1, 1, S, width, generator=g)
        try:
            want_q, want_k = _hf_rotate(apply, q, k, full)
            dq, _ = _hf_rotate(apply, q[:, :, -1:], k[:, :, -1:], last)
        except Exception as err:
            why = f"head width {width}: {type(err).__name__}: {err}"
            return row | {
                "status": "hf-fails",
                "reason": f"HF's apply fails on the model's {why}"[:300],
            }
        if refused is not None:
            return row | {"status": "refused", "reason": refused}
        try:
            got_q, got_k = enc.encode_qk(q.clone(), k.clone(), range(S), range(S))
            gq, _ = enc.encode_qk(q[:, :, -1:].clone(), k[:, :, -1:].clone(), range(S - 1, S),
                                  range(S - 1, S))  # fmt: skip
        except ValueError as err:
            return row | {"status": "differs", "call": call,
                          "reason": f"posenc's encoding does not fit HF's rotation "
                                    f"(rotary width {rot_width}): {err}"[:300]}  # fmt: skip
        # scores, not tensors: DeepSeek's interleaved apply returns its pairs as halves; the
        # decode step: the last query alone against every key
        err = max(_score_error(got_q, got_k, want_q, want_k),
                  _score_error(gq, got_k, dq, want_k))  # fmt: skip
        worst = max(worst, err)
        if is_mrope(call_rot):  # text positions cannot tell M-RoPE's layout: image and video
            try:
                grid = compare_grid(call_rot, apply, config, enc, call, width, _hf_rotate,
                                    _score_error, tolerance)  # fmt: skip
            except Exception as err:  # HF's own code on 3-D positions
                grid = {"HF": {"status": "hf-fails", "reason": f"{type(err).__name__}: {err}"}}
            row = row | {"grid": grid}
        calls.append(call)
        kinds.append(layer_type)
        encs.append(enc)
    tol = tolerance(S - 1)
    status = "exact" if worst <= tol else "differs"
    out = row | {"status": status, "error": f"{worst:.2e}", "call": "; ".join(sorted(set(calls)))}
    silent = [f"{name}: {r['reason']}" for name, r in row.get("grid", {}).items()
              if r["status"] == "differs"]  # refusals by name are not silent  # fmt: skip
    if status == "exact" and silent:
        out |= {"status": "differs", "reason": "M-RoPE, text positions exact; " + "; ".join(silent)}
    out |= _describe(config, encs)
    if kinds != [None]:
        out["layer_types"] = kinds
    if status == "differs" and not silent:
        out["reason"] = f"max difference {worst:.2e} > tolerance {tol:.1e}"
    return out


def _score_error(q, k, want_q, want_k):
    """Largest difference of the scores q . k of every query with every key (per head),
    relative to the product of the largest norms (what attention sees)."""
    k, want_k = (t.expand(-1, q.shape[1], -1, -1) for t in (k, want_k))
    got, want = q @ k.transpose(-1, -2), want_q @ want_k.transpose(-1, -2)  # (b, h, sq, sk)
    scale = float(want_q.norm(dim=-1).max() * want_k.norm(dim=-1).max())
    return float((got - want).abs().max()) / scale


def _layer_config(config, layer_type):
    """The config of one layer type of a heterogeneous config (Gemma 4's full layers are
    512 wide), else the config."""
    per_layer = getattr(config, "per_layer_config", None)
    if layer_type is None or per_layer is None:
        return config
    try:
        return per_layer[layer_type]
    except Exception:
        return config


def _model_head_dim(config):
    """The attention's head width as HF's modeling code takes it."""

    def get(key):
        try:
            return getattr(config, key, None)
        except Exception:  # a per-layer attribute of a heterogeneous config
            return None

    hd = get("head_dim")
    if hd:
        return int(hd)
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    return hidden // heads if hidden and heads else None


def _rope_type(config):
    params = getattr(config, "rope_parameters", None)
    return params.get("rope_type") if isinstance(params, dict) else None


GRID = (6, 8)  # rows x columns of patches


def _compare_axial(row, config, rot, module):
    """A vision encoder's 2-D RoPE: HF's rotary class on (row, column) patch coordinates and
    the module's vision apply function, against AxialRotaryEmbedding.from_hf."""
    from posenc.torch import AxialRotaryEmbedding

    h, w = GRID
    pos = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1)
    pos = pos.reshape(h * w, 2)  # (n, 2): (row, column)
    apply = next((f for name, f in vars(module).items() if name.startswith("apply_rotary")
                  and "vision" in name and inspect.isfunction(f)), None)  # fmt: skip
    if apply is None and _apply_fn(module, config) is not None:
        main = _apply_fn(module, config)  # (q, k, cos, sin) with heads first: transpose

        def apply(q, k, cos, sin):
            qr, kr = _call_apply(main, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                 (cos[None], sin[None]))  # fmt: skip
            return qr[0].transpose(0, 1), kr[0].transpose(0, 1)

    try:
        cos, sin = rot(torch.zeros(h * w, 8), pos)
        width = cos.shape[-1]
        g = torch.Generator().manual_seed(0)
        q = torch.randn(h * w, HEADS, width, generator=g)  # (n, heads, dim): HF's vision layout
        k = torch.randn(h * w, HEADS, width, generator=g)
        if apply is None:
            raise ValueError("no apply_rotary*vision function")
        want_q, want_k = apply(q, k, cos, sin)
    except Exception as err:
        why = f"{type(err).__name__}: {err}"
        return row | {"status": "hf-fails", "reason": f"HF's vision rotation fails: {why}"[:300]}
    call = "AxialRotaryEmbedding.from_hf(config)"
    try:  # a refusal is a ValueError at build time; one at apply time is a wrong build
        enc = AxialRotaryEmbedding.from_hf(config)
    except ValueError as err:
        return row | {"status": "refused", "reason": str(err)[:300], "scheme": "2-D axial"}
    try:
        got_q, got_k = enc.encode_qk(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                     pos[None], pos[None])  # fmt: skip
    except ValueError as err:
        why = f"{call} builds, but does not fit HF's rotation (width {width}): {err}"
        return row | {"status": "differs", "reason": why[:300], "scheme": "2-D axial",
                      "call": call}  # fmt: skip
    to_hf = lambda t: t[0].transpose(0, 1)  # noqa: E731  (1, heads, n, dim) -> (n, heads, dim)
    err = _score_error(to_hf(got_q).transpose(0, 1)[None], to_hf(got_k).transpose(0, 1)[None],
                       want_q.transpose(0, 1)[None], want_k.transpose(0, 1)[None])  # fmt: skip
    tol = tolerance(max(h, w))
    status = "exact" if err <= tol else "differs"
    out = row | {"status": status, "error": f"{err:.2e}", "scheme": "2-D axial",
                 "call": "AxialRotaryEmbedding.from_hf(config)"}  # fmt: skip
    if status == "differs":
        out["reason"] = (
            f"max difference {err:.2e} > tolerance {tol:.1e}: its 2-D RoPE lays out the "
            "(row, column) pairs otherwise than posenc's axial RoPE"
        )
    return out


def _describe(config, encs):
    """What posenc built: scheme, pairing, scaling, rotated fraction, and the schedule."""
    from posenc.torch import MRoPE, Schedule

    out = {"scheme": "M-RoPE" if any(isinstance(e, MRoPE) for e in encs) else "RoPE"}
    if encs:
        e = encs[0]
        out["pairing"] = getattr(e, "pairing", None)
        scaling = getattr(e, "scaling", None)
        out["scaling"] = type(scaling).__name__ if scaling is not None else "none"
        if getattr(e, "rotary_dim", None) and e.rotary_dim != e.head_dim:
            out["rotated"] = f"{e.rotary_dim}/{e.head_dim}"
    if getattr(config, "num_hidden_layers", None):
        try:
            s = Schedule.from_hf(config)
        except ValueError:
            return out
        windows = sorted({layer.window for layer in s if layer.window})
        chunks = sorted({layer.chunk for layer in s if layer.chunk})
        nope = sum(layer.encoding is None for layer in s)
        names = {type(layer.encoding).__name__ for layer in s if layer.encoding is not None}
        parts = [f"{len(s)} layers"]
        if windows:
            parts.append(f"{sum(bool(x.window) for x in s)} sliding (window {windows[0]})")
        if chunks:
            parts.append(f"{sum(bool(x.chunk) for x in s)} chunked ({chunks[0]})")
        if nope:
            parts.append(f"{nope} without position")
        for name, what in (
            ("QueryTemperature", "query temperature"),
            ("ChannelSlice", "rotated slice"),
            ("SoftmaxFactor", "softmax factor"),
        ):
            if name in names:
                parts.append(what)
        out["layers"] = ", ".join(parts)
    return out
