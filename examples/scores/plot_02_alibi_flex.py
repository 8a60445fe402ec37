r"""
ALiBi as a FlexAttention score_mod
==================================

FlexAttention takes the bias as a function of (score, batch, head, query index, key
index) and computes it inside the kernel: no ``(heads, seq, seq)`` tensor. The causal
mask becomes a block mask, so blocks above the diagonal are skipped.
"""

# %%
# The score_mod and the block mask
# --------------------------------
# ``flex_attention`` is compiled once (the first call takes a few seconds); on the CPU
# it runs forward only in torch 2.13.
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import posenc

batch, heads, seq, head_dim = 1, 8, 256, 32
q, k, v = torch.randn(3, batch, heads, seq, head_dim).unbind(0)  # (batch, heads, seq, head_dim)
slopes = torch.tensor(posenc.alibi_slopes(heads), dtype=torch.float32)  # (heads,)


def alibi(score, b, h, q_idx, kv_idx):
    return score - slopes[h] * (q_idx - kv_idx)  # -slope (m - n), in float32


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


block_mask = create_block_mask(causal, None, None, seq, seq, device="cpu")
flex = torch.compile(flex_attention)
start = time.perf_counter()
with torch.no_grad():
    out = flex(q, k, v, score_mod=alibi, block_mask=block_mask)  # (batch, heads, seq, head_dim)
print(f"first call (compiles): {time.perf_counter() - start:.1f} s; output {tuple(out.shape)}")

# %%
# The same numbers as a float mask with SDPA
# ------------------------------------------
import torch.nn.functional as F

pos = torch.arange(seq)
bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).float()  # (heads, seq, seq)
mask = bias.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
print(f"max |flex - SDPA with the mask| = {(out - sdpa).abs().max():.1e}")

# %%
# In posenc
# ---------
# :class:`posenc.torch.ALiBi` provides this ``score_mod`` (for per-row positions and a
# KV cache too), and ``backend="flex"`` selects it in the attention core:
#
# .. code-block:: python
#
#     from posenc.torch import ALiBi, attend
#
#     with torch.no_grad():
#         out = attend(q, k, v, ALiBi(heads), backend="flex")
#
# (not run here: it compiles a second kernel; posenc's tests compare it with SDPA for
# every score encoding).
