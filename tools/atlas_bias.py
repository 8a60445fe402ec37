"""The atlas's score biases: ALiBi (BLOOM, MPT) and T5's buckets, HF's code against posenc.

Each row builds the model's class-default config, runs the model's own bias code (BLOOM's
``build_alibi_tensor``, MPT's ``build_mpt_alibi_tensor``, every T5-style attention's
``_relative_position_bucket``) and compares it with posenc built from the same config.
"""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import torch

N = 64  # positions

# model directory -> the attention class whose static bucket function the model uses
T5_LIKE = {
    "t5": "T5Attention", "mt5": "MT5Attention", "umt5": "UMT5Attention",
    "longt5": "LongT5Attention", "switch_transformers": "SwitchTransformersAttention",
    "pop2piano": "Pop2PianoAttention", "udop": "UdopAttention",
    "pix2struct": "Pix2StructTextAttention",
}  # fmt: skip


def _module(name):
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _config(module, name):
    for obj in vars(module).values():
        if inspect.isclass(obj) and obj.__name__.endswith("Config") and hasattr(obj, "model_type"):
            cfg = obj()
            text = getattr(cfg, "get_text_config", None)
            return text() if callable(text) else cfg
    raise ValueError(f"no config class in {name}")


def _row(name, model_type, scheme, call, err, tol, reason=None):
    status = "exact" if err <= tol else "differs"
    row = {"directory": name, "model_type": model_type, "scheme": scheme, "call": call,
           "status": status, "error": f"{err:.2e}"}  # fmt: skip
    if status != "exact":
        row["reason"] = reason or f"max difference {err:.2e} > {tol:.1e}"
    return row


def _hf_buckets(cls, cfg, rel, bidirectional):
    """The model's buckets: T5's static function, or UMT5's method of an attention layer
    (encoder: both directions; decoder: causal)."""
    params = inspect.signature(cls._relative_position_bucket).parameters
    if "bidirectional" in params:
        return cls._relative_position_bucket(
            rel, bidirectional=bidirectional, num_buckets=cfg.relative_attention_num_buckets,
            max_distance=cfg.relative_attention_max_distance,
        )  # fmt: skip
    cfg.is_decoder = not bidirectional
    with torch.device("meta"):  # the weights are not needed, only the method's settings
        layer = cls(cfg, has_relative_attention_bias=True)
    return layer._relative_position_bucket(rel)


def t5_rows():
    import posenc

    rows = []
    for name, attn in T5_LIKE.items():
        try:
            module = _module(name)
            cls = getattr(module, attn)
            cfg = _config(module, name)
        except Exception as err:  # noqa: BLE001
            rows.append({"directory": name, "model_type": name, "status": "hf-fails",
                         "reason": f"{type(err).__name__}: {err}"[:200]})  # fmt: skip
            continue
        rel = torch.arange(N)[None, :] - torch.arange(N)[:, None]  # key - query
        worst = 0
        for bidirectional in (True, False):
            want = _hf_buckets(cls, cfg, rel, bidirectional)
            got = posenc.t5_buckets(rel.numpy(), bidirectional=bidirectional,
                                    num_buckets=cfg.relative_attention_num_buckets,
                                    max_distance=cfg.relative_attention_max_distance)  # fmt: skip
            worst = max(worst, int(np.abs(got - want.numpy()).max()))
        call = (
            "T5RelativeBias(heads, num_buckets=config.relative_attention_num_buckets, "
            "max_distance=config.relative_attention_max_distance, bidirectional=...)"
        )
        rows.append(_row(name, cfg.model_type, "T5 buckets", call, worst, 0))
    return rows


def alibi_rows():
    import posenc

    rows = []
    try:  # BLOOM adds m_h * j (key position): -m_h (i - j) up to a per-query constant
        module = _module("bloom")
        cfg = _config(module, "bloom")
        mask = torch.ones(1, N)
        alibi = module.build_alibi_tensor(mask, cfg.n_head, torch.float32)  # (heads, 1, N)
        slopes = alibi[:, 0, 1].double().numpy()
        err = float(np.abs(slopes - posenc.alibi_slopes(cfg.n_head)).max())
        rows.append(_row("bloom", "bloom", "ALiBi", "ALiBi(config.n_head)", err, 1e-7))
    except Exception as err:  # noqa: BLE001
        rows.append({"directory": "bloom", "model_type": "bloom", "status": "hf-fails",
                     "reason": f"{type(err).__name__}: {err}"[:200]})  # fmt: skip
    try:  # MPT: -m_h * distance with slopes 2^(-alibi_bias_max * h / heads)
        module = _module("mpt")
        cfg = _config(module, "mpt")
        bias = module.build_mpt_alibi_tensor(cfg.n_heads, N, cfg.attn_config.alibi_bias_max)
        slopes = (bias[:, 0, 1] - bias[:, 0, 0]).double().numpy()  # (heads,)
        err = float(np.abs(slopes - posenc.alibi_slopes(cfg.n_heads)).max())
        reason = None
        if cfg.attn_config.alibi_bias_max != 8:
            reason = "MPT's alibi_bias_max other than 8 changes the slopes"
        rows.append(
            _row("mpt", "mpt", "ALiBi", "ALiBi(config.n_heads)", err, 2.0**-24 * N * 4, reason)
        )
    except Exception as err:  # noqa: BLE001
        rows.append({"directory": "mpt", "model_type": "mpt", "status": "hf-fails",
                     "reason": f"{type(err).__name__}: {err}"[:200]})  # fmt: skip
    return rows
