r"""
From a binary counter to a continuous clock
===========================================

A binary counter already is a positional encoding: each bit is a square wave, the low
bit flips every step, the next every two steps, and so on. Together the bits name
every position. The sinusoidal encoding keeps the idea -- many "hands" turning at
geometrically spaced speeds -- and replaces the jumps with smooth rotations.
"""

# %%
# The binary counter, positions 0-15
# ----------------------------------
import matplotlib.pyplot as plt
import numpy as np

import posenc

positions = np.arange(16)
bits = (positions[:, None] >> np.arange(3, -1, -1)) & 1  # (16, 4): bit3 .. bit0
print("pos | bit3 bit2 bit1 bit0")
for p, row in zip(positions, bits, strict=True):
    print(f" {p:2d} |   " + "    ".join(str(b) for b in row))

# %%
# Bit :math:`k` has period :math:`2^{k+1}`: frequencies 1/2, 1/4, 1/8, 1/16 cycles per
# step. A sinusoidal analogue with the same periods uses the rates
# :math:`\theta = 2\pi / 2^{k+1}`: four rates, so four sin/cos pairs, :math:`d = 8`
# dimensions, with rates chosen by hand for the illustration. The encoding of Vaswani
# et al. spaces its rates by the factor :math:`10000^{2/d}` instead of 2.
periods = 2.0 ** np.arange(4, 0, -1)  # bit3 .. bit0: 16, 8, 4, 2
smooth = 0.5 - 0.5 * np.cos(2 * np.pi * (positions[:, None] + 0.5) / periods)  # (16, 4)
dense = np.linspace(0, 15.99, 400)
fig, axes = plt.subplots(
    1, 3, figsize=(9, 4), layout="constrained", gridspec_kw=dict(width_ratios=[1, 1, 2])
)
axes[0].imshow(bits, cmap="Greys", aspect="auto")
axes[0].set_title("binary counter")
axes[1].imshow(smooth, cmap="Greys", aspect="auto")
axes[1].set_title("smooth analogue")
for ax in axes[:2]:
    ax.set_xticks(range(4), ["bit3", "bit2", "bit1", "bit0"])
    ax.set_ylabel("position")
for j, period in enumerate(periods):
    square = (np.floor(dense / (period / 2)) % 2) + 2.4 * j
    axes[2].step(dense, square, where="post", color="k", lw=1)
    axes[2].plot(
        dense, 0.5 - 0.5 * np.cos(2 * np.pi * (dense + 0.5) / period) + 2.4 * j, color="tab:orange"
    )
axes[2].set_yticks(2.4 * np.arange(4) + 0.5, ["bit3", "bit2", "bit1", "bit0"])
axes[2].set_xlabel("position")
axes[2].set_title("square waves (bits), smooth versions")
plt.show()

# %%
# The sinusoidal fingerprint
# --------------------------
# Each position's vector, read across dimensions, is a barcode: the fast pairs change
# from one position to the next, the slow pairs change over long stretches. No two
# rows are equal. (d = 32, positions 0-15.)
pe = posenc.sinusoidal(16, 32)  # (16, 32)
fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
ax.imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
ax.set_xlabel("dimension (fast pairs left, slow pairs right)")
ax.set_ylabel("position")
ax.set_title("one fingerprint per position")
plt.show()

# %%
# Clock hands for d = 4
# ---------------------
# With :math:`d = 4` there are two hands: dimensions 0-1 turn at rate 1 (a second
# hand, one radian per position) and dimensions 2-3 at rate 1/100 (an hour hand).
# Position :math:`p` puts hand :math:`j` at the point
# :math:`(\cos p\theta_j, \sin p\theta_j)` = (dimension :math:`2j+1`, dimension :math:`2j`).
pe4 = posenc.sinusoidal(4, 4)  # (4, 4)
print("rates:", posenc.frequencies(4))
fig, axes = plt.subplots(1, 2, figsize=(8, 4), layout="constrained")
circle = np.linspace(0, 2 * np.pi, 200)
for ax, i, name in [(axes[0], 0, "dims 0-1, rate 1"), (axes[1], 1, "dims 2-3, rate 1/100")]:
    ax.plot(np.cos(circle), np.sin(circle), color="0.8")
    for p in range(4):
        x, y = pe4[p, 2 * i + 1], pe4[p, 2 * i]
        ax.annotate("", (x, y), (0, 0), arrowprops=dict(arrowstyle="->", color=f"C{p}"))
        ax.text(1.12 * x, 1.12 * y, f"p={p}", color=f"C{p}", ha="center", va="center")
    ax.set_aspect("equal")
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.set_xlabel("cos (odd dim)")
    ax.set_ylabel("sin (even dim)")
    ax.set_title(name)
plt.show()

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`, :func:`posenc.frequencies`.
