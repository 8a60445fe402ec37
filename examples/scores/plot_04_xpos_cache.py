r"""
xPos with a KV cache
====================

xPos scales the rotated query at :math:`m` by :math:`\zeta_j^{m/\gamma}` and the key at
:math:`n` by :math:`\zeta_j^{-n/\gamma}`, so every score carries :math:`\zeta_j^{(m-n)/\gamma}`.
The powers are huge far from zero, so implementations *centre* them; centring on the
middle of each call's sequence cancels within a call but not between the calls of a KV
cache. :class:`posenc.torch.XPos` centres once, at ``max_len // 2``.
"""

# %%
# A per-call centre breaks cached decoding
# ----------------------------------------
# Decode one query at position 63 against keys cached when the sequence was 32 long
# (centre 16) and a new key encoded with this call's centre (32). The scores should
# equal those of one call over all 64 positions (centre 32).
import numpy as np

import posenc

rng = np.random.default_rng(0)
d, gamma = 32, 8.0  # a small scale base makes the effect visible on 64 positions
q, keys = rng.standard_normal((1, d)), rng.standard_normal((64, d))
zeta = (np.arange(0, d, 2) + 0.4 * d) / (1.4 * d)  # (d // 2,), every zeta_j < 1


def xpos(x, positions, key, center):
    """RoPE, then pair j scaled by zeta_j^(+-(p - center) / gamma): + for queries, - for keys."""
    power = (np.asarray(positions, dtype=float)[:, None] - center) / gamma  # (seq, 1)
    scale = zeta ** (-power if key else power)  # (seq, d // 2)
    return posenc.rope(x, positions) * np.tile(scale, 2)  # half pairing: j and j + d/2


# the centre cancels within one call: the same scores as posenc.xpos (centre 0)
check = xpos(q, [63], False, 32) @ xpos(keys, np.arange(64), True, 32).T
ref = posenc.xpos(q, [63], scale_base=gamma) @ posenc.xpos(keys, 64, key=True, scale_base=gamma).T
print(f"one call, centre 32 vs centre 0: max |diff| = {np.abs(check - ref).max():.1e}")

full = xpos(q, [63], False, 32) @ xpos(keys, np.arange(64), True, 32).T  # one call
cached_keys = np.vstack(
    [
        xpos(keys[:32], np.arange(32), True, 16),  # an earlier call, centred on its middle
        xpos(keys[32:], np.arange(32, 64), True, 32),
    ]
)
per_call = xpos(q, [63], False, 32) @ cached_keys.T
print(f"per-call centre: max |cached - full| = {np.abs(per_call - full).max():.2e}")

# %%
# A fixed centre: cached decoding equals the full forward
# -------------------------------------------------------
import torch

from posenc.torch import TransformerLM, XPos

torch.manual_seed(0)
lm = TransformerLM(50, 32, 2, 4, encoding=XPos(8, max_len=128)).double().eval()
idx = torch.randint(0, 50, (1, 40))
with torch.no_grad():
    whole = lm(idx)  # (1, 40, 50)
    cache = lm.new_cache(batch=1, max_len=40)
    steps = [lm(idx[:, :20], cache=cache)]  # prefill, then one token per call
    steps += [lm(idx[:, t : t + 1], cache=cache) for t in range(20, 40)]
print(
    f"fixed centre {lm.encoding.center}: max |cached - full| = "
    f"{(torch.cat(steps, 1) - whole).abs().max():.1e}"
)
