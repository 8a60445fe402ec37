r"""
Wavelengths grow geometrically
==============================

Pair :math:`j` repeats every :math:`\lambda_j = 2\pi/\theta_j = 2\pi \cdot 10000^{2j/d}`
positions. Consecutive pairs differ by the constant ratio :math:`10000^{2/d}`, so the
wavelengths form a geometric progression from :math:`2\pi` towards
:math:`2\pi \cdot 10000`.
"""

# %%
# Linear and logarithmic axes (d = 64)
# ------------------------------------
# On a linear axis only the last few pairs are visible; on a log axis the bars rise
# along a straight line, the signature of a geometric progression.
import matplotlib.pyplot as plt
import numpy as np

import posenc

d = 64
lam = posenc.wavelengths(d)  # (32,)
even_dims = np.arange(0, d, 2)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
for ax, scale in zip(axes, ["linear", "log"], strict=True):
    ax.bar(even_dims, lam, width=1.6, color="steelblue")
    ax.set_yscale(scale)
    ax.set_xlabel("dimension (even index of each pair)")
    ax.set_ylabel("wavelength (positions)")
    ax.set_title(f"wavelength by dimension ({scale} scale)")
plt.show()

# %%
# The numbers
# -----------
# Dimension :math:`2j` has wavelength ``lam[j]``.
for dim_index in (0, 10, 30, 62):
    print(f"dimension {dim_index:2d}: {lam[dim_index // 2]:>10.2f} positions")
print(f"dimension  0 completes {100 / lam[0]:.1f} cycles in 100 positions")
print(f"ratio between neighbouring pairs: {lam[1] / lam[0]:.4f} = 10000**(2/64)")

# %%
# From 2 pi to (almost) 2 pi * 10000
# ----------------------------------
# The often-quoted range "6.3 to 62,832 positions" is the limit: the last pair has
# :math:`j = d/2 - 1`, so its wavelength is :math:`2\pi \cdot 10000^{(d-2)/d}`, which
# only approaches :math:`2\pi \cdot 10000` as :math:`d` grows.
print(f"{'d':>5} {'first pair':>11} {'last pair':>11}")
for dd in (4, 64, 512, 4096):
    w = posenc.wavelengths(dd)
    print(f"{dd:>5} {w[0]:>11.1f} {w[-1]:>11,.0f}")
print(f"limit 2*pi*10000 = {2 * np.pi * 10000:,.0f}")

# %%
# Used here
# ---------
# :func:`posenc.wavelengths`, :func:`posenc.frequencies`.
