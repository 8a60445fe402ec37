r"""
Attention cannot see order: permutation equivariance
====================================================

Self-attention without positional information is *permutation equivariant*: shuffle
the input tokens and the outputs come back shuffled the same way, each token's output
unchanged. Written with a permutation matrix :math:`\Pi`:
:math:`\mathrm{Attention}(\Pi X) = \Pi\,\mathrm{Attention}(X)`.
"""

# %%
# Permutation matrices
# --------------------
# ``P`` has a single 1 in each row and column; ``P @ X`` reorders the rows of ``X``.
# The identity leaves rows in place; swapping two 1s swaps two rows (here rows 2 and
# 5 when counting from 1, indices 1 and 4).
import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc

perm = np.array([0, 4, 2, 3, 1, 5, 6])
P = posenc.permutation_matrix(perm)  # (7, 7)
fig, axes = plt.subplots(1, 2, figsize=(8, 4), layout="constrained")
for ax, M, title in [
    (axes[0], np.eye(7, dtype=int), "identity I: no change"),
    (axes[1], P, "P: rows 2 and 5 swap"),
]:
    ax.imshow(M, cmap="Greys", vmin=0, vmax=1.6)
    for r in range(7):
        for c in range(7):
            ax.text(c, r, M[r, c], ha="center", va="center", color="white" if M[r, c] else "black")
    ax.set_xticks(range(7))
    ax.set_yticks(range(7), [f"row {r + 1}" for r in range(7)])
    ax.set_title(title)
plt.show()

# %%
# Check it with the NumPy reference
# ---------------------------------
# Random projections ``W_q, W_k, W_v``; attention of ``P X`` against ``P`` times
# attention of ``X``.
rng = np.random.default_rng(42)
N, d_model, d_head = 7, 4, 4
X = rng.random((N, d_model))
W_q, W_k, W_v = (rng.random((d_model, d_head)) for _ in range(3))


def self_attention(X):
    out, _ = posenc.attention(X @ W_q, X @ W_k, X @ W_v)  # (N, d_head)
    return out


y, y_perm = self_attention(X), self_attention(P @ X)
print("Attention(P X) == P Attention(X):", np.allclose(y_perm, P @ y))

# %%
# The same with ``torch.nn.MultiheadAttention``
# ---------------------------------------------
# Six tokens of width 32, four heads, permutation ``[2, 0, 4, 1, 5, 3]``. After
# undoing the permutation the outputs agree to float32 rounding.
torch.manual_seed(42)
mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
tokens = torch.randn(1, 6, 32)  # (batch, seq, dim)
order = torch.tensor([2, 0, 4, 1, 5, 3])
with torch.no_grad():
    out, _ = mha(tokens, tokens, tokens)  # (1, 6, 32)
    out_shuffled, _ = mha(tokens[:, order], tokens[:, order], tokens[:, order])
undone = out_shuffled[:, torch.argsort(order)]  # (1, 6, 32)
print(f"mean |difference| after un-permuting: {(out - undone).abs().mean().item():.2e}")
print(f"max  |difference| after un-permuting: {(out - undone).abs().max().item():.2e}")

# %%
# Add the sinusoidal encoding and the symmetry breaks
# ---------------------------------------------------
# The encoding belongs to the *slot*, not the token: after shuffling, each token gets
# the encoding of its new position, so ``P X + PE != P (X + PE)`` and the outputs of
# the un-shuffled sequence differ.
rng = np.random.default_rng(42)
seq_len, d = 6, 64
X = rng.standard_normal((seq_len, d))
W_q, W_k, W_v = (rng.standard_normal((d, d)) for _ in range(3))
pe = posenc.sinusoidal(seq_len, d)
shuffle = np.array([5, 3, 1, 4, 0, 2])
y = self_attention(X + pe)
y_shuffled = self_attention(X[shuffle] + pe)[np.argsort(shuffle)]
y_no_pe = self_attention(X)
y_no_pe_shuffled = self_attention(X[shuffle])[np.argsort(shuffle)]
print(
    f"without PE: max difference after un-shuffling = "
    f"{np.abs(y_no_pe - y_no_pe_shuffled).max():.1e}"
)
print(f"with PE:    max difference after un-shuffling = {np.abs(y - y_shuffled).max():.4f}")

# %%
# Used here
# ---------
# :func:`posenc.permutation_matrix`, :func:`posenc.attention`, :func:`posenc.sinusoidal`.
