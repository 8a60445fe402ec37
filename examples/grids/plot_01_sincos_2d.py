"""
The 2-D sin-cos table of MAE
============================

ViT and MAE add a fixed table to their patch embeddings: half of the ``dim`` channels
are the 1-D sin-cos table of the patch's column, the other half that of its row.
:func:`posenc.sinusoidal_2d` builds it in MAE's layout (column first, sines before
cosines in each half); :class:`posenc.torch.SinusoidalEncoding2D` adds it to
``(batch, seq, dim)`` embeddings at ``(batch, seq, 2)`` coordinates.
"""

# %%
# The table and its layout
# ------------------------
# A 14 x 14 grid of patches (a 224-pixel image in 16-pixel patches), ``dim = 64``:
# 196 rows, one per patch in row-major order.
import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc
from posenc.torch import SinusoidalEncoding2D

h = w = 14
dim = 64
table = posenc.sinusoidal_2d(h, w, dim)  # (h * w, dim)
print("table:", table.shape)
# the first half depends on the column only, the second half on the row only
coords = posenc.grid_positions(h, w)  # (196, 2): (row, column)
same_col = coords[:, 1] == 3
print("first half equal on column 3:", np.ptp(table[same_col, : dim // 2], axis=0).max() == 0)
print("second half varies on column 3:", np.ptp(table[same_col, dim // 2 :], axis=0).max() > 0)

# %%
# Which patches look alike
# ------------------------
# The dot product of patch (7, 7)'s vector with every patch's, as an image. The column
# half contributes a sum of cosines of the column offset, the row half the same of the
# row offset, so the picture is the *sum* of a column profile and a row profile: a
# cross through the patch, largest at the patch itself.
sim = (table @ table[7 * w + 7]).reshape(h, w)  # (h, w)
fig, ax = plt.subplots(figsize=(4.2, 3.6), layout="constrained")
im = ax.imshow(sim, cmap="viridis")
ax.plot(7, 7, "r+", ms=12)
ax.set_xlabel("column")
ax.set_ylabel("row")
ax.set_title("PE(patch) . PE(7, 7)", fontsize=10)
fig.colorbar(im, ax=ax)
plt.show()
print(
    f"largest at (7, 7): {np.unravel_index(sim.argmax(), sim.shape) == (7, 7)}, "
    f"value {sim.max():.1f} = dim / 2"
)

# %%
# In a model
# ----------
# The torch module adds the same numbers (float64 here, so exactly equal).
pe = SinusoidalEncoding2D(dim, max_len=h).double()
pos = torch.from_numpy(coords)[None]  # (1, 196, 2)
x = torch.zeros(1, h * w, dim, dtype=torch.float64)  # (batch, seq, dim)
print("torch == NumPy:", bool((pe(x, pos)[0].numpy() == table).all()))

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal_2d`, :func:`posenc.grid_positions`,
# :class:`posenc.torch.SinusoidalEncoding2D`.
