"""
Two pairing conventions, one model
==================================

Which coordinates form a rotating pair is a convention. ``pairing="half"`` (GPT-NeoX,
Llama in HF transformers) pairs dimension ``j`` with ``j + head_dim/2``;
``pairing="interleaved"`` (GPT-J, Meta's original Llama, RoFormer) pairs ``2j`` with
``2j + 1``. Both give the same scores once the query and key weights are permuted to
match.
"""

# %%
# The two layouts
# ---------------
# Each box is one dimension of an 8-wide head; boxes of one colour rotate together,
# at the rate of their pair.
import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc
from posenc.torch import apply_rope, interleaved_to_half

head_dim = 8
fig, axes = plt.subplots(2, 1, figsize=(7.5, 2.8), layout="constrained")
for ax, pairing in zip(axes, ["half", "interleaved"], strict=True):
    dims = np.arange(head_dim)
    pair = dims % (head_dim // 2) if pairing == "half" else dims // 2
    ax.imshow(pair[None], cmap="tab10", vmin=0, vmax=9, aspect="auto")
    for d in dims:
        ax.text(d, 0, f"dim {d}\npair {pair[d]}", ha="center", va="center", fontsize=9)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.set_title(f'pairing="{pairing}"', fontsize=10)
plt.show()

# %%
# Same scores after permuting the weights
# ---------------------------------------
# Reordering the coordinates as ``0, 2, 4, ..., 1, 3, 5, ...`` turns interleaved pairs
# into half pairs. :func:`posenc.torch.interleaved_to_half` applies that permutation to
# the rows of a query or key projection (per head), so a checkpoint trained with one
# convention runs with the other.
rng = np.random.default_rng(0)
x = rng.standard_normal((6, head_dim))  # 6 positions
swap = np.r_[0:head_dim:2, 1:head_dim:2]  # interleaved order -> half order
a = posenc.rope(x, 6, pairing="interleaved")
b = posenc.rope(x[:, swap], 6, pairing="half")
print("same scores (NumPy):", np.allclose(a @ a.T, b @ b.T))

torch.manual_seed(0)
W_q = torch.randn(2 * head_dim, 16, dtype=torch.float64)  # 2 heads, model width 16
tokens = torch.randn(1, 5, 16, dtype=torch.float64)  # (batch, seq, dim)


def queries(W, pairing):  # -> (batch, heads, seq, head_dim), rotated
    q = (tokens @ W.T).view(1, 5, 2, head_dim).transpose(1, 2)
    return apply_rope(q, pairing=pairing)


q_inter = queries(W_q, "interleaved")
q_half = queries(interleaved_to_half(W_q, head_dim=head_dim), "half")
print(
    "same scores (torch, converted weights):",
    torch.allclose(q_inter @ q_inter.transpose(-1, -2), q_half @ q_half.transpose(-1, -2)),
)

# %%
# Used here
# ---------
# :func:`posenc.rope`, :func:`posenc.torch.apply_rope`,
# :func:`posenc.torch.interleaved_to_half`.
