"""
The sinusoidal table as a heatmap
=================================

Every row of the table is one position, every column one dimension. Column pairs
``(2i, 2i + 1)`` hold the sine and cosine of ``p * omega_i`` with
``omega_i = 10000 ** (-2i / dim)``: the left columns turn fast, the right ones slowly.
"""

# %%
# Compute the table
# -----------------
# :func:`posenc.sinusoidal` returns a float64 array of shape ``(positions, dim)``.
import matplotlib.pyplot as plt

import posenc

n_positions, dim = 100, 64
pe = posenc.sinusoidal(n_positions, dim)  # (100, 64)
print(pe.shape, f"min {pe.min():.3f}, max {pe.max():.3f}")

# %%
# Draw it
# -------
# A diverging colour map centred on 0 shows the sign of each entry. The first
# columns alternate within a few rows (wavelength ``2 pi``); the last ones barely
# change over 100 positions (wavelength about 47,000).
fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
im = ax.imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
ax.set_xlabel("dimension (even: sin, odd: cos)")
ax.set_ylabel("position")
ax.set_title(f"Sinusoidal positional encoding, {n_positions} positions x {dim} dims")
fig.colorbar(im, ax=ax, label="value")
plt.show()

# %%
# Used here
# ---------
# * :func:`posenc.sinusoidal` -- the table.
# * :func:`posenc.wavelengths` -- the period of each column pair.
print("shortest and longest wavelength:", posenc.wavelengths(dim)[[0, -1]].round(2))
