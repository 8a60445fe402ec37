"""
NoPE layers and query temperature
=================================

Llama 4 leaves every fourth layer without position and scales that layer's queries by
:math:`\\tau(p) = 1 + s \\ln(1 + \\lfloor (p + 1) / f \\rfloor)` (:math:`s = 0.1`,
:math:`f = 8192`). A query that must find one key among :math:`n` gets a softmax that
spreads as :math:`n` grows; multiplying the scores by :math:`\\tau` sharpens it again.
:class:`~posenc.torch.QueryTemperature` is that factor, and
``Layer(QueryTemperature(scale=0.1, floor=8192, shift=1))`` is Llama 4's NoPE layer.
"""

# %%
# The factor against position
# ---------------------------
import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc
from posenc.torch import QueryTemperature

p = np.arange(0, 262_144, 64)  # up to 256K positions
tau = posenc.query_temperature(p, scale=0.1, floor=8192, shift=1)  # (n,)
print(f"tau at 8191: {tau[p == 8128][0]:.3f} (still 1), at 256K: {tau[-1]:.3f}")

# %%
# What it does to attention
# -------------------------
# One query whose key is among ``n`` random ones: the weight softmax gives the right key,
# with and without the temperature, as the context grows (positions of the query = n - 1).
torch.manual_seed(0)
d, lengths = 128, [2**k for k in range(10, 19)]
llama4 = QueryTemperature(scale=0.1, floor=8192, shift=1)
weights = {"no temperature": [], "Llama 4's temperature": []}
for n in lengths:
    k = torch.randn(1, 1, n, d) / d**0.25  # (1, 1, n, d)
    q = 8 * k[:, :, -1:].clone()  # (1, 1, 1, d): aligned with the last key
    for name, enc in [("no temperature", None), ("Llama 4's temperature", llama4)]:
        qe = q if enc is None else enc.encode_qk(q, k, range(n - 1, n), range(n))[0]
        w = torch.softmax((qe @ k.transpose(-1, -2))[0, 0, 0] / d**0.5, -1)  # (n,)
        weights[name].append(float(w[-1]))

fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
a.plot(p, tau)
a.set_xlabel("position p")
a.set_ylabel("tau(p)")
a.set_title("the factor", fontsize=11)
for name, ws in weights.items():
    b.plot(lengths, ws, marker="o", label=name)
b.set_xscale("log", base=2)
b.set_xlabel("keys in context")
b.set_ylabel("weight on the matching key")
b.set_title("one matching key among n", fontsize=11)
b.legend()
fig.tight_layout()
plt.show()

# %%
# Below 8192 positions the factor is 1 and nothing changes; past it the matching key gets
# more weight with the temperature at every length drawn here (the keys are drawn anew at
# each length, hence the jumps between lengths). Part 8 trains this layer, scaled to a
# 128-byte model, on the text study of Part 6.
for n, a_, b_ in zip(lengths, *weights.values()):
    print(f"{n:7d} keys: {a_:.3f} without, {b_:.3f} with the temperature")
assert all(b_ > a_ for n, a_, b_ in zip(lengths, *weights.values()) if n >= 8192)
