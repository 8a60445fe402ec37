"""xPos in torch: RoPE whose pairs also decay with distance (queries/keys).

Shape legend: ``q`` is ``(batch, heads, seq, head_dim)``, ``k`` is
``(batch, kv_heads, seq, head_dim)``.
"""

from __future__ import annotations

import math

import torch

import posenc
from posenc._checks import check_positive
from posenc.torch.encodings.checks import check_hook
from posenc.torch.encodings.qk.rope import RotaryEmbedding
from posenc.torch.kernels import rotate_qk
from posenc.torch.position_values import bounds, check_values, traced
from posenc.torch.positions import position_tensor

__all__ = ["XPos"]

_HEADROOM = 16.0  # inputs up to this magnitude may be scaled without overflowing


class XPos(RotaryEmbedding):
    r"""xPos (Sun et al., 2022): RoPE times :math:`\zeta_j^{(m - n)/s}` on every pair's score.

    Queries at :math:`m` are rotated and scaled by :math:`\zeta_j^{(m - c)/s}`, keys at
    :math:`n` by :math:`\zeta_j^{-(n - c)/s}` (see :func:`posenc.xpos_decay`), so a score
    carries :math:`\zeta_j^{(m - n)/s}`: the centre :math:`c` cancels. It is fixed at
    ``max_len // 2`` (not recomputed per call), so cached keys stay valid while decoding,
    and the scales reach :math:`\zeta_{\min}^{\mp \text{max\_len} / 2s}` at most. Scales are
    computed in float64 and folded into the cos/sin table; positions whose scales a dtype
    cannot hold (float16 beyond a few thousand positions from the centre) raise
    :class:`ValueError` instead of producing ``inf`` or ``nan``. The window leaves room
    for inputs of magnitude up to 16 (:meth:`window`); larger entries near its edge can
    still overflow float16.

    Parameters
    ----------
    head_dim : int
        Width of one head; even.
    scale_base : float
        :math:`s` (512 in the paper).
    base : float
        The RoPE base.
    pairing : {"half", "interleaved"}
        Which dims form a pair.
    rotary_dim : int, optional
        Rotate and scale only the first ``rotary_dim`` dims.
    max_len : int
        Positions ``>= max_len`` raise; sets the centre.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import XPos
    >>> xpos = XPos(8, max_len=64)
    >>> q, k = torch.ones(1, 1, 64, 8), torch.ones(1, 1, 64, 8)
    >>> qx, kx = xpos(q, k)
    >>> s = (qx @ kx.transpose(-1, -2))[0, 0]
    >>> bool(torch.allclose(s[40, 30], s[50, 40])), bool(s[40, 39] > s[40, 0])
    (True, True)
    """

    _DERIVED = (*RotaryEmbedding._DERIVED, "log_zeta")

    def __init__(
        self, head_dim, *, scale_base=512.0, base=10_000.0, pairing="half", rotary_dim=None,
        max_len=4096,
    ):  # fmt: skip
        self.scale_base = check_positive("scale_base", scale_base)
        super().__init__(
            head_dim, base=base, pairing=pairing, rotary_dim=rotary_dim, max_len=max_len
        )
        self.center = self.max_len // 2
        reach = self.window(torch.float32)
        if max(self.center, self.max_len - 1 - self.center) > reach:  # position 0 is farthest
            raise ValueError(
                f"max_len must be <= {2 * reach + 1} for xPos with scale_base={self.scale_base} "
                f"(its scales would overflow float32), got {self.max_len}"
            )

    def _derived_tensors(self):
        tables = super()._derived_tensors()
        decay = posenc.xpos_decay(self.rotary_dim, [self.scale_base], scale_base=self.scale_base)
        tables["log_zeta"] = torch.from_numpy(decay[0]).log()  # float64 (r // 2,)
        return tables

    def window(self, dtype) -> int:
        """How far from the centre positions may be for ``dtype`` (scales stay finite).

        Parameters
        ----------
        dtype : torch.dtype
            Dtype of the queries and keys.

        Returns
        -------
        int
            The largest ``|p - center|`` allowed.
        """
        log_zeta_min = math.log(0.4 / 1.4)  # pair 0 decays fastest
        room = math.log(torch.finfo(dtype).max / _HEADROOM)
        return int(room * self.scale_base / -log_zeta_min)

    def _check_window(self, name, positions, dtype):
        """``positions`` after checking they are within :meth:`window` of the centre."""
        w, c = self.window(dtype), self.center
        if traced(positions):  # values out of reach: the checking op, with the window
            why = f"; xPos in {dtype} keeps within {w} of the centre {c}"
            return check_values(name, positions, c + w + 1, low=max(0, c - w), limit="", why=why)
        found = (positions.start, positions.stop - 1) if isinstance(positions, range) else None
        found = bounds(positions) if found is None else found  # remembered: no second read
        if found is not None:
            lo, hi = found
            worst = lo if abs(lo - c) >= abs(hi - c) else hi
            if abs(worst - c) > w:
                raise ValueError(
                    f"positions must be within {w} of the centre {c} for xPos in {dtype} "
                    f"(its scales would overflow), got {worst}"
                )
        return positions

    def _scaled(self, name, positions, dtype, sign, device):
        positions = self._check_window(name, positions, dtype)
        cs = self._lookup(positions, dtype, device=device)  # (b|1, seq, r/2, 2)
        pos = position_tensor(positions, cs.device).to(torch.float64)  # where the input is
        power = sign * (pos[..., None] - self.center) / self.scale_base  # (b|1, seq, 1)
        decay = torch.exp(power * self.log_zeta.to(cs.device))  # (b|1, seq, r / 2)
        return cs * decay.to(cs.dtype)[..., None]

    def encode_qk(self, q, k, q_positions, k_positions, *, inplace=False):
        """Rotate and scale ``q`` (by ``+``) and ``k`` (by ``-``) at their positions.

        Parameters
        ----------
        q : torch.Tensor
            Queries, ``(batch, heads, seq_q, head_dim)``.
        k : torch.Tensor
            Keys, ``(batch, kv_heads, seq_k, head_dim)``.
        q_positions : torch.Tensor or range
            Int64 ``(batch|1, seq_q)`` or a ``range``.
        k_positions : torch.Tensor or range
            Int64 ``(batch|1, seq_k)`` or a ``range``.
        inplace : bool
            Write into ``q`` and ``k`` (plain eager inference only).

        Returns
        -------
        q : torch.Tensor
            Encoded queries.
        k : torch.Tensor
            Encoded keys.
        """
        q_positions, k_positions = check_hook(
            q, k, q_positions, k_positions, head_dim=self.head_dim, stop=self.max_len
        )
        cs_q = self._scaled("q_positions", q_positions, q.dtype, +1, q.device)  # (b|1, sq, ·)
        cs_k = self._scaled("k_positions", k_positions, k.dtype, -1, k.device)  # (b|1, sk, ·)
        return rotate_qk(q, k, cs_q[:, None], cs_k[:, None], self.pairing, inplace=inplace)

    @classmethod
    def from_hf(cls, config, **overrides):
        """Not offered: Hugging Face configs describe RoPE, not xPos.

        Parameters
        ----------
        config : dict or object
            Unused.
        **overrides
            Unused.

        Raises
        ------
        NotImplementedError
            Always.
        """
        raise NotImplementedError("XPos has no Hugging Face config; build it directly")

    def rope(self, q, k, positions=None, *, out=None):
        """Not offered for xPos: plain RoPE's ``out=`` path would skip the decay.

        Parameters
        ----------
        q, k : torch.Tensor
            Queries and keys.
        positions : torch.Tensor or range, optional
            Positions.
        out : tuple of torch.Tensor, optional
            Unused.

        Raises
        ------
        NotImplementedError
            Always: call the module or ``encode_qk``.
        """
        raise NotImplementedError("XPos has no rope(out=) path; call it or use encode_qk")

    def extra_repr(self):
        return super().extra_repr() + f", scale_base={self.scale_base}, center={self.center}"
