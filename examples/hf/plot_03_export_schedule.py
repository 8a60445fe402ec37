"""
Export a schedule to a config.json
==================================

A Gemma 3 model alternates sliding-window layers (RoPE base 10 000) with global ones
(base 1 000 000). Suppose you extend its global layers with YaRN: posenc builds that as a
:class:`~posenc.torch.Schedule`, and :func:`posenc.hf.to_hf <posenc.torch.hf.to_hf>` writes the ``rope_parameters``
(per layer type, as Gemma 3's config nests them) from which transformers builds the same
model itself -- checked by reading the config back, so a config it writes never claims a
scheme transformers would build otherwise.
"""

# %%
# The model's own schedule, with YaRN on the global layers
# --------------------------------------------------------
import json
import pathlib
import tempfile

import torch
import transformers

from posenc.hf import to_hf, use
from posenc.scaling import YaRN
from posenc.torch import ALiBi, Layer, RotaryEmbedding, Schedule

config = transformers.Gemma3TextConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    sliding_window=16,
    max_position_embeddings=128,
    query_pre_attn_scalar=32,
)
own = Schedule.from_hf(config)
for i, layer in enumerate(own):  # five sliding layers (window 16), then a global one
    print(i, type(layer.encoding).__name__, layer.encoding.base, layer.window)
# posenc refuses positions past a RoPE's max_len (the config's max_position_embeddings,
# 128, for the model's own): both RoPEs get room for the 512 positions YaRN x4 reaches
far = RotaryEmbedding(32, base=1e6, scaling=YaRN(4.0, 128), max_len=512)
near = RotaryEmbedding(32, base=1e4, max_len=512)  # the sliding layers' RoPE, unscaled
extended = Schedule([Layer(far) if layer.window is None else Layer(near, window=layer.window)
                     for layer in own])  # fmt: skip

# %%
# The config transformers builds it from
# --------------------------------------
exported = to_hf(extended, config)
print(json.dumps(exported["rope_parameters"], indent=1))
with tempfile.TemporaryDirectory() as path:
    pathlib.Path(path, "config.json").write_text(json.dumps(exported))
    native_config = transformers.AutoConfig.from_pretrained(path)

torch.manual_seed(0)
native = transformers.Gemma3ForCausalLM(native_config).eval()  # HF's own YaRN
mine = transformers.Gemma3ForCausalLM(config).eval()
mine.load_state_dict(native.state_dict())
use(mine, extended)  # posenc's schedule in the same weights
ids = torch.randint(0, 256, (1, 200))
with torch.no_grad():
    diff = (native(ids).logits - mine(ids).logits).abs().max()
print(f"{mine.posenc_path}: largest logit difference, HF's build vs posenc's: {diff:.1e}")

# %%
# What a config cannot say is refused by name
# -------------------------------------------
# ALiBi has no ``rope_type``: it goes into a model with ``use`` (see the previous recipe),
# never into a config that transformers alone would read as RoPE.
try:
    to_hf(Schedule.uniform(ALiBi(2), 6), config)
except ValueError as err:
    print("ValueError:", err)
