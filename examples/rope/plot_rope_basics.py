"""
RoPE in four pictures: pairings, relative scores, scalings, precision
=====================================================================

Rotary position embedding rotates each pair of query/key dimensions by an angle
proportional to the position. This example shows the two pairing conventions, checks
that the score then depends only on ``m - n``, compares the context-extension scalings,
and measures why angles must not be computed in float32.
"""

# %%
# Two pairing conventions
# -----------------------
# ``pairing="half"`` (GPT-NeoX, Llama, HF) pairs dim ``j`` with ``j + head_dim/2``;
# ``pairing="interleaved"`` (GPT-J, original Llama, RoFormer) pairs ``2j`` with ``2j+1``.
# Colours mark pairs; the same colour rotates together, at rate ``base**(-2j/head_dim)``.
import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc
import posenc.torch
from posenc.scaling import NTK, Linear, Llama3, YaRN

head_dim = 8
fig, axes = plt.subplots(2, 1, figsize=(8, 2.6), layout="constrained")
for ax, pairing in zip(axes, ["half", "interleaved"], strict=True):
    pair = np.arange(head_dim) % (head_dim // 2) if pairing == "half" else np.arange(head_dim) // 2
    ax.imshow(pair[None], cmap="tab10", vmin=0, vmax=9, aspect="auto")
    for d in range(head_dim):
        ax.text(d, 0, f"dim {d}\npair {pair[d]}", ha="center", va="center", fontsize=8)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.set_title(f'pairing="{pairing}"', fontsize=10)
plt.show()

# %%
# Both conventions give the same scores once the weights are permuted to match:
# :func:`posenc.torch.interleaved_to_half` converts q/k projection weights.
rng = np.random.default_rng(0)
x = rng.standard_normal((6, head_dim))
swap = np.r_[0:head_dim:2, 1:head_dim:2]  # interleaved order -> half order
a = posenc.rope(x, 6, pairing="interleaved")
b = posenc.rope(x[:, swap], 6, pairing="half")
print("same scores:", np.allclose(a @ a.T, b @ b.T))

# %%
# The score depends only on m - n
# -------------------------------
# Put the *same* query at every position ``m`` and the same key at every ``n``. After
# rotation, ``q'_m . k'_n = Re[sum_j q_j conj(k_j) e^{i (m - n) theta_j}]``: every
# diagonal of the score matrix is constant (a Toeplitz matrix).
head_dim, n = 64, 48
q, k = rng.standard_normal((2, head_dim))
Q = posenc.rope(np.tile(q, (n, 1)), n)  # (48, 64)
K = posenc.rope(np.tile(k, (n, 1)), n)  # (48, 64)
S = Q @ K.T  # (48, 48)
spread = max(np.ptp(np.diagonal(S, offset=o)) for o in range(-n + 1, n))
print(f"largest spread along any diagonal: {spread:.1e}")
fig, ax = plt.subplots(figsize=(4.5, 4), layout="constrained")
ax.imshow(S, cmap="RdBu_r")
ax.set_xlabel("key position n")
ax.set_ylabel("query position m")
ax.set_title("q'_m . k'_n: constant along diagonals")
plt.show()

# %%
# Context extension: what each scaling does to the wavelengths
# ------------------------------------------------------------
# Llama-style head (``head_dim = 128``, base 500,000), trained at 8,192 tokens and
# extended 8x. Position interpolation slows every pair; NTK mostly the slow ones;
# YaRN and Llama 3 keep fast pairs, slow the slow ones by the full factor and blend
# in between. The dashed line is the training length: pairs above it never completed
# a turn in training.
head_dim, base, orig, f = 128, 500_000.0, 8192, 8.0
scalings = {
    "default": None,
    "linear (PI)": Linear(f),
    "NTK": NTK(f),
    "YaRN": YaRN(f, orig),
    "Llama 3": Llama3(f, 1.0, 4.0, orig),
}
fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
for name, scaling in scalings.items():
    inv, scale = posenc.rope_frequencies(head_dim, base=base, scaling=scaling)
    ax.plot(2 * np.pi / inv, label=f"{name} (attention scale {scale:.3f})")
ax.axhline(orig, color="k", ls="--", lw=0.8)
ax.set_yscale("log")
ax.set_xlabel("pair j")
ax.set_ylabel("wavelength (positions)")
ax.legend(fontsize=8)
plt.show()

# %%
# Why the angles are computed in float64
# --------------------------------------
# At position ``2**20`` the fastest angle is about 10^6 radians; float32 keeps only 7
# significant digits, so an angle computed in float32 is off by up to ~0.03 radians
# before any cosine is taken. :func:`posenc.torch.apply_rope` multiplies positions
# and frequencies in float64 and rounds only cos/sin.
positions = torch.tensor([2**10, 2**15, 2**20 - 1])
x = torch.ones(1, 1, 3, 64)
reference = posenc.rope(np.ones((3, 64)), positions.numpy())  # float64
ours = posenc.torch.apply_rope(x, positions)[0, 0].double().numpy()
inv = torch.from_numpy(posenc.rope_frequencies(64)[0]).float()
angles32 = positions.float()[:, None] * inv  # angles in float32, as many implementations do
cos, sin = angles32.cos().double(), angles32.sin().double()
low = torch.cat([cos - sin, sin + cos], -1).numpy()  # half pairing of an all-ones vector
for p, e1, e2 in zip(
    positions.tolist(), np.abs(ours - reference).max(1), np.abs(low - reference).max(1), strict=True
):
    print(f"position {p:>8}: float64 angles error {e1:.1e}   float32 angles error {e2:.1e}")

# %%
# Used here
# ---------
# :func:`posenc.rope`, :func:`posenc.rope_frequencies`, :mod:`posenc.scaling`,
# :func:`posenc.torch.apply_rope`, :func:`posenc.torch.interleaved_to_half`.
