"""
Interactive: the wavelengths fan out
====================================

Each curve is one sine dimension of the encoding (``d = 64``) against position.
Drag a box on the position axis to zoom in on the fast pairs, double-click to zoom
back out and see the slow ones stretch across thousands of positions. Reading one
vertical slice down through all curves gives that position's fingerprint.

The first figure is interactive (plotly); the second is the same picture as a static
image, for print and for readers without JavaScript.
"""

# %%
# The curves
# ----------
import matplotlib.pyplot as plt
import numpy as np
import plotly.graph_objects as go

import posenc

d = 64
positions = np.arange(0, 2001)  # dense enough to draw the fastest pair smoothly
pe = posenc.sinusoidal(positions, d)  # (2001, 64)
pairs = [0, 2, 4, 8, 12, 16, 24, 31]
lam = posenc.wavelengths(d)  # (32,)

# %%
# Interactive figure
# ------------------
# In your own notebook, ``fig.show()`` displays it. Here the page embeds the HTML,
# and the site serves ``plotly.js`` itself, so it works offline too.
fig = go.Figure()
for i in pairs:
    fig.add_trace(
        go.Scatter(
            x=positions, y=pe[:, 2 * i], mode="lines", name=f"pair {i}: wavelength {lam[i]:,.1f}"
        )
    )
fig.update_layout(
    title="Sinusoidal dimensions (sine of each pair) vs position: zoom the x axis",
    xaxis=dict(title="position", range=[0, 200], rangeslider=dict(visible=True)),
    yaxis=dict(title="value", range=[-1.1, 1.1], fixedrange=True),
    height=560,
    legend=dict(font=dict(size=10), orientation="h", y=-0.45),
)


class _Html:
    """sphinx-gallery embeds the ``_repr_html_`` of a cell's last expression."""

    def __init__(self, html):
        self.html = html

    def _repr_html_(self):
        return self.html


_Html(
    fig.to_html(
        full_html=False, include_plotlyjs=False, default_width="100%", config={"responsive": True}
    )
)

# %%
# Static fallback
# ---------------
# Two windows of the same curves: the first 60 positions, where the fast pairs
# dominate, and all 2000, where pair 31 (wavelength 47,117) is still barely bent.
fig_static, axes = plt.subplots(2, 1, figsize=(9, 6), layout="constrained")
colors = plt.get_cmap("viridis")(np.linspace(0, 0.95, len(pairs)))
for ax, stop in zip(axes, (60, 2000), strict=True):
    for i, c in zip(pairs, colors, strict=True):
        ax.plot(
            positions[: stop + 1],
            pe[: stop + 1, 2 * i],
            color=c,
            lw=1.2,
            label=f"pair {i} ({lam[i]:,.0f})",
        )
    ax.set_xlim(0, stop)
    ax.set_ylabel("value")
    ax.set_title(f"positions 0-{stop}")
axes[1].set_xlabel("position")
axes[0].legend(ncol=4, fontsize=7, loc="lower left")
plt.show()

# %%
# Used here
# ---------
# :func:`posenc.sinusoidal`, :func:`posenc.wavelengths`.
