"""
The position schedule of a Hugging Face model
=============================================

Today's models give each layer its own position scheme. :meth:`Schedule.from_hf
<posenc.torch.Schedule.from_hf>` reads it from a ``config.json`` (a dict, or a
transformers config object): one :class:`~posenc.torch.Layer` per decoder layer with its
encoding, window, chunk and sinks. Here Gemma 3, Llama 4 and GPT-OSS, from the default
configs of transformers' config classes (no download), drawn layer by layer.
"""

# %%
# Read the schedules
# ------------------
# ``CONFIG_MAPPING[model_type]()`` is the config class with its defaults; ``to_dict()`` is
# what a ``config.json`` holds.
import matplotlib.pyplot as plt
from transformers import CONFIG_MAPPING

from posenc.torch import Schedule

schedules = {name: Schedule.from_hf(CONFIG_MAPPING[t]().to_dict())
             for name, t in [("Gemma 3", "gemma3_text"), ("Llama 4", "llama4_text"),
                             ("GPT-OSS", "gpt_oss")]}  # fmt: skip


def kind(layer):
    """A layer's kind: its encoding (or none), window, chunk and sinks."""
    enc = type(layer.encoding).__name__ if layer.encoding is not None else "no position"
    limit = f", window {layer.window}" if layer.window else ""
    limit += f", chunk {layer.chunk}" if layer.chunk else ""
    return enc + limit + (", sinks" if layer.sinks else "")


for name, s in schedules.items():
    print(f"{name}: {len(s)} layers, {len(s.kinds)} kinds of layer")
    print("  layer 0:", kind(s[0]))
    print("  layer 3:", kind(s[3]))

# %%
# One colour per kind of layer
# ----------------------------
# Layers of one kind share one mask per step in :class:`~posenc.torch.TransformerLM`.
fig, axes = plt.subplots(len(schedules), 1, figsize=(9, 4.5))
for ax, (name, s) in zip(axes, schedules.items()):
    kinds = list(dict.fromkeys(kind(layer) for layer in s))
    colours = plt.cm.tab10.colors
    for i, layer in enumerate(s):
        ax.bar(i, 1, width=0.9, color=colours[kinds.index(kind(layer))])
    ax.set_yticks([])
    ax.set_xlim(-1, 48)
    ax.set_title(name, fontsize=11, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[j]) for j in range(len(kinds))]
    ax.legend(handles, kinds, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
axes[-1].set_xlabel("layer")
fig.tight_layout()
plt.show()

# %%
# Each kind is a posenc object you can use alone: Llama 4's NoPE layers are a
# :class:`~posenc.torch.QueryTemperature` around no encoding; its RoPE layers attend
# within chunks of 8192 positions.
llama4 = schedules["Llama 4"]
print(llama4[3].encoding)
rope = llama4[0].encoding
print(f"RoPE base {rope.base:g}, pairing {rope.pairing!r}, chunk {llama4[0].chunk}")
