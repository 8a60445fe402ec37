"""
A worked example: "The cat sat" and "dog bites man"
===================================================

Small enough to check by hand: ``d_model = 4``, three tokens, and the sinusoidal rows
for positions 0-3.
"""

# %%
# Token embeddings + position = the model's input
# -----------------------------------------------
# The token rows are looked up from an embedding table (values chosen for the
# example); the position rows come from :func:`posenc.sinusoidal`.
import numpy as np

import posenc

words = ["The", "cat", "sat"]
tokens = np.array([[0.2, 0.5, -0.1, 0.8], [0.7, -0.3, 0.6, 0.1], [-0.4, 0.9, 0.2, -0.5]])  # (3, 4)
pe = posenc.sinusoidal(4, 4)  # (4, 4)


def show(title, rows, labels, fmt="{: .3f}"):
    print(title)
    print(" " * 12 + "".join(f"{f'dim{j}':>8}" for j in range(4)))
    for label, row in zip(labels, rows, strict=True):
        print(f"{label:>10}: [" + ", ".join(fmt.format(v) for v in row) + "]")
    print()


show("token_embedding", tokens, words)
show("positional_encoding (sinusoidal, d_model = 4)", pe, [f"pos {p}" for p in range(4)])
show(
    "token_embedding + positional_encoding",
    tokens + pe[:3],
    [f'"{w}"@pos{p}' for p, w in enumerate(words)],
)

# %%
# Dimension 3 is ``cos(p / 100)``: 0.99995 at position 1, 0.99980 at 2 and 0.99955 at
# 3. Printed to three decimals these round to 1.000; tables that show 0.999 have cut
# the digits off instead of rounding.
print("dim 3 for positions 1-3:", [f"{v:.5f}" for v in pe[1:, 3]])

# %%
# "dog bites man" vs "man bites dog"
# ----------------------------------
# Give the three words orthonormal embeddings (one-hot rows) and use ``Q = K = X``.
# Without position, the score matrices of the two sentences are the same matrix with
# rows and columns permuted: attention sees the same set of pairs.
vocab = {"dog": 0, "bites": 1, "man": 2}
d = 4
emb = np.eye(len(vocab), d)  # (3, 4): one-hot rows


def scores(sentence, with_pe):
    X = emb[[vocab[w] for w in sentence]]  # (3, 4)
    if with_pe:
        X = X + posenc.sinusoidal(len(sentence), d)
    return X @ X.T  # (3, 3) = Q K^T with Q = K = X


a, b = ["dog", "bites", "man"], ["man", "bites", "dog"]
swap = [2, 1, 0]  # position of each word of `a` inside `b`
for with_pe in (False, True):
    Sa, Sb = scores(a, with_pe), scores(b, with_pe)
    print(f"{'with' if with_pe else 'without'} positional encoding")
    for i in range(3):
        print(
            f"  {a[i]:>5} [{', '.join(f'{v:5.2f}' for v in Sa[i])}]    "
            f"{b[i]:>5} [{', '.join(f'{v:5.2f}' for v in Sb[i])}]"
        )
    print("  same scores up to reordering words:", np.allclose(Sa, Sb[np.ix_(swap, swap)]), "\n")

# %%
# The same four matrices as pictures: without the encoding the right matrix is the left
# one with its first and last rows and columns swapped; with it, the entries change.
import matplotlib.pyplot as plt

fig, axes = plt.subplots(2, 2, figsize=(7, 6.5), layout="constrained")
for row, with_pe in enumerate((False, True)):
    for col, sentence in enumerate((a, b)):
        S = scores(sentence, with_pe)
        ax = axes[row, col]
        ax.imshow(S, cmap="viridis", vmin=0, vmax=5)
        for i in range(3):
            for j in range(3):
                ax.text(j, i, f"{S[i, j]:.2f}", ha="center", va="center", color="w")
        ax.set_xticks(range(3), sentence)
        ax.set_yticks(range(3), sentence)
        ax.set_title(f'"{" ".join(sentence)}", {"with" if with_pe else "no"} PE', fontsize=9)
plt.show()

# %%
# With the encoding, "bites" scores the *first* word of each sentence differently
# (row 2, column 1), although it is the same word pair in a different order: the
# model can tell the sentences apart.
#
# Used here
# ---------
# :func:`posenc.sinusoidal`.
