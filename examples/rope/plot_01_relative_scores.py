r"""
RoPE scores depend only on the offset
=====================================

Rotary position embedding rotates each pair of query and key coordinates by an angle
proportional to the position: pair :math:`j` of the query at position :math:`m` turns
by :math:`m\theta_j`, with :math:`\theta_j = b^{-2j/d}`. After rotation the score is

.. math::

    q_m \cdot k_n = \operatorname{Re}\Big[\sum_j \tilde q_j\,\overline{\tilde k_j}\,
    e^{i (m - n) \theta_j}\Big],

so it depends on the two positions only through the offset :math:`r = m - n`.
"""

# %%
# The same query at every position, the same key at every position
# -----------------------------------------------------------------
# Rotate one query to each of 48 positions and one key to each of 48 positions with
# :func:`posenc.rope`, and take all scores. If the score depends only on
# :math:`m - n`, every diagonal of the score matrix is constant (a Toeplitz matrix).
import matplotlib.pyplot as plt
import numpy as np

import posenc

rng = np.random.default_rng(0)
head_dim, n = 64, 48
q, k = rng.standard_normal((2, head_dim))  # one query, one key
Q = posenc.rope(np.tile(q, (n, 1)), n)  # (48, 64): q rotated to positions 0..47
K = posenc.rope(np.tile(k, (n, 1)), n)  # (48, 64)
S = Q @ K.T  # (48, 48): S[m, n] = q_m . k_n
spread = max(np.ptp(np.diagonal(S, offset=o)) for o in range(-n + 1, n))
print(f"largest spread along any diagonal: {spread:.1e}")

fig, ax = plt.subplots(figsize=(5, 4.2), layout="constrained")
im = ax.imshow(S, cmap="RdBu_r")
ax.set_xlabel("key position n")
ax.set_ylabel("query position m")
ax.set_title("RoPE scores are constant along diagonals")
fig.colorbar(im, ax=ax, label="score")
plt.show()

# %%
# Shifting both positions changes nothing
# ---------------------------------------
# Move the query and the key 10,000 positions on together: the score is the same to
# rounding.
for shift in (0, 100, 10_000):
    qm = posenc.rope(q[None], [5 + shift])
    kn = posenc.rope(k[None], [2 + shift])
    print(f"m = {5 + shift:>6}, n = {2 + shift:>6}: score {(qm @ kn.T).item():+.10f}")

# %%
# Used here
# ---------
# :func:`posenc.rope`.
