r"""
Context extension: what each scaling does to the wavelengths
============================================================

A model trained on :math:`L` positions has seen the angles :math:`p\theta_j` for
:math:`p < L` only. Context-extension scalings change the rates :math:`\theta_j` so
that a longer context maps back into familiar angles. Each slows a different set of
pairs; the :doc:`/explorer` lets you change the factor.
"""

# %%
# Wavelength of every pair under each scaling
# -------------------------------------------
# A Llama-style head (``head_dim = 128``, base 500,000), trained at 8,192 tokens and
# extended 8x. Position interpolation slows every pair; NTK mostly the slow ones;
# YaRN and Llama 3 keep the fast pairs, slow the slow ones by the full factor and
# blend in between. The dashed line is the training length: pairs above it never
# completed a turn in training.
import matplotlib.pyplot as plt
import numpy as np

import posenc
from posenc.scaling import NTK, Linear, Llama3, YaRN

head_dim, base, train_len, factor = 128, 500_000.0, 8192, 8.0
scalings = {
    "no scaling": None,
    "linear (PI)": Linear(factor),
    "NTK": NTK(factor),
    "YaRN": YaRN(factor, train_len),
    "Llama 3": Llama3(factor, 1.0, 4.0, train_len),
}
styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1))]
fig, axes = plt.subplots(1, 2, figsize=(8, 3.6), layout="constrained", sharey=True)
for (name, scaling), style in zip(scalings.items(), styles, strict=True):
    inv, scale = posenc.rope_frequencies(head_dim, base=base, scaling=scaling)
    for ax in axes:
        ax.plot(2 * np.pi / inv, ls=style, lw=1.8, label=f"{name} (scale {scale:.3f})")
    print(f"{name:>12}: fastest {2 * np.pi / inv[0]:6.1f}, slowest {2 * np.pi / inv[-1]:14,.0f}")
for ax in axes:
    ax.axhline(train_len, color="k", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("pair j")
axes[0].set_ylabel("wavelength (positions)")
axes[0].set_title("all pairs")
axes[1].set_xlim(20, 50)
axes[1].set_title("pairs 20-50, where they differ")
axes[0].legend(fontsize=8, loc="upper left")
plt.show()

# %%
# The right panel zooms on the pairs whose wavelength crosses the training length:
# linear is above every other curve, YaRN and Llama 3 both start at the unscaled curve
# and reach the linear one, by different ramps.
#
# Used here
# ---------
# :func:`posenc.rope_frequencies`, :mod:`posenc.scaling`.
