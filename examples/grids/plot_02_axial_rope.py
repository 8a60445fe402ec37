"""
Axial 2-D RoPE on image patches
===============================

Axial RoPE gives each coordinate its own block of rotary pairs: with ``head_dim = 64``
and two axes, 16 pairs turn with the patch's row and 16 with its column, each block a
full RoPE spectrum (rotary-embedding-torch's ``get_axial_freqs``, EVA-02). The score of
a query and a key then depends on their row offset and column offset. 1-D RoPE on the
flattened patches sees only ``row * width + column``.
"""

# %%
# Score against offset, from the centre patch
# -------------------------------------------
# Queries and keys are the same all-ones vector, so every score is the RoPE kernel
# itself: ``sum_j 2 cos(theta_j * offset)``, the largest (64) at offset 0.
import matplotlib.pyplot as plt
import torch

import posenc
from posenc.torch import AxialRotaryEmbedding, RotaryEmbedding

h = w = 16
head_dim = 64
pos2d = torch.from_numpy(posenc.grid_positions(h, w))[None]  # (1, 256, 2): (row, column)
pos1d = torch.arange(h * w)[None]  # (1, 256): the flattened index
ones = torch.ones(1, 1, h * w, head_dim, dtype=torch.float64)  # (batch, heads, seq, hd)

axial = AxialRotaryEmbedding(head_dim, max_len=h)
rope = RotaryEmbedding(head_dim, max_len=h * w)
centre = 8 * w + 8
scores = {}
for name, enc, pos in (("1-D RoPE, flattened", rope, pos1d), ("axial 2-D RoPE", axial, pos2d)):
    q, k = enc(ones, ones, pos)
    scores[name] = (q[0, 0, centre] @ k[0, 0].T).reshape(h, w)  # (h, w)

fig, axes = plt.subplots(1, 2, figsize=(8, 3.6), layout="constrained")
for ax, (name, s) in zip(axes, scores.items(), strict=True):
    im = ax.imshow(s, cmap="viridis", vmin=-10, vmax=64)
    ax.plot(8, 8, "r+", ms=12)
    ax.set_title(name, fontsize=10)
    ax.set_xlabel("column")
    ax.set_ylabel("row")
fig.colorbar(im, ax=axes, label="score with the patch at (8, 8)")
plt.show()

# %%
# The numbers behind the picture: the patch just below the centre and the one at the
# far end of the same flattened stretch.
for name, s in scores.items():
    print(
        f"{name:20s} below (9, 8): {s[9, 8]:6.2f}   right (8, 9): {s[8, 9]:6.2f}   "
        f"(7, 15): {s[7, 15]:6.2f}"
    )

# %%
# With 1-D RoPE the patch directly below is ``w = 16`` flattened steps away and scores
# 38.75, less than ``(7, 15)`` (42.97): seven columns away in the row above, but only
# 9 flattened steps back. Axial RoPE ranks the two the other way (62.63 and 53.48) and
# scores the patches below and to the right alike (the two blocks share one spectrum).
#
# In attention
# ------------
# Positions of shape ``(batch, seq, 2)`` go through
# :class:`~posenc.torch.MultiHeadAttention` unchanged; the attention core never
# looks at them, the encoding does.
from posenc.torch import MultiHeadAttention

torch.manual_seed(0)
attn = MultiHeadAttention(128, 2, encoding=axial, causal=False)
patches = torch.randn(1, h * w, 128)  # (batch, seq, dim)
print("output:", tuple(attn(patches, pos2d).shape))

# %%
# Used here
# ---------
# :class:`posenc.torch.AxialRotaryEmbedding`, :func:`posenc.axial_frequencies`,
# :func:`posenc.rope_nd`, :func:`posenc.grid_positions`.
