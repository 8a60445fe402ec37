"""
Extend a Llama's context: YaRN, Llama 3, a raised base
======================================================

A model trained at one length meets longer inputs. The RoPE scalings of
:mod:`posenc.scaling` each remap the rotation rates; :func:`posenc.hf.use <posenc.torch.hf.use>` puts any of
them into a Hugging Face model in place, and :func:`posenc.hf.to_hf <posenc.torch.hf.to_hf>` writes the one you
keep as the ``rope_parameters`` transformers builds itself. Here a tiny Llama is trained
on 64 bytes of Python source per row, then read at 256 bytes with each scaling.

The model is tiny and briefly trained: the curves show how to compare scalings on your
own model and data, not which one wins at scale (Part 3 and Part 6 measure that).
"""

# %%
# A tiny Llama, trained at 64 positions
# -------------------------------------
# ``transformers.LlamaForCausalLM`` from a config, bytes as tokens (a vocabulary of 256),
# trained for 100 steps on rows of 64 bytes of the Python standard library's source.
import copy
from pprint import pprint

import matplotlib.pyplot as plt
import torch
import transformers

from posenc.experiments.text_data import corpus, eval_windows, train_batch
from posenc.hf import to_hf, use
from posenc.scaling import NTK, Linear, Llama3, YaRN
from posenc.torch import RotaryEmbedding

TRAIN, READ = 64, 256  # positions seen in training, positions read
config = transformers.LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=TRAIN,
)  # head_dim 16: 8 rotating pairs
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(config)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
train, gen = corpus("train"), torch.Generator().manual_seed(0)
for _ in range(100):
    x, _ = train_batch(train, TRAIN, 16, gen, passkeys=0)  # (16, 64) bytes
    loss = model(x, labels=x).loss  # HF shifts the labels
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"training loss after 100 steps: {loss.item():.2f} nats per byte")

# %%
# The same weights, five ways to read 256 positions
# -------------------------------------------------
# Each scaling is a :class:`~posenc.torch.RotaryEmbedding` of the model's head width; ``use``
# replaces the model's ``rotary_emb`` with it (HF's attention is untouched:
# ``model.posenc_path == "rotary"``). The loss is averaged over 16 held-out windows.
factor = READ / TRAIN
schemes = {
    "RoPE as trained": RotaryEmbedding(16),
    "PI (linear x4)": RotaryEmbedding(16, scaling=Linear(factor)),
    "raised base (NTK x4)": RotaryEmbedding(16, scaling=NTK(factor)),
    "YaRN x4": RotaryEmbedding(16, scaling=YaRN(factor, TRAIN), max_len=READ),
    "Llama 3 x4": RotaryEmbedding(16, scaling=Llama3(factor, 1.0, 4.0, TRAIN), max_len=READ),
}
windows = eval_windows(corpus("eval"), READ, 16 * READ)  # (16, 257): inputs and next bytes
curves = {}
for name, rope in schemes.items():
    extended = use(copy.deepcopy(model).eval(), rope)
    with torch.no_grad():
        logits = extended(windows[:, :-1]).logits  # (16, 256, 256): (rows, positions, bytes)
        nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), windows[:, 1:], reduction="none"
        ).mean(0)  # (256,): loss at each position
    curves[name] = nll
    print(
        f"{name:22s} loss within 64: {nll[:TRAIN].mean():.2f}, "
        f"beyond: {nll[TRAIN:].mean():.2f}  ({extended.posenc_path})"
    )

fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
for name, nll in curves.items():
    smooth = nll.unfold(0, 16, 8).mean(1)  # mean over windows of 16 positions
    ax.plot(range(8, 8 + 8 * len(smooth), 8), smooth, label=name)
ax.axvline(TRAIN, color="gray", ls=":", lw=1)
ax.set_xlabel("position")
ax.set_ylabel("loss (nats per byte)")
ax.legend(fontsize=8)
plt.show()

# %%
# Keep one: the config transformers builds it from
# ------------------------------------------------
# ``to_hf`` writes the scaling as ``rope_parameters``; a model built from that config with
# transformers alone gives the same logits as the model ``use`` changed.
chosen = schemes["YaRN x4"]
exported = to_hf(chosen, config)
pprint(exported["rope_parameters"], sort_dicts=False)
native = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(exported))
native.load_state_dict(model.state_dict())
with torch.no_grad():
    a = native.eval()(windows[:2, :-1]).logits  # (2, 256, 256)
    b = use(copy.deepcopy(model).eval(), chosen)(windows[:2, :-1]).logits
# float32 models: HF rounds its rates to float32, posenc computes the angles in float64
print(f"largest logit difference, HF's own YaRN vs posenc's: {(a - b).abs().max():.1e}")
