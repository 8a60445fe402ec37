r"""
ALiBi in your own attention with plain SDPA
===========================================

ALiBi adds :math:`-\kappa_h (m - n)` to the score of query :math:`m` and key :math:`n`, with a
fixed slope :math:`\kappa_h` per head. With :func:`torch.nn.functional.scaled_dot_product_attention`
the bias goes in the float ``attn_mask``, together with the causal mask (``-inf`` above
the diagonal).
"""

# %%
# Build the mask from the slopes
# ------------------------------
# :func:`posenc.alibi_slopes` gives the authors' slopes; the bias is the *relative*
# form (the same at every position of a KV cache, and exact near the diagonal in low
# precision).
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

import posenc

batch, heads, seq, head_dim = 2, 8, 64, 32
q, k, v = torch.randn(3, batch, heads, seq, head_dim).unbind(0)  # (batch, heads, seq, head_dim)

slopes = torch.tensor(posenc.alibi_slopes(heads), dtype=torch.float32)  # (heads,)
pos = torch.arange(seq)
distance = (pos[:, None] - pos[None, :]).float()  # (seq, seq): m - n
bias = -slopes[:, None, None] * distance  # (heads, seq, seq)
future = pos[None, :] > pos[:, None]  # (seq, seq): keys after the query
mask = bias.masked_fill(future, float("-inf"))  # (heads, seq, seq), broadcast over batch

out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (batch, heads, seq, head_dim)
print(out.shape)

# %%
# Check it against the reference
# ------------------------------
# :func:`posenc.attention` is plain NumPy (float64) with the bias added to the scaled
# scores; :class:`posenc.torch.ALiBi` builds the same bias inside posenc's attention.
ref, weights = posenc.attention(
    q.double().numpy(),
    k.double().numpy(),
    v.double().numpy(),
    mask=posenc.causal_mask(seq),
    bias=posenc.alibi_bias(posenc.alibi_slopes(heads), seq, seq),
)
print(f"max |SDPA - NumPy reference| = {np.abs(out.double().numpy() - ref).max():.1e}")

from posenc.torch import ALiBi, attend

same = attend(q, k, v, ALiBi(heads))  # posenc's core: bias, causal mask, SDPA
print(f"max |attend(ALiBi) - SDPA| = {(same - out).abs().max():.1e}")

# %%
# What the heads attend to
# ------------------------
# The average weight each head puts on keys d positions back (query 63, random q, k):
# steep heads look at the last few tokens, shallow heads further back.
fig, ax = plt.subplots(figsize=(6.5, 3.2), layout="constrained")
back = np.arange(seq)
for h in (0, 2, 4, 7):
    w = weights[:, h, -1, ::-1].mean(0)  # weight on key 63 - d, averaged over the batch
    ax.plot(back, w, label=f"head {h}, slope {slopes[h]:.3g}")
ax.set_xlabel("distance back from the query")
ax.set_ylabel("attention weight")
ax.set_title("ALiBi: steeper heads look less far back")
ax.legend()
plt.show()
