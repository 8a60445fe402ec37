"""
Why not simpler encodings? Three failures
=========================================

Before sines and cosines, try the obvious ideas and watch each one break a
requirement: *compatible* with the embeddings (neither drowned nor dominant),
*smooth* (similarity reflects distance, the same way everywhere), and
*generalizes* (means the same thing at any sequence length).
"""

# %%
# 1. The position itself, added to every dimension
# ------------------------------------------------
# Take embeddings with entries in ``[0, 1)`` (d = 512, 100 tokens) and add ``pos`` to
# every entry. The similarity of two tokens 4 apart then grows with where they sit:
# the same gap means different things at different places, and the position swamps
# the token.
import matplotlib.pyplot as plt
import numpy as np

import posenc

rng = np.random.default_rng(42)
N, d = 100, 512
emb = rng.random((N, d))  # (100, 512)
naive = emb + np.arange(N)[:, None]  # (100, 512)
gap4 = np.einsum("id,id->i", naive[:-4], naive[4:])  # (96,)
print(f"sim(token 1, token 5)   = {gap4[0]:.1f}")
print(f"sim(token 96, token 100) = {gap4[-1]:.1f}")
sinus = emb + posenc.sinusoidal(N, d)
gap4_sin = np.einsum("id,id->i", sinus[:-4], sinus[4:])
fig, ax = plt.subplots(figsize=(8, 3.5), layout="constrained")
ax.plot(gap4, label="embedding + pos")
ax.plot(gap4_sin, label="embedding + sinusoidal")
ax.set_yscale("log")
ax.set_xlabel("token position i")
ax.set_ylabel("sim(token i, token i + 4)")
ax.set_title("same gap, very different similarity")
ax.legend()
plt.show()

# %%
# Normalising by the length, ``pos / L``, bounds the values but ties them to ``L``:
# position 5 gets a different code in a 10-token and a 1000-token sequence.
for L in (10, 100, 1000):
    print(f"L = {L:4d}: pos/L for position 5 = {5 / L:.3f}")

# %%
# 2. Tiny or large increments: drowned or dominant
# ------------------------------------------------
# Increments of 0.0001 per position are invisible next to embedding entries of size
# ~0.5; increments of 1 dwarf them after a few positions. Plot the norm of the
# position signal relative to a typical token (d = 64, N(0, 0.5^2) entries).
d = 64
token_norm = 0.5 * np.sqrt(d)
pos = np.arange(0, 2000)
ratios = {
    "0.0001 * pos in every dim": 1e-4 * pos * np.sqrt(d) / token_norm,
    "pos in every dim": pos * np.sqrt(d) / token_norm,
    "sinusoidal": np.linalg.norm(posenc.sinusoidal(pos, d), axis=1) / token_norm,
}
fig, ax = plt.subplots(figsize=(8, 3.5), layout="constrained")
for label, r in ratios.items():
    ax.plot(pos[1:], r[1:], label=label)
ax.axhspan(0.3, 3, color="tab:green", alpha=0.1, label="comparable to the token")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("position")
ax.set_ylabel("||position signal|| / ||token||")
ax.set_title("size of the position signal relative to a token")
ax.legend(fontsize=8)
plt.show()

# %%
# 3. A random start plus a constant step
# --------------------------------------
# :math:`\mathrm{PE}(p) = c + p\,\delta` (a random start :math:`c`, a constant step
# :math:`\delta`) is unique per position, but every offset :math:`r` is the same
# direction :math:`r\,\delta`: the encoding of "5 apart" and "50 apart" differ only in
# length, and the values leave ``[-1, 1]`` once ``p`` is large. For the sinusoidal
# code, the difference vectors of different offsets point in different directions
# (they are rotations of each pair, not scalings).
start = rng.uniform(-1, 1, d)
delta = np.full(d, 0.02) * rng.choice([-1, 1], d)
ramp = start + np.arange(1000)[:, None] * delta  # (1000, 64)
sin_pe = posenc.sinusoidal(1000, d)
offsets = np.array([1, 2, 5, 10, 20, 50])


def direction_cosines(table, start=100):
    diffs = table[start + offsets] - table[start]  # (6, d)
    unit = diffs / np.linalg.norm(diffs, axis=1, keepdims=True)
    return unit @ unit.T  # (6, 6)


fig, axes = plt.subplots(1, 3, figsize=(9, 3.4), layout="constrained")
for ax, table, title in [
    (axes[0], ramp, "random + constant step"),
    (axes[1], sin_pe, "sinusoidal"),
]:
    im = ax.imshow(direction_cosines(table), cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_xticks(range(6), offsets)
    ax.set_yticks(range(6), offsets)
    ax.set_xlabel("offset r")
    ax.set_ylabel("offset r'")
    ax.set_title(f"cos angle of PE(p+r)-PE(p)\n{title}")
fig.colorbar(im, ax=axes[:2], fraction=0.046)
axes[2].plot(np.abs(ramp).max(axis=1), label="random + step")
axes[2].plot(np.abs(sin_pe).max(axis=1), label="sinusoidal")
axes[2].set_xlabel("position")
axes[2].set_ylabel("max |entry|")
axes[2].legend()
axes[2].set_title("largest entry")
plt.show()
print(
    f"random + step: all offset directions parallel: "
    f"{np.allclose(np.abs(direction_cosines(ramp)), 1)}; "
    f"max |entry| at position 999 = {np.abs(ramp[-1]).max():.1f}"
)

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`.
