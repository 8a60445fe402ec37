"""Per model type of the atlas: ``posenc.hf.use(model, Schedule.from_hf(config))`` end to end.

For every model type of ``benchmarks/results/atlas.json`` that HF builds as a causal LM
(else its base model), a tiny float64 model (the atlas's tiny config,
``tools/atlas_e2e_config.py``, eager attention) runs once as HF built it and once after
``use`` with posenc's schedule read from the same dict -- the way ``use`` picks
(``"rotary"`` or ``"attention"``) and, where that was HF's rotary, again with posenc's
attention forced (``"forced"``) -- comparing the outputs (relative to the largest) and, for a
causal LM, greedy ``generate`` with the cache (8 new tokens). The status of a row is
``use``'s: ``exact`` (the output within 1e-6 and the same tokens), ``differs``,
``refused`` (``use`` or ``Schedule.from_hf`` raised a ValueError: its reason),
``no-registry`` (the attention does not go through transformers' AttentionInterface),
``not-built`` (HF's model fails on the tiny config).

Usage::

    python tools/atlas_use.py [--only llama gemma3 ...] [--out benchmarks/results/atlas_use.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
TOL = 1e-6
NEW = 8  # tokens generated
MAX_PARAMS = 200_000_000  # a tiny model is far smaller: a class that ignores the sizes


def _model(config):
    """HF's causal LM class for ``config``, else its base model class."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is not None and getattr(cls, "config_class", None) is type(config):
        return cls, True
    import importlib

    from atlas_e2e import model_class

    module = importlib.import_module(type(config).__module__.replace("configuration_",
                                                                     "modeling_"))  # fmt: skip
    return model_class(module, config), False


def _out(model, ids, lm):
    out = model(input_ids=ids, use_cache=False)
    return out.logits if lm else out.last_hidden_state


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def run_type(model_type):
    """One row: the model type's result."""
    from atlas_e2e_capture import float64_everywhere, float_is_float64
    from atlas_e2e_config import S, tiny
    from transformers import CONFIG_MAPPING

    from posenc.hf import use
    from posenc.torch import Schedule

    cfg_cls = CONFIG_MAPPING[model_type]
    d, _ = tiny(cfg_cls().to_dict(), model_type)
    try:
        config = cfg_cls.from_dict(d)
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"
        cls, lm = _model(config)
        if cls is None:
            return {"status": "not-built", "reason": "no model class for the config"}
        with torch.device("meta"):  # sized first: some classes ignore the tiny sizes
            size = sum(p.numel() for p in cls(config).parameters())
        if size > MAX_PARAMS:
            return {"status": "not-built", "reason": f"the tiny config still builds {size:,} "
                    f"parameters (> {MAX_PARAMS:,}): a size the config does not shrink"}  # fmt: skip
        torch.manual_seed(0)
        with float_is_float64():  # HF's rotary inits compute inv_freq in torch.float
            model = cls(config).to(torch.float64).eval()
        with torch.no_grad():
            for m in model.modules():  # O(1) scores, as the atlas's end-to-end check
                if isinstance(m, torch.nn.Linear):
                    m.weight.normal_(0, m.in_features**-0.5)
            for name, p in model.named_parameters():  # sink logits that take weight
                if name.endswith("sinks"):
                    p.normal_(0, 1)
        vocab = d.get("vocab_size") or 128
        ids = torch.randint(1, vocab, (2, S), generator=torch.Generator().manual_seed(0))
        with torch.no_grad(), float64_everywhere(), float_is_float64():
            want = _out(model, ids, lm)
            kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
            tokens = model.generate(ids[:, :6], **kw) if lm else None
    except Exception as err:
        at = traceback.extract_tb(err.__traceback__)[-1]
        return {"status": "not-built", "reason": f"HF's model fails on the tiny config "
                f"({at.filename.rsplit('/', 1)[-1]}:{at.lineno}): {type(err).__name__}: "
                f"{err}"[:300]}  # fmt: skip
    row, paths = {"model": cls.__name__, "lm": lm}, {}
    for forced in (False, True):
        mine = copy.deepcopy(model)
        try:
            use(mine, Schedule.from_hf(d), path="attention" if forced else "auto")
        except ValueError as err:
            status = "no-registry" if "AttentionInterface" in str(err) else "refused"
            paths["forced" if forced else "use"] = {"status": status, "reason": str(err)[:300]}
            break
        if forced and mine.posenc_path != "attention":
            break
        with torch.no_grad(), float64_everywhere(), float_is_float64():
            try:
                err = _rel(_out(mine, ids, lm), want)
                same = None if not lm else bool(torch.equal(mine.generate(ids[:, :6], **kw),
                                                            tokens))  # fmt: skip
            except Exception as exc:
                paths["forced" if forced else "use"] = {
                    "status": "differs", "path": mine.posenc_path,
                    "reason": f"{type(exc).__name__}: {exc}"[:300]}  # fmt: skip
                break
        ok = err <= TOL and same is not False
        paths["forced" if forced else "use"] = {
            "status": "exact" if ok else "differs", "path": mine.posenc_path,
            "error": f"{err:.1e}", "generate_equal": same}  # fmt: skip
        if mine.posenc_path == "attention" and not forced:
            break  # posenc's attention already
    row |= paths  # the row's status is use's; "forced" says how posenc's attention fares
    row["status"] = paths["use"]["status"]
    if "reason" in paths["use"]:
        row["reason"] = paths["use"]["reason"]
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="+", help="model types to run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "atlas_use.json"))
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    atlas = json.loads((ROOT / "benchmarks" / "results" / "atlas.json").read_text())
    types = sorted({r["model_type"] for r in atlas["rows"] if r.get("model_type")})
    rows, start = [], time.perf_counter()
    for model_type in types:
        if args.only and model_type not in args.only:
            continue
        t = time.perf_counter()
        try:
            row = {"model_type": model_type} | run_type(model_type)
        except Exception as err:  # the tool's own failure, kept as a row
            row = {"model_type": model_type, "status": "not-built",
                   "reason": f"{type(err).__name__}: {err}"[:300]}  # fmt: skip
        rows.append(row)
        print(
            f"{model_type:32s} {row['status']:12s} {row.get('use', {}).get('path', ''):10s}"
            f" {time.perf_counter() - t:5.1f}s {row.get('reason', '')[:80]}",
            flush=True,
        )
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    result = {"transformers": transformers.__version__, "torch": torch.__version__,
              "commit": commit, "seconds": round(time.perf_counter() - start, 1),
              "rows": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(counts, f"{result['seconds']} s -> {args.out}")


if __name__ == "__main__":
    main()
