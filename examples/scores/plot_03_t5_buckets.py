r"""
The T5 bucket function
======================

T5 learns one bias per head for each *bucket* of the relative position (key minus
query). Distances below half the buckets (per direction) get a bucket each; larger ones
share logarithmically wider buckets up to ``max_distance``, and everything beyond shares
the last one. For a causal model with :math:`N` buckets, :math:`e = N/2` exact ones and
``max_distance`` :math:`D`, a key :math:`\Delta \ge 0` places back falls in

.. math::

    b(\Delta) = \Delta \ (\Delta < e), \qquad
    b(\Delta) = \min\Big(N - 1,\ e + \Big\lfloor
    \frac{\log(\Delta / e)}{\log(D / e)}\,(N - e)\Big\rfloor\Big) \ (\Delta \ge e).

:func:`posenc.t5_buckets` computes the buckets exactly as T5 checkpoints expect (a
float32 logarithm, truncated toward zero).
"""

# %%
# The equation, line by line
# --------------------------
# Written out in plain Python for a causal model, then checked against the library.
import math


def bucket(delta, num_buckets=32, max_distance=128):
    """Causal T5 bucket of a key ``delta >= 0`` places back."""
    e = num_buckets // 2  # exact buckets
    if delta < e:
        return delta
    grow = math.log(delta / e) / math.log(max_distance / e) * (num_buckets - e)
    return min(num_buckets - 1, e + int(grow))  # int() truncates toward zero, as T5 does


# %%
# Buckets of every offset
# -----------------------
import matplotlib.pyplot as plt
import numpy as np

import posenc

rel = np.arange(-300, 301)  # key - query
fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), layout="constrained", sharey=True)
for ax, bidirectional in zip(axes, (True, False), strict=True):
    for num_buckets, max_distance in ((32, 128), (16, 64)):
        b = posenc.t5_buckets(
            rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        ax.step(rel, b, where="mid", label=f"{num_buckets} buckets, max {max_distance}")
    ax.set_title("bidirectional (encoder)" if bidirectional else "causal (decoder)")
    ax.set_xlabel("key - query")
axes[0].set_ylabel("bucket")
axes[0].legend(fontsize=8)
plt.show()

# %%
# Where the exact range ends
# --------------------------
# With 32 causal buckets, offsets 0..15 back each have their own bucket; from 16 on,
# buckets widen; every key 128 or more back shares bucket 31. Future keys are bucket 0.
back = np.array([0, 1, 15, 16, 20, 40, 80, 127, 128, 10_000])
print("keys back:", back.tolist())
print("buckets:  ", posenc.t5_buckets(-back, bidirectional=False).tolist())
print("equation: ", [bucket(int(d)) for d in back])
print("a future key (+5):", posenc.t5_buckets([5], bidirectional=False).tolist())

# %%
# As an encoding
# --------------
# :class:`posenc.torch.T5RelativeBias` holds the learned ``(num_buckets, heads)`` table and
# reads it by bucket: the bias of query m and key n is ``table[bucket(n - m), head]``.
import torch

from posenc.torch import T5RelativeBias

t5 = T5RelativeBias(heads=4, num_buckets=32, max_distance=128)
bias = t5(torch.arange(6))  # (1, heads, 6, 6), float32
print(bias.shape, "first head, last query:", bias[0, 0, -1].detach().numpy().round(3))
