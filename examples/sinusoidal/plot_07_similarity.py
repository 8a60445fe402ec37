"""
Unique, and similar when close: distances between positions
============================================================

Two properties we want from any encoding: no two positions share a vector, and
nearby positions have more similar vectors than distant ones.
"""

# %%
# All 1000 positions are distinct (d = 64)
# ----------------------------------------
# Count unique rows, then find the closest pair. With
# :math:`\lVert a - b\rVert^2 = \lVert a\rVert^2 + \lVert b\rVert^2 - 2\,a \cdot b` and
# :math:`\lVert \mathrm{PE}(p)\rVert^2 = d/2` the whole
# distance matrix costs one matrix product.
import matplotlib.pyplot as plt
import numpy as np

import posenc

d = 64
pe = posenc.sinusoidal(1000, d)  # (1000, 64)
print(f"unique encoding vectors among 1000 positions: {len(np.unique(pe, axis=0))}")
sq = (pe**2).sum(axis=1)  # (1000,)
dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * pe @ pe.T, 0))  # (1000, 1000)
np.fill_diagonal(dist, np.inf)
a, b = np.unravel_index(dist.argmin(), dist.shape)
print(f"minimum distance between two positions: {dist[a, b]:.4f} (positions {a} and {b})")

# %%
# The closest pairs are neighbours: adjacent positions differ mostly in the fast
# pairs, and every adjacent pair is exactly the same distance apart, because the
# distance depends only on the offset: :math:`\lVert \mathrm{PE}(p+1) - \mathrm{PE}(p)\rVert^2`
# :math:`= d - 2\,\mathrm{PE}(p) \cdot \mathrm{PE}(p+1)`.
print(
    f"distance between neighbours from the closed form: "
    f"{np.sqrt(d - 2 * posenc.sinusoidal_dot(1, d)):.4f}"
)

# %%
# The similarity matrix (128 positions)
# -------------------------------------
# Row :math:`p` of :math:`\mathrm{PE}\,\mathrm{PE}^\top` is the similarity of position
# :math:`p` with every position.
# The diagonal is ``d / 2 = 32``; values fall away from it, and every row is the same
# curve shifted, since the entry depends only on ``q - p``.
pe128 = posenc.sinusoidal(128, d)
sim = pe128 @ pe128.T  # (128, 128)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
im = ax0.imshow(sim, cmap="RdBu_r")
ax0.set_xlabel("position q")
ax0.set_ylabel("position p")
ax0.set_title("PE(p) . PE(q)")
fig.colorbar(im, ax=ax0, fraction=0.046)
for p in (0, 32, 64):
    ax1.plot(sim[p], label=f"sim(pos {p}, pos q)")
ax1.set_xlabel("position q")
ax1.set_ylabel("dot product")
ax1.set_title("similarity decays with distance")
ax1.legend()
plt.show()

# %%
# Dot product with position 0 at growing distance
# -----------------------------------------------
# The decay is not monotone at every step (the fast pairs oscillate), but the trend
# over distances 1, 2, 5, 10, 20, 50 is down.
distances = np.array([1, 2, 5, 10, 20, 50])
dots = pe[0] @ pe[distances].T  # (6,)
for k, v in zip(distances, dots, strict=True):
    print(f"distance {k:2d}: PE[0] . PE[{k}] = {v:.4f}")
fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
ax.plot(distances, dots, "o-")
ax.set_xlabel("distance from position 0")
ax.set_ylabel("dot product with position 0")
ax.set_title("similarity to position 0 at growing distance")
plt.show()

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`, :func:`posenc.sinusoidal_dot`.
