"""
The encoding inside a tiny transformer layer
============================================

:class:`posenc.torch.SinusoidalEncoding` adds the table to a batch of embeddings
``(batch, seq, dim)``. Here it feeds one layer: encoding, multi-head self-attention,
residual connection and LayerNorm, and we look at the attention weights of a
20-token input.
"""

# %%
# The layer
# ---------
import matplotlib.pyplot as plt
import torch
from torch import nn

from posenc.torch import SinusoidalEncoding


class TinyLayer(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.position = SinusoidalEncoding(dim, max_len=512)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):  # x: (batch, seq, dim)
        h = self.position(x)  # (batch, seq, dim)
        out, weights = self.attn(h, h, h)  # (batch, seq, dim), (batch, seq, seq)
        return self.norm(x + out), weights


torch.manual_seed(0)
layer = TinyLayer(64, 8).eval()
x = torch.randn(2, 20, 64)  # (batch, seq, dim)
with torch.no_grad():
    y, weights = layer(x)
print(f"input {tuple(x.shape)} -> output {tuple(y.shape)}, weights {tuple(weights.shape)}")
print(f"every row of weights sums to 1: {torch.allclose(weights.sum(-1), torch.ones(2, 20))}")

# %%
# Attention weights of the first sequence (averaged over the 8 heads)
# -------------------------------------------------------------------
# The layer is untrained, so there is no meaningful pattern yet: a trained model learns
# projections that turn the position signal into structure (attend to the previous
# token, to the start, ...). What the encoding already does is make the weights depend
# on position: the same tokens in the same order, with the encoding switched off, give
# different weights.
with torch.no_grad():
    _, weights_no_pe = layer.attn(x, x, x)
change = (weights - weights_no_pe).abs().max().item()
print(f"largest change of an attention weight when the encoding is removed: {change:.3f}")

fig, ax = plt.subplots(figsize=(6, 5), layout="constrained")
im = ax.imshow(weights[0], cmap="YlOrRd")
ax.set_xlabel("key position (attended to)")
ax.set_ylabel("query position (attending from)")
ax.set_title("self-attention with sinusoidal encoding (untrained)")
fig.colorbar(im, ax=ax, label="weight")
plt.show()

# %%
# Used here
# ---------
# :class:`posenc.torch.SinusoidalEncoding`.
