r"""
FIRE: an MLP of the normalised distance
=======================================

FIRE learns the bias as a small MLP :math:`f` of the distance, after a log transform and a
division by the query's own position:

.. math::

    B_{mn} = f\!\left(\frac{\psi(m - n)}{\psi(\max(\ell, m))}\right),
    \qquad \psi(x) = \log(c\,x + 1),

with :math:`c` and the threshold :math:`\ell` learned too. Every distance a query can see
lands in :math:`[0, 1]`, whatever the query's position.
"""

# %%
# The normalised distance
# -----------------------
# With FIRE's initial :math:`c = 0.1` and :math:`\ell = 512`: below the threshold the
# input depends on the distance alone; beyond it, the farthest key always maps to 1.
import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc

c, threshold = 0.1, 512.0


def psi(x):
    return np.log1p(c * x)


fig, ax = plt.subplots(figsize=(6.5, 3.2), layout="constrained")
for m in (100, 512, 2048, 8192):
    dist = np.arange(m + 1)  # every key the query at m can see
    ax.plot(dist, psi(dist) / psi(max(threshold, m)), label=f"query at m = {m}")
ax.set_xscale("symlog", linthresh=10)
ax.set_xlabel("distance m - n")
ax.set_ylabel("MLP input")
ax.legend(fontsize=8)
plt.show()

# %%
# The module against the NumPy form
# ---------------------------------
# :class:`posenc.torch.FIRE` holds the MLP (one hidden ReLU layer) and :math:`\log c`,
# :math:`\log \ell`; :func:`posenc.fire_bias` takes the same weights as arrays.
from posenc.torch import FIRE, attend

torch.manual_seed(0)
fire = FIRE(4).double()
first, second = fire.mlp[0], fire.mlp[2]
weights = {
    "c": fire.log_c.exp().item(),
    "threshold": fire.log_threshold.exp().item(),
    "w1": first.weight[:, 0].detach().numpy(),  # (hidden,)
    "b1": first.bias.detach().numpy(),  # (hidden,)
    "w2": second.weight.detach().numpy(),  # (heads, hidden)
    "b2": second.bias.detach().numpy(),  # (heads,)
}
queries, keys = torch.tensor([5, 700, 3000]), torch.arange(3001)
with torch.no_grad():
    bias = fire(queries, keys)[0]  # (heads, 3, 3001)
ref = posenc.fire_bias(queries.numpy(), keys.numpy(), **weights)
print(f"module vs fire_bias: max |diff| = {np.abs(bias.numpy() - ref).max():.1e}")

# %%
# Any curve, including a bump
# ---------------------------
# ALiBi and KERPLE always favour the nearest key. An MLP can prefer a key a few places
# back: three hidden ReLUs that switch on at the inputs of distances 2, 3 and 4 add up to
# a hat, 1 at distance 3 and 0 at and beyond its neighbours. Set by hand in head 0:
with torch.no_grad():
    x2, x3, x4 = (float(psi(d) / psi(threshold)) for d in (2, 3, 4))  # MLP inputs
    first.weight.zero_()
    first.bias.zero_()
    first.weight[:3, 0] = 1.0
    first.bias[:3] = torch.tensor([-x2, -x3, -x4])  # hidden i = relu(x - x_(i+2))
    up, down = 1 / (x3 - x2), 1 / (x4 - x3)
    second.weight.zero_()
    second.bias.zero_()
    second.weight[0, :3] = torch.tensor([up, -(up + down), down])  # the hat
    row = fire(torch.tensor([40]), torch.arange(41))[0, 0, 0].numpy()[::-1]  # distance 0..40

fig, ax = plt.subplots(figsize=(6.5, 2.8), layout="constrained")
ax.plot(row, "o-", ms=3)
ax.set_xlabel("distance m - n (query at 40)")
ax.set_ylabel("bias, head 0")
plt.show()
print("bias at distances 0..6:", row[:7].round(3), "| largest at", int(row.argmax()))

q, k, v = torch.randn(3, 1, 4, 41, 16, dtype=torch.float64).unbind(0)  # (batch, heads, seq, dim)
out = attend(q, k, v, fire)  # causal attention with FIRE's bias; (1, 4, 41, 16)
print(out.shape)
