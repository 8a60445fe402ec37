r"""
The sinusoidal table as a heatmap
=================================

Every row of the table is one position, every column one dimension. Column pairs
:math:`(2j, 2j + 1)` hold the sine and cosine of :math:`p\,\theta_j` with
:math:`\theta_j = b^{-2j/d}`, :math:`b = 10000`: the left columns turn fast, the right
ones slowly.
"""

# %%
# Compute the table
# -----------------
# :func:`posenc.sinusoidal` returns a float64 array of shape ``(positions, dim)``.
import matplotlib.pyplot as plt

import posenc

n_positions, dim = 100, 64
pe = posenc.sinusoidal(n_positions, dim)  # (100, 64)
print(f"shape {pe.shape}, value range [{pe.min():.3f}, {pe.max():.3f}]")

# %%
# The whole table
# ---------------
# A diverging colour map centred on 0 shows the sign of each entry. The first
# columns flip sign every few rows (wavelength ``2 pi``, about 6 positions): they
# resolve *local* order. The last columns barely change over 100 positions
# (wavelength about 47,000): they say roughly *where in a long document* we are.
fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
im = ax.imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
ax.set_xlabel("dimension (even: sin, odd: cos)")
ax.set_ylabel("position")
ax.set_title(f"Sinusoidal positional encoding, {n_positions} positions x {dim} dims", pad=28)
for x, label, color in [
    (dim / 4, "high frequency: local order", "tab:blue"),
    (3 * dim / 4, "low frequency: global position", "tab:red"),
]:
    ax.annotate(
        label, (x, 0), xytext=(x, -4), ha="center", va="bottom", color=color, annotation_clip=False
    )
fig.colorbar(im, ax=ax, label="value")
plt.show()

# %%
# Zoom on the corner: positions 0-10, dimensions 0-10
# ---------------------------------------------------
# Row 0 is ``[0, 1, 0, 1, ...]``: every sine starts at 0 and every cosine at 1.
# Dimension 0 (``sin p``) swings through a full period in about 6 rows; dimension 10
# (:math:`\sin(p\,\theta_5)` with :math:`\theta_5 = 10000^{-10/64} \approx 0.237`)
# changes slowly.
corner = pe[:11, :11]  # (11, 11)
fig, ax = plt.subplots(figsize=(8, 6.5), layout="constrained")
ax.imshow(corner, cmap="RdBu_r", vmin=-1, vmax=1)
for p in range(11):
    for d in range(11):
        ax.text(
            d,
            p,
            f"{corner[p, d]:.2f}",
            ha="center",
            va="center",
            fontsize=8,
            color="white" if abs(corner[p, d]) > 0.6 else "black",
        )
ax.set_xticks(range(11), [f"{d}\n{'sin' if d % 2 == 0 else 'cos'}" for d in range(11)])
ax.set_yticks(range(11))
ax.set_xlabel("dimension")
ax.set_ylabel("position")
ax.set_title("Positions 0-10 x dimensions 0-10 (dim = 64)")
plt.show()

# %%
# Used here
# ---------
# * :func:`posenc.sinusoidal` -- the table.
# * :func:`posenc.wavelengths` -- the period of each column pair.
print("shortest and longest wavelength:", posenc.wavelengths(dim)[[0, -1]].round(2))
