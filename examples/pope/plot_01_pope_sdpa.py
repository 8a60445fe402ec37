r"""
PoPE in your own attention with SDPA
====================================

PoPE turns component :math:`c` of a query at :math:`m` into the complex number
:math:`\mu^q_c e^{i m\theta_c}` and of a key at :math:`n` into
:math:`\mu^k_c e^{i (n\theta_c + \delta_c)}`, with :math:`\mu = \mathrm{softplus}(x)` and
:math:`\theta_c = b^{-c/d}`. Written as real vectors of width :math:`2d`, plain scaled
dot-product attention computes its scores; the values keep width :math:`d`, and the scale
stays :math:`1/\sqrt{d}`.
"""

# %%
# Build the 2d-wide queries and keys
# ----------------------------------
import math

import numpy as np
import torch
import torch.nn.functional as F

import posenc

batch, heads, seq, d = 1, 4, 12, 16
q, k, v = torch.randn(3, batch, heads, seq, d, dtype=torch.float64).unbind(0)
delta = torch.rand(heads, d, dtype=torch.float64) * -2 * math.pi  # learned in a model

theta = torch.from_numpy(posenc.pope_frequencies(d))  # (d,)
phase = torch.arange(seq, dtype=torch.float64)[:, None] * theta  # (seq, d): p * theta_c
phase_k = phase + delta[:, None, :]  # (heads, seq, d): keys carry the bias


def polar(x, phase):
    mu = F.softplus(x)  # magnitudes: the content
    return torch.cat([mu * phase.cos(), mu * phase.sin()], dim=-1)  # (..., seq, 2d)


q2, k2 = polar(q, phase), polar(k, phase_k)  # (batch, heads, seq, 2d) each
out = F.scaled_dot_product_attention(q2, k2, v, is_causal=True, scale=1 / math.sqrt(d))
print("q2", tuple(q2.shape), "v", tuple(v.shape), "-> out", tuple(out.shape))

# %%
# Check the scores against the formula
# ------------------------------------
# :func:`posenc.pope_scores` computes
# :math:`\sum_c \mu^q_c \mu^k_c \cos((n - m)\theta_c + \delta_c)` in NumPy.
scores = (q2 @ k2.transpose(-1, -2))[0].numpy()  # (heads, seq, seq)
ref = posenc.pope_scores(q[0].numpy(), k[0].numpy(), seq, seq, delta=delta.numpy())
print(f"max |q2 . k2 - pope_scores| = {np.abs(scores - ref).max():.1e}")

# %%
# The same in posenc
# ------------------
# :class:`posenc.torch.PoPE` builds ``q2, k2`` (with the bias on the query side, so keys
# can be cached and shared by grouped heads) and tells the attention core the width and
# the scale.
from posenc.torch import PoPE, attend

pope = PoPE(d, heads).double()
with torch.no_grad():
    pope.raw_delta.copy_(delta)
print(f"max |attend(PoPE) - SDPA above| = {(attend(q, k, v, pope) - out).abs().max():.1e}")
