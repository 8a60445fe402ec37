"""
Flat lines: the dot product depends only on the distance
========================================================

For two positions ``k`` apart, the cosine subtraction identity gives

``PE(p) . PE(p + k) = sum_i cos(omega_i k)``

with no ``p`` left on the right-hand side. Plot the dot product of every pair
``(p, p + k)`` against ``p``: each distance ``k`` must draw a horizontal line.
"""

# %%
# Every pair of a 15-position, 8-dimensional table
# ------------------------------------------------
import matplotlib.pyplot as plt
import numpy as np

import posenc

seq_len, d_model = 15, 8
pe = posenc.sinusoidal(seq_len, d_model)  # (15, 8)
gram = pe @ pe.T  # (15, 15): gram[p, q] = PE(p) . PE(q)
distances = range(1, seq_len, 2)  # 1, 3, ..., 13

fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
for k in distances:
    dots = np.diagonal(gram, offset=k)  # (seq_len - k,): pairs (p, p + k)
    ax.plot(np.arange(dots.size), dots, marker="o", label=f"distance {k}")
    ax.axhline(posenc.sinusoidal_dot(k, d_model), color="k", lw=0.5, ls=":")
ax.set_xlabel("starting position p (pair = (p, p + k))")
ax.set_ylabel("PE[p] . PE[p + k]")
ax.set_title(f"pairwise dot products per distance (d_model={d_model}, seq_len={seq_len})")
ax.legend(ncol=2, fontsize=8)
plt.show()

# %%
# The values behind the lines
# ---------------------------
# Each line lists the dot products of all pairs at one distance, in order of ``p``;
# the spread is rounding noise, and the closed form :func:`posenc.sinusoidal_dot`
# gives the same number.
for k in distances:
    dots = np.diagonal(gram, offset=k)
    closed = posenc.sinusoidal_dot(k, d_model)
    print(
        f"distance {k:2d} ({dots.size:2d} pairs): closed form {closed:.4f}, "
        f"spread {np.ptp(dots):.1e}"
    )
    print("   ", " ".join(f"{v:.4f}" for v in dots))

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`, :func:`posenc.sinusoidal_dot`.
