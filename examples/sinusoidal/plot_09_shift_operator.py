r"""
Relative position is a rotation: the shift operator
===================================================

By the angle-addition formulas, each (sin, cos) pair at rate :math:`\theta_j` moves
:math:`r` positions on by a :math:`2 \times 2` rotation through :math:`r\theta_j`:

.. math::

    \begin{pmatrix} \sin\theta_j(p+r) \\ \cos\theta_j(p+r) \end{pmatrix}
    = \begin{pmatrix} \cos r\theta_j & \sin r\theta_j \\
    -\sin r\theta_j & \cos r\theta_j \end{pmatrix}
    \begin{pmatrix} \sin p\theta_j \\ \cos p\theta_j \end{pmatrix}.

Stacking one block per pair gives a matrix :math:`T_r` with
:math:`\mathrm{PE}(p + r) = T_r\,\mathrm{PE}(p)` for *every* :math:`p`: one linear map
per offset, whatever the absolute position.
"""

# %%
# Predict PE(10) from PE(5) (r = 5, d = 64)
# -----------------------------------------
import matplotlib.pyplot as plt
import numpy as np

import posenc

d, r = 64, 5
pe = posenc.sinusoidal(200, d)  # (200, 64)
T5 = posenc.shift_operator(r, d)  # (64, 64)
predicted = T5 @ pe[5]  # (64,)
print(f"|| T_5 PE[5] - PE[10] || = {np.linalg.norm(predicted - pe[10]):.2e}")

fig, axes = plt.subplots(1, 3, figsize=(9, 3.4), layout="constrained")
axes[0].plot(pe[5, :20], "o-")
axes[0].set_title("PE[5], first 20 dims")
axes[1].plot(pe[10, :20], "o-", color="tab:green", label="actual PE[10]")
axes[1].plot(predicted[:20], "x--", color="tab:red", label="T_5 @ PE[5]")
axes[1].set_title("PE[10]: actual vs predicted")
axes[1].legend()
for ax in axes[:2]:
    ax.set_xlabel("dimension")
im = axes[2].imshow(T5[:16, :16], cmap="RdBu_r", vmin=-1, vmax=1)
axes[2].set_title("T_5, 16 x 16 corner")
axes[2].set_xlabel("input dimension")
axes[2].set_ylabel("output dimension")
fig.colorbar(im, ax=axes[2], fraction=0.046)
plt.show()

# %%
# The block-diagonal corner shows one rotation per pair: the first block turns by
# 5 radians, later blocks by ever smaller angles and tend to the identity.
#
# The same matrix works from every position (r = 7, from 42, then from 0-99)
# --------------------------------------------------------------------------
T7 = posenc.shift_operator(7, d)
print(f"PE[49]        first 4 dims: {pe[49, :4].round(6)}")
print(f"T_7 @ PE[42]  first 4 dims: {(T7 @ pe[42])[:4].round(6)}")
print(f"max |PE[49] - T_7 PE[42]|        = {np.abs(pe[49] - T7 @ pe[42]).max():.2e}")
errors = np.abs(pe[7:107] - pe[:100] @ T7.T).max(axis=1)  # (100,)
print(f"max error over positions 0-99    = {errors.max():.2e}")

# %%
# Properties worth knowing
# ------------------------
# :math:`T_r` is orthogonal (a rotation), shifts compose by adding offsets, and the
# inverse shift is the transpose.
T3 = posenc.shift_operator(3, d)
print("orthogonal:        ", np.allclose(T7 @ T7.T, np.eye(d)))
print("T_3 T_7 == T_10:   ", np.allclose(T3 @ T7, posenc.shift_operator(10, d)))
print("T_-7 == T_7^T:     ", np.allclose(posenc.shift_operator(-7, d), T7.T))

# %%
# Used here
# ---------
# :func:`posenc.shift_operator`, :func:`posenc.sinusoidal`.
