r"""
Flat lines: the dot product depends only on the distance
========================================================

For two positions :math:`r` apart, the cosine subtraction identity gives

.. math::

    \mathrm{PE}(p) \cdot \mathrm{PE}(p + r) = \sum_j \cos(r\theta_j),

with no :math:`p` left on the right-hand side. Plot the dot product of every pair
:math:`(p, p + r)` against :math:`p`: each distance :math:`r` must draw a horizontal
line.
"""

# %%
# Every pair of a 15-position, 8-dimensional table
# ------------------------------------------------
# One panel per odd distance. Each panel's vertical axis spans only 0.02 around the
# closed form :func:`posenc.sinusoidal_dot` (dotted), so any dependence on :math:`p`
# larger than that would show. (In a single panel the lines for :math:`r = 1` and
# :math:`r = 7` would lie on top of each other, and so would 5 and 13: their values
# differ by less than 0.02.)
import matplotlib.pyplot as plt
import numpy as np

import posenc

seq_len, d_model = 15, 8
pe = posenc.sinusoidal(seq_len, d_model)  # (15, 8)
gram = pe @ pe.T  # (15, 15): gram[p, q] = PE(p) . PE(q)
distances = range(1, seq_len, 2)  # 1, 3, ..., 13

fig, axes = plt.subplots(1, len(distances), figsize=(8, 2.8), layout="constrained")
for ax, r in zip(axes, distances, strict=True):
    dots = np.diagonal(gram, offset=r)  # (seq_len - r,): pairs (p, p + r)
    closed = posenc.sinusoidal_dot(r, d_model)
    ax.axhline(closed, color="k", lw=0.8, ls=":")
    ax.plot(dots, "o", ms=3)
    ax.set_ylim(closed - 0.01, closed + 0.01)
    ax.set_yticks([])
    ax.set_xticks([0, dots.size - 1])
    ax.set_xlabel("p")
    ax.set_title(f"r = {r}\n{closed:.3f}", fontsize=9)
fig.suptitle(f"PE(p) . PE(p + r) for d = {d_model}: one flat line per distance", fontsize=10)
plt.show()

# %%
# The values behind the lines
# ---------------------------
# Each line lists the dot products of all pairs at one distance, in order of
# :math:`p`; the spread is rounding noise, and the closed form gives the same number.
for r in distances:
    dots = np.diagonal(gram, offset=r)
    closed = posenc.sinusoidal_dot(r, d_model)
    print(f"distance {r:2d} ({dots.size:2d} pairs): closed form {closed:.4f}, ", end="")
    print(f"spread {np.ptp(dots):.1e}")
    print("   ", " ".join(f"{v:.4f}" for v in dots))

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`, :func:`posenc.sinusoidal_dot`.
