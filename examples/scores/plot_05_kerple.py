r"""
KERPLE: a learned curve of the distance
=======================================

KERPLE keeps ALiBi's idea -- a penalty on the distance :math:`|m - n|` added to the
scores -- but learns its shape per head, from two positive parameters
:math:`\alpha_h, \beta_h`:

.. math::

    B^{\log}_{mn} = -\alpha_h \log(1 + \beta_h |m - n|), \qquad
    B^{\mathrm{power}}_{mn} = -\alpha_h |m - n|^{\beta_h}, \quad 0 < \beta_h \le 2.

With the power kernel and :math:`\beta_h = 1` it is symmetric ALiBi.
"""

# %%
# The two kernels, by hand and from the library
# ---------------------------------------------
# :func:`posenc.kerple_bias` is the NumPy form (``r1``, ``r2`` are :math:`\alpha`,
# :math:`\beta`); one value is checked by hand, and the ALiBi special case.
import math

import matplotlib.pyplot as plt
import numpy as np
import torch

import posenc

alpha, beta = np.array([1.0, 1.0, 0.5]), np.array([0.1, 1.0, 1.5])  # 3 heads
log_bias = posenc.kerple_bias(1, 64, alpha, beta, variant="log")[:, 0]  # (heads, 64)
print(f"log kernel, head 1, key 3 from query 0: {log_bias[1, 3]:.4f}"
      f" = -1 * log(1 + 1 * 3) = {-math.log(4):.4f}")  # fmt: skip
power = posenc.kerple_bias(8, 8, alpha, np.ones(3), variant="power")  # (heads, 8, 8)
alibi = posenc.alibi_bias(alpha, 8, 8, symmetric=True)
print("power kernel with beta = 1 equals symmetric ALiBi:", np.allclose(power, alibi))

# %%
# Shapes a head can learn
# -----------------------
# The log kernel flattens out (far keys are barely told apart); the power kernel with
# :math:`\beta > 1` keeps getting steeper.
power_bias = posenc.kerple_bias(1, 64, alpha, beta, variant="power")[:, 0]  # (heads, 64)
fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), layout="constrained", sharex=True)
for h in range(3):
    label = rf"$\alpha$ = {alpha[h]}, $\beta$ = {beta[h]}"
    axes[0].plot(log_bias[h], label=label)
    axes[1].plot(power_bias[h], label=label)
axes[0].set_title("log kernel")
axes[1].set_title("power kernel")
for ax in axes:
    ax.set_xlabel("distance |m - n|")
axes[0].set_ylabel("bias")
axes[1].set_ylim(-70, 2)
axes[0].legend(fontsize=8)
plt.show()

# %%
# As an encoding
# --------------
# :class:`posenc.torch.KERPLE` learns :math:`\alpha, \beta` (kept positive through a
# softplus) and starts at ALiBi's slopes. Its bias equals the NumPy form with the
# module's own parameters, and it plugs into :func:`posenc.torch.attend` unchanged.
from posenc.torch import KERPLE, attend

kerple = KERPLE(4, variant="log").double()
with torch.no_grad():
    bias = kerple(torch.arange(16))  # (1, heads, 16, 16)
ref = posenc.kerple_bias(16, 16, kerple.r1.detach().numpy(), kerple.r2.detach().numpy())
print(f"module vs kerple_bias: max |diff| = {np.abs(bias[0].numpy() - ref).max():.1e}")

q, k, v = torch.randn(3, 2, 4, 16, 32, dtype=torch.float64).unbind(0)  # (batch, heads, seq, dim)
out = attend(q, k, v, kerple)  # causal attention with the bias; (2, 4, 16, 32)
print(out.shape)
