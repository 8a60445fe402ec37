r"""
One dimension at a time: waves of different speeds
===================================================

Read the table column by column: each dimension is a sine or cosine of position,
and the pair index :math:`j` sets its speed :math:`\theta_j = 10000^{-2j/d}`.
"""

# %%
# Ten dimensions over 100 positions (d = 64)
# ------------------------------------------
# Dimensions 0-3 go through many periods, 10-11 a few, 30-31 part of one, and
# 62-63 look constant: their period is 47,117 positions.
import matplotlib.pyplot as plt
import numpy as np

import posenc

d = 64
pe = posenc.sinusoidal(100, d)  # (100, 64)
dims = [0, 1, 2, 3, 10, 11, 30, 31, 62, 63]
fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True, layout="constrained")
for ax, parity, name, cmap in [
    (axes[0], 0, "sine (even dimensions)", "viridis"),
    (axes[1], 1, "cosine (odd dimensions)", "plasma"),
]:
    chosen = [k for k in dims if k % 2 == parity]
    colors = plt.get_cmap(cmap)(np.linspace(0, 0.9, len(chosen)))
    for k, c in zip(chosen, colors, strict=True):
        period = posenc.wavelengths(d)[k // 2]
        ax.plot(pe[:, k], color=c, label=f"dim {k} (period {period:,.0f})")
    ax.set_title(name)
    ax.set_ylabel("value")
    ax.set_ylim(-1.1, 1.1)
    ax.legend(ncol=3, fontsize=8, loc="lower left")
axes[1].set_xlabel("position")
plt.show()

# %%
# The 128 x 64 table beside a few of its columns
# ----------------------------------------------
# The same picture, two ways: dims 0, 4, 16 and 62 as curves are vertical slices
# of the heatmap.
pe128 = posenc.sinusoidal(128, d)  # (128, 64)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
im = ax0.imshow(pe128, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1)
ax0.set_xlabel("dimension")
ax0.set_ylabel("position")
ax0.set_title("sinusoidal table, 128 x 64")
fig.colorbar(im, ax=ax0, fraction=0.046)
for k in (0, 4, 16, 62):
    ax1.plot(pe128[:, k], label=f"dim {k} (sin)")
    ax0.axvline(k, color="k", lw=0.6, ls=":")
ax1.set_xlabel("position")
ax1.set_ylabel("value")
ax1.set_ylim(-1.3, 1.3)
ax1.set_title("different dimensions, different frequencies")
ax1.legend(fontsize=8, ncol=2)
plt.show()

# %%
# Rows: what one position looks like
# -----------------------------------
# Position 0 is ``[0, 1, 0, 1, ...]``; position 1 has moved visibly in the first
# pairs only; position 99 differs from both in the fast pairs and shares their
# slow pairs.
np.set_printoptions(precision=4, suppress=True)
for p in (0, 1, 99):
    print(f"PE[{p:2d}, :8] =", pe[p, :8])

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`, :func:`posenc.wavelengths`.
