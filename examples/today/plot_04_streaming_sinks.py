"""
Decoding past the window with sinks
===================================

:class:`~posenc.torch.EvictingKVCache` keeps the first ``sink_tokens`` tokens and the last
``window`` of everything a model reads (StreamingLLM), so its memory stays fixed however
long the text. Which position a kept token has is a parameter: ``"cache"`` (its slot, the
keys re-rotated every step, StreamingLLM's choice) or ``"original"`` (where it was read).
Below, what the cache holds as a stream goes by, and the check that a cached step equals
a forward over the kept tokens.
"""

# %%
# A one-layer model and a cache of 4 sinks + 8 recent tokens
# -----------------------------------------------------------
import matplotlib.pyplot as plt
import torch

from posenc.torch import RotaryEmbedding, TransformerLM, evicting_cache

torch.manual_seed(0)
lm = TransformerLM(32, 32, 1, 4, encoding=RotaryEmbedding(8, max_len=256)).double().eval()
ids = torch.randint(0, 32, (1, 64))
held = {}
for convention in ("cache", "original"):
    cache = evicting_cache(lm, 1, sink_tokens=4, window=8, positions=convention)
    rows = []
    with torch.no_grad():
        for t in range(64):
            logits = lm(ids[:, t : t + 1], cache=cache)  # (1, 1, vocab)
            rows.append(cache.positions[0, : len(cache)].tolist())
    held[convention] = rows
print("after 64 tokens, positions in the cache:")
for convention, rows in held.items():
    print(f"  {convention:>8}: {rows[-1]}")

# %%
# The kept tokens decide the step
# -------------------------------
# With one layer, the last step's logits equal a plain forward over the kept tokens at
# their positions (deeper models' cached keys remember the context they were made in).
kept = [0, 1, 2, 3] + list(range(56, 64))
with torch.no_grad():
    cache = evicting_cache(lm, 1, sink_tokens=4, window=8, positions="original")
    last = [lm(ids[:, t : t + 1], cache=cache) for t in range(64)][-1][:, -1]
    again = lm(ids[:, kept], positions=torch.tensor(kept))[:, -1]
print(f"largest difference: {float((last - again).abs().max()):.1e}")

# %%
# The query's position, step by step: bounded by the cache, or growing with the text.
plt.figure(figsize=(6, 3.4))
for convention, rows in held.items():
    plt.plot([r[-1] for r in rows], label=f'positions="{convention}"')
plt.xlabel("tokens read")
plt.ylabel("position of the newest token")
plt.legend()
plt.tight_layout()
plt.show()
