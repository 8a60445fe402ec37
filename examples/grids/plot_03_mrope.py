"""
Multimodal RoPE (Qwen2-VL): position ids for text, images and video
===================================================================

M-RoPE gives every token three coordinates, ``(time, height, width)``, and splits
the rotary pairs of one RoPE spectrum into three sections (Qwen2-VL's
``mrope_section``, ``[16, 24, 24]`` for ``head_dim = 128``): the first section turns
with time, the next with height, the last with width. Text tokens sit at ``(p, p,
p)``, where M-RoPE is plain RoPE. :func:`posenc.mrope_positions` builds the
coordinates of a mixed sequence the way HF transformers' ``get_rope_index`` does;
:class:`posenc.torch.MRoPE` rotates queries and keys with them.
"""

# %%
# The three rows of position ids
# -------------------------------
# Four text tokens, an image of 8 x 12 patches, three text tokens, a video of 3 frames
# of 6 x 6 patches, three text tokens; the vision encoder merges 2 x 2 patches into one
# token (``spatial_merge=2``), so the image is 4 x 6 tokens and the video 3 x 3 x 3.
import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc
from posenc.torch import MRoPE, MultiHeadAttention, RotaryEmbedding

segments = [4, (1, 8, 12), 3, (3, 6, 6), 3]
pos = posenc.mrope_positions(segments, spatial_merge=2)  # (seq, 3)
print("tokens:", len(pos), " largest position:", pos.max())

fig, ax = plt.subplots(figsize=(8, 3.2), layout="constrained")
for axis, name in enumerate(["time", "height", "width"]):
    ax.step(np.arange(len(pos)), pos[:, axis], where="mid", label=name, lw=1.5)
ax.axvspan(3.5, 27.5, color="0.9", zorder=0)
ax.axvspan(30.5, 57.5, color="0.9", zorder=0)
ax.text(15.5, pos.max(), "image", ha="center", va="top")
ax.text(44, pos.max(), "video", ha="center", va="top")
ax.set_xlabel("token index")
ax.set_ylabel("coordinate")
ax.legend(loc="lower right")
plt.show()

# %%
# After the image (tokens 4 to 27, all at time 4) the text resumes at position
# ``4 + max(4, 6) = 10``: one past the image's largest coordinate, not at its token
# index 28. That is what keeps the positions small for long image sequences.
print("first text token after the image:", pos[28], " token index 28")

# %%
# Text tokens are plain RoPE
# --------------------------
# On text, where all three coordinates are equal, M-RoPE gives exactly
# :class:`~posenc.torch.RotaryEmbedding` with the same base.
head_dim, sections = 32, (4, 6, 6)
mrope = MRoPE(head_dim, sections=sections, base=1e6, max_len=128)
rope = RotaryEmbedding(head_dim, base=1e6, max_len=128)
q = torch.randn(1, 2, 8, head_dim, dtype=torch.float64)
text = torch.arange(8)[None]  # (1, 8)
print("text == RoPE:", torch.equal(mrope(q, q, text)[0], rope(q, q, text)[0]))

# %%
# Decoding text after the vision tokens
# -------------------------------------
# Prefill the whole prompt with its coordinates, then decode without positions: the
# KV cache continues every row one past its largest cached coordinate, on all three
# axes -- Qwen2-VL's ``rope_deltas`` rule -- and the cached decode equals a full
# forward with those positions.
torch.manual_seed(0)
attn = MultiHeadAttention(64, 2, encoding=mrope).double()
x = torch.randn(1, len(pos) + 3, 64, dtype=torch.float64)  # prompt + 3 new tokens
prompt = torch.from_numpy(pos)[None]  # (1, seq, 3)
cache = attn.new_cache(1, len(pos) + 3)
outs = [attn(x[:, : len(pos)], prompt, cache=cache)]
outs += [attn(x[:, i : i + 1], cache=cache) for i in range(len(pos), len(pos) + 3)]
print("decoded at:", cache.positions[0, len(pos) :].tolist())
following = torch.arange(pos.max() + 1, pos.max() + 4)[None, :, None].expand(1, 3, 3)
full = attn(x, torch.cat([prompt, following], 1))
print("cached decode == full forward:", torch.allclose(torch.cat(outs, 1), full, atol=1e-10))

# %%
# Used here
# ---------
# :func:`posenc.mrope_positions`, :func:`posenc.mrope_frequencies`,
# :class:`posenc.torch.MRoPE`, :class:`posenc.torch.MultiHeadAttention`.
