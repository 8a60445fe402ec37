r"""
What a learned position table learns
====================================

A learned absolute encoding is a trainable table :math:`W_{\text{pos}}` with one row
per position, added to the token embedding like the sinusoidal table
(:class:`posenc.torch.LearnedEncoding`). Train a tiny model on a task that needs
position -- predict the token three places back -- and look at the rows it learned.
"""

# %%
# Train a two-layer model on the lag-3 task
# -----------------------------------------
# Sequences of 24 random tokens from a vocabulary of 16; the target at position
# :math:`t` is the token at :math:`t - 3`. The table has room for 48 positions, but
# training only shows it positions 0-23.
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from posenc.torch import LearnedEncoding, TransformerLM

torch.set_num_threads(1)  # tensors this small train fastest on one thread
torch.manual_seed(0)
vocab, length, lag, dim = 16, 24, 3, 32
generator = torch.Generator().manual_seed(0)


def lag_batch(n, seq_len):
    x = torch.randint(0, vocab, (n, seq_len), generator=generator)  # (batch, seq)
    y = torch.roll(x, lag, dims=1)  # y[:, t] = x[:, t - lag]
    y[:, :lag] = -100  # no target for the first positions
    return x, y


model = TransformerLM(vocab, dim, depth=2, heads=4, encoding=LearnedEncoding(2 * length, dim))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for _ in range(300):
    x, y = lag_batch(32, length)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    x, y = lag_batch(256, length)
    accuracy = (model(x).argmax(-1) == y)[:, lag:].float().mean().item()
print(f"final loss {loss.item():.3f}, accuracy at length {length}: {accuracy:.1%}")

# %%
# The table and the similarity of its rows
# ----------------------------------------
# Cosine similarity of every pair of trained rows. Rows 24-47 were never used, so
# they keep their random initialisation (standard deviation 0.02) while the trained
# rows grew.
table = model.encoding.weight.detach().numpy()  # (48, 32)
trained = table[:length]  # (24, 32)
unit = trained / np.linalg.norm(trained, axis=1, keepdims=True)
cosine = unit @ unit.T  # (24, 24)
mean_cos = {offset: np.diagonal(cosine, offset).mean() for offset in (1, 2, 3, 6)}
for offset, value in mean_cos.items():
    print(f"mean cosine of rows {offset} apart: {value:+.3f}")
print("rows 3 apart (the lag) more alike than neighbours:", bool(mean_cos[3] > mean_cos[1]))
norms = np.linalg.norm(table, axis=1)
print(f"row norm: trained {norms[:length].mean():.3f}, never trained {norms[length:].mean():.3f}")

fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(8, 3.6), layout="constrained")
lim = np.abs(table).max()
ax0.imshow(table, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
ax0.axhline(length - 0.5, color="k", lw=1)
ax0.set_xlabel("dimension")
ax0.set_ylabel("position")
ax0.set_title("learned table (below the line: never trained)", fontsize=10)
im = ax1.imshow(cosine, cmap="RdBu_r", vmin=-1, vmax=1)
ax1.set_xlabel("position")
ax1.set_ylabel("position")
ax1.set_title("cosine similarity of trained rows", fontsize=10)
fig.colorbar(im, ax=ax1, fraction=0.046)
plt.show()

# %%
# Training organised the rows around what the task needs rather than around a smooth
# notion of distance: rows three positions apart -- the lag of the task -- are more
# alike than neighbours (the printed means), which shows as stripes parallel to the
# diagonal. The rows past position 23 are still noise, which is why a learned table says nothing
# about positions it was not trained on (measured in :doc:`/series/part2-learned`).
#
# Used here
# ---------
# :class:`posenc.torch.LearnedEncoding`, :class:`posenc.torch.TransformerLM`.
