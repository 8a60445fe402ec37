"""
Decoupled RoPE for latent attention
===================================

DeepSeek's multi-head latent attention caches one latent vector :math:`c_j` per token and
makes each head's key as :math:`W_{UK} c_j`, so a score :math:`q^\\top W_{UK} c_j` can use
the *absorbed* query :math:`W_{UK}^\\top q` against the cached latents directly. A rotation
between the two would depend on the distance and block that; DeepSeek rotates a separate
slice instead, which posenc writes as
``ChannelSlice(RotaryEmbedding(rope_dim, pairing="interleaved"), start=nope_dim)``.
"""

# %%
# Absorbed scores equal the built keys' scores
# --------------------------------------------
import matplotlib.pyplot as plt
import torch

from posenc.torch import ChannelSlice, RotaryEmbedding

g = torch.Generator().manual_seed(0)
heads, rank, nope, rope_dim, n = 4, 32, 16, 8, 10
W_uk = torch.randn(heads, nope, rank, generator=g, dtype=torch.float64)  # (h, nope, r)
c = torch.randn(n, rank, generator=g, dtype=torch.float64)  # (n, r): the cache
k_rope = torch.randn(n, rope_dim, generator=g, dtype=torch.float64)  # (n, rope): shared
q = torch.randn(1, heads, n, nope + rope_dim, generator=g, dtype=torch.float64)

k = torch.cat([torch.einsum("hdr,nr->hnd", W_uk, c),  # (h, n, nope): built keys
               k_rope.expand(heads, n, rope_dim)], -1)[None]  # (1, h, n, nope + rope)
encoding = ChannelSlice(RotaryEmbedding(rope_dim, pairing="interleaved"), start=nope)
qe, ke = encoding.encode_qk(q, k, range(n), range(n))
built = qe @ ke.transpose(-1, -2)  # (1, h, n, n)

rope = RotaryEmbedding(rope_dim, pairing="interleaved")
qr, kr = rope.encode_qk(q[..., nope:], k_rope[None, None], range(n), range(n))
absorbed = torch.einsum("hdr,bhnd->bhnr", W_uk, q[..., :nope]) @ c.T  # (1, h, n, n)
absorbed = absorbed + qr @ kr.transpose(-1, -2)
print(f"largest difference: {float((built - absorbed).abs().max()):.1e}")

# %%
# What absorbing saves
# --------------------
# Multiplications per decode step against a cache of ``n`` tokens, at DeepSeek-V3's sizes
# (128 heads, latent rank 512, 128 + 64 channels per head): rebuilding every key, or one
# absorbed query (built once per step) against the latents.
H, R, dn, dr = 128, 512, 128, 64
tokens = torch.logspace(2, 5, 13)
rebuild = tokens * (H * dn * R + H * (dn + dr))
absorb = H * dn * R + tokens * H * (R + dr)
plt.figure(figsize=(6, 3.6))
plt.loglog(tokens, rebuild, label="keys rebuilt every step")
plt.loglog(tokens, absorb, label="absorbed query")
plt.xlabel("cached tokens")
plt.ylabel("multiplications per step")
plt.legend()
plt.tight_layout()
plt.show()
print(f"at 32K tokens: {float(rebuild[9] / absorb[9]):.0f}x fewer with the absorbed query")
