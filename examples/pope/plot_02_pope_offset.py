r"""
PoPE's score against the offset
===============================

With :math:`\delta = 0`, PoPE's score is
:math:`\sum_c \mu^q_c \mu^k_c \cos((n - m)\theta_c)`: positive weights times cosines, so
it is largest at :math:`m = n` for any content. RoPE's pair scores
:math:`|\tilde q_j||\tilde k_j|\cos(a - b + (m - n)\theta_j)` carry the contents' own
angles :math:`a, b`, so where RoPE's score peaks depends on the content.
"""

# %%
# Many random contents, one curve each
# ------------------------------------
import matplotlib.pyplot as plt
import numpy as np

import posenc

rng = np.random.default_rng(1)
d, offsets = 32, np.arange(0, 128)
fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), layout="constrained", sharex=True)
for _ in range(6):
    q, k = rng.standard_normal((2, 1, d))  # one random query and key
    rope = [(posenc.rope(q, [int(r)]) @ posenc.rope(k, [0]).T).item() for r in offsets]
    pope = posenc.pope_scores(np.repeat(q, len(offsets), 0), k, offsets, [0])[:, 0]
    axes[0].plot(offsets, rope, lw=1)
    axes[1].plot(offsets, pope / pope[0], lw=1)  # scaled to 1 at offset 0
axes[0].set_title("RoPE: peaks move with the content")
axes[1].set_title("PoPE (delta = 0): largest at 0")
axes[1].set_ylabel("score / score at 0")
axes[0].set_ylabel("score")
for ax in axes:
    ax.set_xlabel("offset m - n")
plt.show()

# %%
# The learned phase bias shifts the curve on purpose
# --------------------------------------------------
# A bias :math:`\delta_c` moves component :math:`c`'s peaks to the offsets where
# :math:`(n - m)\theta_c + \delta_c` is a multiple of :math:`2\pi` -- for keys before
# the query, :math:`m - n = (2\pi + \delta_c)/\theta_c`: position preferences are
# learned explicitly, instead of arising from the content.
# With :math:`\delta_c = r_0\theta_c` every component peaks at :math:`m - n = r_0`.
q = k = np.zeros((1, d))  # equal magnitudes, softplus(0) = log 2
theta = posenc.pope_frequencies(d)
for r0 in (0, 10, 30):
    delta = -np.remainder(-r0 * theta, 2 * np.pi)  # r0 theta_c, as a phase in [-2 pi, 0]
    s = posenc.pope_scores(np.repeat(q, len(offsets), 0), k, offsets, [0], delta=delta)[:, 0]
    print(f"delta = {r0:>2} theta (mod 2 pi): score largest at m - n = {offsets[np.argmax(s)]}")
