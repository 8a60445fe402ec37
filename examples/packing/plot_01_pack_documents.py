r"""
Pack documents into one row
===========================

Training on many short documents wastes most of a padded batch on padding. Packing puts
them back to back in one row instead. Two things must then hold for every document:
its positions restart at 0, and its tokens attend only to its own earlier tokens. In
:mod:`posenc` both follow from one tensor, ``documents``: the id of each token's document.
"""

# %%
# Three documents, one row
# ------------------------
# Document ids, non-decreasing along the row, give the positions
# (:func:`~posenc.torch.positions_from_documents`) and flash-attention's ``cu_seqlens``
# (:func:`~posenc.torch.cu_seqlens_from_documents`); HF's ``DataCollatorWithFlattening``
# hands out those same positions, and :func:`~posenc.torch.documents_from_positions`
# turns them back into ids.
import matplotlib.pyplot as plt
import torch

from posenc.torch import (
    RotaryEmbedding,
    TransformerLM,
    attend,
    cu_seqlens_from_documents,
    documents_from_positions,
    positions_from_documents,
)

documents = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]])  # (batch, seq)
positions = positions_from_documents(documents)  # (batch, seq): 0 at each start
print("positions ", positions.tolist())
print("cu_seqlens", cu_seqlens_from_documents(documents).tolist())
print("round trip", bool((documents_from_positions(positions) == documents).all()))

# %%
# What each token may see
# -----------------------
# The mask attention adds to the scores is causal *and* block-diagonal: one triangle per
# document. With ``backend="flex"`` the same rule becomes a FlexAttention block mask, and
# blocks between documents are skipped rather than computed and discarded.
# With the identity as values, attention returns its own weights: row i, column j is how
# much query i takes from key j.
rope = RotaryEmbedding(8, max_len=64)
torch.manual_seed(0)
q, k = torch.randn(2, 1, 1, 12, 8)  # (batch, heads, seq, head_dim) each
values = torch.eye(12)[None, None]  # (batch, heads, seq, 12)
weights = attend(q, k, values, rope, documents=documents)[0, 0]  # (12, 12)
fig, ax = plt.subplots(figsize=(4.6, 4), layout="constrained")
ax.imshow(weights > 0, cmap="Greys")
ax.set_xlabel("key token")
ax.set_ylabel("query token")
ax.set_title("packed: causal within each document")
plt.show()

# %%
# Each document gets the logits it would get alone
# ------------------------------------------------
# Run the packed row once, then each document by itself: the logits agree to float64
# rounding, although the second and third documents sit at slots 5-11 of the row.
torch.manual_seed(0)
lm = TransformerLM(50, 32, 2, 4, encoding=RotaryEmbedding(8, max_len=64)).double().eval()
tokens = torch.randint(0, 50, (1, 12))
with torch.no_grad():
    packed = lm(tokens, documents=documents)  # (1, 12, 50)
    worst = 0.0
    for d in range(3):
        where = (documents[0] == d).nonzero().flatten()
        alone = lm(tokens[:, where])  # (1, length, 50)
        worst = max(worst, float((alone - packed[:, where]).abs().max()))
print(f"largest difference, packed vs alone: {worst:.1e}")
