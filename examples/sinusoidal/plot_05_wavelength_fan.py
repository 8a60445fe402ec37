r"""
Interactive: the wavelengths fan out
====================================

Each curve is the sine coordinate of one pair of the encoding (:math:`d = 64`)
against position. Drag a box on the position axis to zoom in on the fast pairs,
double-click to zoom back out and see the slow ones stretch across thousands of
positions. Reading one vertical slice down through all curves gives that position's
fingerprint.

The first figure is interactive (plotly); the second is the same picture as a static
image, for print and for readers without JavaScript.
"""

# %%
# The curves
# ----------
# The encoding exists at integer positions only (the markers when you zoom in). The
# line through them is the wave :math:`\sin(x\,\theta_j)` those positions sample, drawn
# with the library's rates :func:`posenc.frequencies` at 24 points per period, so even
# the fastest pair (period :math:`2\pi \approx 6.3`) is smooth; at integers the wave
# equals :func:`posenc.sinusoidal` (checked below).
import matplotlib.pyplot as plt
import numpy as np
import plotly.graph_objects as go
from IPython.display import HTML

import posenc

d = 64
positions = np.arange(0, 2001)  # integer positions 0..2000
pe = posenc.sinusoidal(positions, d)  # (2001, 64)
theta = posenc.frequencies(d)  # (32,) rates
lam = posenc.wavelengths(d)  # (32,) periods
pairs = [0, 2, 4, 8, 12, 16, 24, 31]
wave_x = {j: np.arange(0, 2000, min(lam[j] / 24, 2.0)) for j in pairs}  # fine sampling
print(
    "wave == encoding at integer positions:", np.allclose(np.sin(positions * theta[5]), pe[:, 10])
)
print("points per curve:", {j: x.size for j, x in wave_x.items()})

# %%
# Interactive figure
# ------------------
# In your own notebook, ``fig.show()`` displays it. This page embeds the same figure
# as HTML; the site serves ``plotly.js`` itself, so it works offline too.
fig = go.Figure()
for j in pairs:
    fig.add_trace(
        go.Scatter(
            x=wave_x[j],
            y=np.sin(wave_x[j] * theta[j]),
            mode="lines",
            name=f"pair {j}: wavelength {lam[j]:,.1f}",
        )
    )
fig.update_layout(
    xaxis=dict(title="position p", range=[0, 120], rangeslider=dict(visible=True, thickness=0.08)),
    yaxis=dict(title="sin(p θ_j)", range=[-1.1, 1.1], fixedrange=True),
    height=620,
    margin=dict(l=60, r=20, t=30, b=40),
    legend=dict(orientation="h", yanchor="top", y=-0.32, x=0, font=dict(size=11)),
)
HTML(
    fig.to_html(
        full_html=False, include_plotlyjs=False, default_width="100%", config={"responsive": True}
    )
)

# %%
# Static version
# --------------
# Two windows of the same curves: the first 60 positions, where the fast pairs
# dominate, and all 2000, where pair 31 (wavelength 47,117) is still barely bent.
fig_static, axes = plt.subplots(2, 1, figsize=(8, 6), layout="constrained")
colors = plt.get_cmap("viridis")(np.linspace(0, 0.95, len(pairs)))
for ax, stop in zip(axes, (60, 2000), strict=True):
    for j, c in zip(pairs, colors, strict=True):
        x = wave_x[j][wave_x[j] <= stop]
        ax.plot(x, np.sin(x * theta[j]), color=c, lw=1.2, label=f"pair {j} ({lam[j]:,.0f})")
    ax.set_xlim(0, stop)
    ax.set_ylabel("value")
    ax.set_title(f"positions 0-{stop}")
axes[1].set_xlabel("position p")
axes[0].legend(ncol=4, fontsize=8, loc="lower left")
plt.show()

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`, :func:`posenc.frequencies`, :func:`posenc.wavelengths`.
