r"""
Why RoPE angles are computed in float64
=======================================

At position :math:`p` the fastest pair turns by :math:`p\theta_0 = p` radians. Near
:math:`p = 2^{20}` that is about :math:`10^6` radians, where neighbouring float32
numbers are :math:`2^{-4} = 0.0625` apart: a product rounded to float32 is off by up
to half of that, 0.03 radians, and a rate :math:`\theta_j` that was itself rounded to
float32 adds its own error, multiplied by :math:`p`.
:func:`posenc.torch.apply_rope` multiplies positions and rates in float64 and rounds
only cos and sin to the input's dtype.
"""

# %%
# Rotation error against a float64 reference
# -------------------------------------------
# Rotate an all-ones head at three positions with :func:`posenc.torch.apply_rope`
# (float32 output) and with angles formed in float32, as many implementations do, and
# compare both with the NumPy reference :func:`posenc.rope` (float64 throughout).
import numpy as np
import torch

import posenc
import posenc.torch

positions = torch.tensor([2**10, 2**15, 2**20 - 1])
x = torch.ones(1, 1, 3, 64)  # (batch, heads, seq, head_dim)
reference = posenc.rope(np.ones((3, 64)), positions.numpy())  # float64
ours = posenc.torch.apply_rope(x, positions)[0, 0].double().numpy()
inv = torch.from_numpy(posenc.rope_frequencies(64)[0]).float()
angles32 = positions.float()[:, None] * inv  # (3, 32) angles rounded to float32
angle_error = (angles32.double() - positions.double()[:, None] * inv.double()).abs().max(1).values
angle_error_total = (
    (
        angles32.double()
        - positions.double()[:, None] * torch.from_numpy(posenc.rope_frequencies(64)[0])
    )
    .abs()
    .max(1)
    .values
)
cos, sin = angles32.cos().double(), angles32.sin().double()
low = torch.cat([cos - sin, sin + cos], -1).numpy()  # half pairing of an all-ones vector
for p, e1, e2 in zip(
    positions.tolist(), np.abs(ours - reference).max(1), np.abs(low - reference).max(1), strict=True
):
    print(f"position {p:>8}: output error, angles in float64 {e1:.1e}, in float32 {e2:.1e}")
print("float32 angle error from rounding the product:", angle_error.numpy().round(4))
print("float32 angle error including the rounded rates:", angle_error_total.numpy().round(4))

# %%
# The float32-angle error grows with the position, as the spacing of float32 numbers
# does. At :math:`2^{20}` the angles are off by a few hundredths of a radian (the
# printed values), and a rotated pair of ones, of length :math:`\sqrt 2`, moves by
# about :math:`\sqrt 2` times that: the output errors printed first. With float64
# angles the only error left is float32's rounding of the output.
#
# Used here
# ---------
# :func:`posenc.rope`, :func:`posenc.rope_frequencies`, :func:`posenc.torch.apply_rope`.
