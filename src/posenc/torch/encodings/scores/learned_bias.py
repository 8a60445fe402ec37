"""Score encodings that learn the shape of their bias: KERPLE and FIRE.

Same conventions as :mod:`.bias`: a bias ``(batch|1, heads, seq_q, seq_k)`` in the
encoding's ``work_dtype`` from ``score_bias``, and a FlexAttention ``score_mod``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import posenc
from posenc._checks import check_int, check_positive
from posenc.torch.encodings.checks import check_score_positions
from posenc.torch.encodings.scores.bias import _kept, _ScoreBias
from posenc.torch.position_values import known_bounds
from posenc.torch.positions import (
    _int_on,
    len_of,
    position_at,
    position_tensor,
    relative_positions,
)

__all__ = ["KERPLE", "FIRE"]


class KERPLE(_ScoreBias):
    r"""KERPLE (Chi et al., 2022): a learned kernel of the distance, per head.

    ``variant="log"``: :math:`-r_1 \log(1 + r_2 |i - j|)`; ``variant="power"``:
    :math:`-r_1 |i - j|^{r_2}`, :math:`0 < r_2 < 2`. The constraints hold by construction
    (softplus, and :math:`2\,\sigma` for the power), so gradients never vanish at a bound as
    with clamping. Initialised at ALiBi: :math:`r_1 = 1, r_2 = m_h` (log; near ALiBi for
    small distances) or :math:`r_1 = m_h, r_2 = 1` (power; exactly symmetric ALiBi), with
    :math:`m_h` the ALiBi slopes.

    Parameters
    ----------
    heads : int
        Number of query heads.
    variant : {"log", "power"}
        The kernel.

    Examples
    --------
    >>> from posenc.torch import KERPLE
    >>> KERPLE(1, variant="power")(range(3)).detach()[0, 0]  # initialised at |i - j| / 2**8
    tensor([[-0.0000, -0.0039, -0.0078],
            [-0.0039, -0.0000, -0.0039],
            [-0.0078, -0.0039, -0.0000]])
    """

    def __init__(self, heads, *, variant="log"):
        super().__init__()
        self.heads = check_int("heads", heads, minimum=1)
        if variant not in ("log", "power"):
            raise ValueError(f"variant must be one of ('log', 'power'), got {variant!r}")
        self.variant = variant
        self.raw_r1 = nn.Parameter(torch.empty(self.heads))
        self.raw_r2 = nn.Parameter(torch.empty(self.heads))
        self.reset_parameters()

    def reset_parameters(self):
        """Initialise at ALiBi (see the class docstring)."""
        slopes = torch.from_numpy(posenc.alibi_slopes(self.heads))
        r1, r2 = (torch.ones_like(slopes), slopes) if self.variant == "log" else (slopes, None)
        with torch.no_grad():
            self.raw_r1.copy_(_softplus_inverse(r1))
            if r2 is None:
                self.raw_r2.zero_()  # 2 * sigmoid(0) = 1
            else:
                self.raw_r2.copy_(_softplus_inverse(r2))

    @property
    def r1(self):
        """Positive per-head scale ``(heads,)``, in ``work_dtype``."""
        return F.softplus(self.raw_r1.to(self.work_dtype))

    @property
    def r2(self):
        """Per-head rate (log, positive) or exponent (power, in ``(0, 2)``)."""
        raw = self.raw_r2.to(self.work_dtype)
        return F.softplus(raw) if self.variant == "log" else 2 * torch.sigmoid(raw)

    def _kernel(self, dist, r1, r2):
        return _kerple(self.variant, dist, r1, r2)

    def score_bias(self, q_positions, k_positions, *, out=None):
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        dist = relative_positions(q_positions, k_positions, self.raw_r1.device).abs()
        dist = dist.to(self.work_dtype)
        r1, r2 = self.r1[:, None, None], self.r2[:, None, None]  # (heads, 1, 1)
        return self._kernel(dist[:, None], r1, r2)  # (b|1, heads, sq, sk)

    def score_mod(self, q_positions, k_positions):
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        device = self.raw_r1.device
        # built per call (two tiny ops), never kept: a write through `.data` bumps no version
        r1, r2 = self.r1.float(), self.r2.float()  # (heads,)
        qpos, kpos = position_at(q_positions, device), position_at(k_positions, device)

        variant = self.variant

        def kerple(score, b, h, q_idx, kv_idx):
            dist = (qpos(b, q_idx) - kpos(b, kv_idx)).abs().float()
            return score + _kerple(variant, dist, r1[h], r2[h])

        return kerple

    def extra_repr(self):
        return f"heads={self.heads}, variant={self.variant!r}"


class FIRE(_ScoreBias):
    r"""FIRE (Li et al., 2023): an MLP of the progressively interpolated distance, per head.

    :math:`B_{h,i,j} = f_\theta\big(\psi(|i-j|) / \psi(\max(L, i))\big)` with
    :math:`\psi(x) = \log(c x + 1)` and :math:`f_\theta` a ReLU MLP (1 -> ``hidden`` ->
    ``heads``); :math:`c` and :math:`L` are learned (kept positive through their
    logarithms). The reference is :func:`posenc.fire_bias`. For FlexAttention the MLP runs
    outside the kernel, once per distance (per query and distance past :math:`L`), and
    the ``score_mod`` gathers from that table (see :meth:`score_mod`).

    Parameters
    ----------
    heads : int
        Number of query heads.
    hidden : int
        Width of the MLP's hidden layer.
    c : float
        Initial :math:`c`.
    threshold : float
        Initial :math:`L`.

    Examples
    --------
    >>> from posenc.torch import FIRE
    >>> FIRE(4)(range(5)).shape
    torch.Size([1, 4, 5, 5])
    """

    eps = 1e-6

    def __init__(self, heads, *, hidden=32, c=0.1, threshold=512.0):
        super().__init__()
        self.heads = check_int("heads", heads, minimum=1)
        hidden = check_int("hidden", hidden, minimum=1)
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, self.heads))
        self.log_c = nn.Parameter(torch.tensor(math.log(check_positive("c", c))))
        threshold = check_positive("threshold", threshold)
        self.log_threshold = nn.Parameter(torch.tensor(math.log(threshold)))

    def _mlp(self, x):
        r""":math:`f_\theta` on ``x`` of any shape, in ``x``'s dtype: ``(..., heads)``."""
        work, first, last = x.dtype, self.mlp[0], self.mlp[2]
        hidden = F.relu(F.linear(x[..., None], first.weight.to(work), first.bias.to(work)))
        return F.linear(hidden, last.weight.to(work), last.bias.to(work))  # (..., heads)

    def _psi_norm(self, query, work):
        r""":math:`c` and :math:`\psi(\max(L, i)) + \epsilon` for query positions ``query``."""
        c, threshold = self.log_c.to(work).exp(), self.log_threshold.to(work).exp()
        return c, torch.log1p(c * torch.maximum(query, threshold)) + self.eps

    def score_bias(self, q_positions, k_positions, *, out=None):
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        device, work = self.log_c.device, self.work_dtype
        rel = relative_positions(q_positions, k_positions, device).to(work)  # (b|1, sq, sk)
        query = position_tensor(q_positions, device)[:, :, None].to(work)  # i: (b|1, sq, 1)
        c, norm = self._psi_norm(query, work)  # norm: (b|1, sq, 1)
        x = torch.log1p(c * rel.abs()) / norm  # in [0, 1] for keys at or before the query
        return self._mlp(x).permute(0, 3, 1, 2)  # (b|1, heads, sq, sk)

    def score_mod(self, q_positions, k_positions):
        """The bias gathered from a table of the MLP per distance (eager mode).

        Below the threshold :math:`L` the bias depends on :math:`|i - j|` alone: when no
        query is past :math:`L`, the MLP runs once per distinct distance, a
        ``(distances, heads)`` table; otherwise once per query and distance. The table is
        kept until the lengths or a parameter change (replaced, moved, cast or written in
        place: its version counter), so no call reads a value back (the largest positions
        are those of ranges, or the bounds the host already knows of tensor positions, such
        as a KV cache's; their tables grow by doubling). Write the parameters under
        ``torch.no_grad()``, as optimizers and ``load_state_dict`` do: a write through
        ``.data`` bumps no version counter, and a kept table would not see it. Positions
        of unknown bounds, queries past :math:`L` at positions that do not follow each
        other, and traced calls materialise :meth:`score_bias` (the default).

        Parameters
        ----------
        q_positions, k_positions : torch.Tensor or range
            As for :meth:`score_bias`.

        Returns
        -------
        callable
            ``f(score, b, h, q_idx, kv_idx) -> score`` for FlexAttention.
        """
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        known = [known_bounds(p) for p in (q_positions, k_positions)]  # (lo, hi), no read
        if None in known or torch.compiler.is_compiling():  # also: no queries or no keys
            return super().score_mod(q_positions, k_positions)
        (first, last), (_, k_last) = known
        device, work = self.log_c.device, self.work_dtype
        top = max(last, k_last) + 1  # every |i - j| is below it
        if not isinstance(q_positions, range) or not isinstance(k_positions, range):
            top = max(64, 1 << (top - 1).bit_length())  # a cache's bound grows each step
        threshold = _kept(self, "threshold", (self.log_threshold,), graph=False,
                          build=lambda t: float(t.detach().to(work).exp()))  # fmt: skip
        shared = last <= threshold  # i <= L for every query: norm at L
        if not shared and last - first + 1 > len_of(q_positions):  # scattered queries
            return super().score_mod(q_positions, k_positions)
        queries = (0, 1) if shared else (first, last + 1)

        def build(*_):
            dist = torch.arange(top, device=device, dtype=work)  # every distance d: (D,)
            query = torch.arange(*queries, device=device, dtype=work)  # 0 < L when shared
            c, norm = self._psi_norm(query[:, None], work)
            return self._mlp(torch.log1p(c * dist) / norm).float()  # (1|sq, D, heads)

        params = (self.log_c, self.log_threshold, *self.mlp.parameters())
        table = _kept(self, "table", params, build, key=(top, queries, work))
        qpos, kpos = position_at(q_positions, device), position_at(k_positions, device)
        row = _int_on(queries[0], device)  # the table's first query position

        def fire(score, b, h, q_idx, kv_idx):
            i = qpos(b, q_idx)
            d = (i - kpos(b, kv_idx)).abs()
            return score + table[0 if shared else i - row, d, h]

        return fire

    def extra_repr(self):
        return f"heads={self.heads}, hidden={self.mlp[0].out_features}"


def _kerple(variant, dist, r1, r2):
    return -r1 * torch.log1p(r2 * dist) if variant == "log" else -r1 * dist**r2


def _softplus_inverse(y):
    return y + torch.log(-torch.expm1(-y))  # softplus(x) = y  <=>  x = y + log(1 - e^-y)
