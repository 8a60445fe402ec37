r"""
The T5 bucket function
======================

T5 learns one bias per head for each *bucket* of the relative position (key minus
query). Distances below half the buckets (per direction) get a bucket each; larger ones
share logarithmically wider buckets up to ``max_distance``, and everything beyond shares
the last one. :func:`posenc.t5_buckets` computes the buckets exactly as T5 checkpoints
expect (a float32 logarithm, truncated toward zero).
"""

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
