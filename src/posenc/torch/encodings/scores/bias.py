"""Encodings that act on the scores, with a fixed shape: ALiBi and T5 relative buckets.

KERPLE and FIRE, which learn the shape of the bias, are in :mod:`.learned_bias`.

Each returns a bias ``(batch|1, heads, seq_q, seq_k)`` from ``score_bias`` (for SDPA's
float mask) and, for FlexAttention, a ``score_mod`` that computes the same bias inside the
kernel. Biases depend on ``i - j`` (query minus key position), never on absolute slots, so
a KV cache and left padding change nothing. They are computed in the encoding's
``work_dtype``: float32 whatever the module is cast to (float64 after ``.double()``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import posenc
from posenc._checks import check_int
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.encodings.checks import check_score_positions
from posenc.torch.positions import (
    position_arg,
    position_at,
    relative_positions,
)

__all__ = ["ALiBi", "T5RelativeBias"]


class _ScoreBias(PositionalEncoding):
    """Plumbing shared by the score encodings: ``forward`` returns the bias."""

    heads: int
    reuses_masks = True  # the bias depends on the tables, weights and settings alone

    def forward(self, q_positions, k_positions=None):
        """The bias for these positions (``k_positions`` defaults to ``q_positions``).

        Parameters
        ----------
        q_positions : torch.Tensor or range
            ``(seq_q,)`` / ``(batch, seq_q)`` ints or a ``range``.
        k_positions : torch.Tensor or range, optional
            ``(seq_k,)`` / ``(batch, seq_k)`` ints or a ``range``.

        Returns
        -------
        torch.Tensor
            ``(batch|1, heads, seq_q, seq_k)`` in ``work_dtype`` (float32, or float64 after
            ``.double()``).
        """
        k_positions = q_positions if k_positions is None else k_positions
        qp = _as_hook_positions(q_positions, "q_positions")
        kp = _as_hook_positions(k_positions, "k_positions")
        return self.score_bias(qp, kp)  # which checks that the batches broadcast

    def extra_repr(self):
        return f"heads={self.heads}"


class ALiBi(_ScoreBias):
    r"""ALiBi (Press et al., 2022): a per-head linear penalty :math:`-m_h (i - j)` on the scores.

    The slopes :math:`m_h` are :func:`posenc.alibi_slopes` (derived state: float64,
    never in ``state_dict``, and never cast down by ``.to(torch.bfloat16)``); the bias is
    computed in float32 (float64 after ``.double()``). It is the
    *relative* form, so it is the same at every position of a KV cache and stays exact
    near the diagonal in low precision, unlike the ``m_h j`` shortcut.

    Parameters
    ----------
    heads : int
        Number of query heads.
    symmetric : bool
        Penalise :math:`|i - j|` (bidirectional attention) instead of :math:`i - j`; the
        default form is for causal attention only (``causal=False`` raises).

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import ALiBi
    >>> ALiBi(2)(range(3))[0, 0]  # slope 1/16 for the first of 2 heads
    tensor([[-0.0000,  0.0625,  0.1250],
            [-0.0625, -0.0000,  0.0625],
            [-0.1250, -0.0625, -0.0000]])
    """

    _DERIVED = ("slopes",)

    def __init__(self, heads, *, symmetric=False):
        super().__init__()
        self.heads = check_int("heads", heads, minimum=1)
        self.symmetric = bool(symmetric)
        self._register_derived()

    @property
    def requires_causal(self) -> bool:
        """``-m (i - j)`` favours future keys: bidirectional attention needs ``symmetric``."""
        return not self.symmetric

    def _derived_tensors(self):
        return {"slopes": torch.from_numpy(posenc.alibi_slopes(self.heads))}  # float64 (h,)

    def score_bias(self, q_positions, k_positions, *, out=None):
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        self._materialize(getattr(q_positions, "device", None))  # still meta after a load?
        work = self.work_dtype
        rel = relative_positions(q_positions, k_positions, self.slopes.device).to(work)
        dist = rel.abs() if self.symmetric else rel  # (b|1, sq, sk)
        neg = -self.slopes.to(work)[:, None, None]  # (heads, 1, 1)
        fits = out is not None and out.shape == (dist.shape[0], self.heads, *dist.shape[1:])
        if fits and out.is_floating_point():  # an int buffer would truncate: not used
            return _product_into(out, dist[:, None], neg)  # (b|1, heads, sq, sk)
        return dist[:, None] * neg  # (b|1, heads, sq, sk)

    def score_mod(self, q_positions, k_positions):
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        self._materialize(getattr(q_positions, "device", None))
        device = self.slopes.device
        slopes = _kept(self, "slopes", (self.slopes,), lambda s: s.float())  # (heads,)
        qpos, kpos = position_at(q_positions, device), position_at(k_positions, device)
        symmetric = self.symmetric

        def alibi(score, b, h, q_idx, kv_idx):
            rel = (qpos(b, q_idx) - kpos(b, kv_idx)).float()
            return score - slopes[h] * (rel.abs() if symmetric else rel)

        return alibi

    def extra_repr(self):
        return f"heads={self.heads}, symmetric={self.symmetric}"


class T5RelativeBias(_ScoreBias):
    """T5's learned bias per bucket of relative position (Raffel et al., 2020).

    Buckets are those of :func:`posenc.t5_buckets` (exact below ``num_buckets // 2`` per
    direction, logarithmic up to ``max_distance``, shared beyond), read from a lookup
    table over ``key - query`` in ``[-max_distance, max_distance]`` (derived state; larger
    distances share the last bucket, so clamping is exact). One learned table ``weight``
    ``(num_buckets, heads)``, initialised from ``N(0, 0.02^2)``; inside a
    :class:`~posenc.torch.TransformerLM` it is shared by all layers, as in T5. T5 itself
    scales scores by 1, not ``1 / sqrt(head_dim)``; this encoding leaves the softmax scale
    at the attention's default.

    Parameters
    ----------
    heads : int
        Number of query heads.
    num_buckets : int
        Number of buckets (even when bidirectional).
    max_distance : int
        Distances beyond it share the last bucket; ``> num_buckets // 2``.
    bidirectional : bool
        Separate buckets for keys after the query (encoders); default causal.

    Examples
    --------
    >>> from posenc.torch import T5RelativeBias
    >>> t5 = T5RelativeBias(4, num_buckets=8, max_distance=16)
    >>> t5.bucket.tolist()[:5], t5(range(6)).shape  # key - query = -16 .. -12
    ([7, 7, 7, 7, 7], torch.Size([1, 4, 6, 6]))
    """

    _DERIVED = ("bucket",)

    def __init__(self, heads, *, num_buckets=32, max_distance=128, bidirectional=False):
        super().__init__()
        self.heads = check_int("heads", heads, minimum=1)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bool(bidirectional)
        posenc.t5_buckets(0, **self._bucket_args())  # validates num_buckets, max_distance
        self.weight = nn.Parameter(torch.empty(num_buckets, self.heads))
        self.reset_parameters()
        self._register_derived()

    def reset_parameters(self):
        """Draw the table from ``N(0, 0.02^2)``."""
        nn.init.normal_(self.weight, std=0.02)

    def _bucket_args(self):
        return {
            "bidirectional": self.bidirectional,
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
        }

    def _derived_tensors(self):
        rel = np.arange(-self.max_distance, self.max_distance + 1)  # key - query
        return {"bucket": torch.from_numpy(posenc.t5_buckets(rel, **self._bucket_args()))}

    def _buckets_of(self, key_minus_query):
        md = self.max_distance
        return self.bucket[key_minus_query.clamp(-md, md) + md]

    def score_bias(self, q_positions, k_positions, *, out=None):
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        self._materialize(self.weight.device)  # with the weight it indexes (still meta?)
        rel = -relative_positions(q_positions, k_positions, self.bucket.device)  # key - query
        bias = self.weight.to(self.work_dtype)[self._buckets_of(rel)]  # (b|1, sq, sk, heads)
        return bias.permute(0, 3, 1, 2)  # (b|1, heads, sq, sk)

    def score_mod(self, q_positions, k_positions):
        q_positions, k_positions = check_score_positions(q_positions, k_positions)
        self._materialize(self.weight.device)
        table = self.weight.float()  # (buckets, heads); per call: `.data` writes bump no version
        bucket, md = self.bucket, self.max_distance
        qpos, kpos = (
            position_at(q_positions, bucket.device),
            position_at(k_positions, bucket.device),
        )

        def t5(score, b, h, q_idx, kv_idx):
            rel = (kpos(b, kv_idx) - qpos(b, q_idx)).clamp(-md, md)  # key - query
            return score + table[bucket[rel + md], h]

        return t5

    def extra_repr(self):
        return (
            f"heads={self.heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


def _product_into(out, a, b, block=1 << 22):
    """``out[:] = a * b`` computed in ``a``'s dtype and rounded once into ``out``.

    ``b`` is per head ``(heads, 1, 1)``. A low-precision ``out`` is filled a few heads at a
    time through a small buffer (mixed-dtype kernels are several times slower).
    """
    if out.dtype == a.dtype:
        return torch.mul(a, b, out=out)
    per_head = out[:, :1].numel()
    g = max(1, block // per_head)  # heads per block
    tmp = torch.empty(out.shape[0], min(g, out.shape[1]), *out.shape[2:], dtype=a.dtype,
                      device=out.device)  # fmt: skip
    for j in range(0, out.shape[1], g):
        n = min(g, out.shape[1] - j)
        torch.mul(a, b[j : j + n], out=tmp[:, :n])
        out[:, j : j + n].copy_(tmp[:, :n])  # round once
    return out


def _kept(module, name, tensors, build, *, key=(), graph=True):
    """``build(*tensors)``, kept on ``module`` under ``name`` for the FlexAttention calls that
    follow, so a ``score_mod`` copies nothing per call: rebuilt when ``key`` changes or one
    of ``tensors`` is replaced, moved, cast or written in place (its version counter). A
    result that may be part of an autograd graph (``graph``: grad enabled and a tensor
    requiring it) is built anew, not kept; so is one built while ``torch.compile`` traces."""
    if torch.compiler.is_compiling():
        return build(*tensors)
    if graph and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return build(*tensors)
    try:
        key = (key, *((t._version, t.data_ptr(), t.device, t.dtype, t.shape) for t in tensors))
    except RuntimeError:  # an inference tensor has no version counter: nothing to key on
        return build(*tensors)
    kept = module.__dict__.setdefault("_flex_kept", {})
    held = kept.get(name)  # (the tensors, aliases of their storage, their key, the result)
    same = held is not None and all(a is b for a, b in zip(held[0], tensors, strict=True))
    if same and held[2] == key:
        return held[3]
    with torch.no_grad():
        value = build(*tensors)
    # the aliases keep the storage alive: no other tensor takes its address meanwhile
    kept[name] = (tensors, tuple(t.detach() for t in tensors), key, value)
    return value


def _as_hook_positions(positions, name):
    """A ``range`` as is; ints ``(seq,)`` or ``(batch, seq)`` validated, as int64 ``(b|1, seq)``."""
    if isinstance(positions, range):
        return position_arg(positions, 1, len(positions))
    positions = torch.as_tensor(positions)
    if positions.dim() not in (1, 2):
        raise ValueError(f"{name} must be (seq,) or (batch, seq), got {tuple(positions.shape)}")
    rows = 1 if positions.dim() == 1 else positions.shape[0]
    try:
        return position_arg(positions, rows, positions.shape[-1])
    except ValueError as err:
        raise ValueError(str(err).replace("positions", name, 1)) from None
