"""Checks shared by the hooks and the attention core: what a hook or ``attend`` may be given.

Each raises ``ValueError`` naming the argument and what it got.
"""

from __future__ import annotations

import torch

from posenc.encodings.qk.rope import PAIRINGS
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.position_values import check_values
from posenc.torch.positions import check_fits

__all__ = [
    "check_float",
    "check_qk",
    "check_hook",
    "check_score_positions",
    "check_pairing",
    "check_heads",
    "check_encoding",
]


def check_float(name, t) -> torch.Tensor:
    """Return ``t`` if it is a floating-point tensor, else raise ``ValueError`` naming it."""
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def check_qk(q, k, head_dim) -> None:
    """Refuse queries/keys a query/key hook cannot take: not floating point, not
    ``(batch, heads, seq, head_dim)``, different batches, or key heads that do not divide
    the query heads (grouped-query attention)."""
    for name, t in (("q", q), ("k", k)):
        check_float(name, t)
        if t.dim() != 4 or t.shape[-1] != head_dim:
            raise ValueError(
                f"{name} must have shape (batch, heads, seq, head_dim={head_dim}), "
                f"got {tuple(t.shape)}"
            )
    if q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        raise ValueError(
            "q and k must share batch and k's heads must divide q's, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )


def check_hook(q, k, q_positions, k_positions, *, head_dim, axes=1, stop=None):
    """A query/key hook's guard, once per call: :func:`check_qk` on ``q`` and ``k``, positions
    that fit them (a ``range`` of their length or ``(batch|1, seq)``, or with ``axes > 1``
    grid coordinates ``(batch|1, seq, axes)``), and their values ``0 <= p < stop``.

    Returns the positions to use: traced ones come back from the checking op.
    """
    check_qk(q, k, head_dim)
    check_fits("q_positions", q_positions, q, axes=axes)
    check_fits("k_positions", k_positions, k, axes=axes)
    same = q_positions is k_positions
    q_positions = check_values("q_positions", q_positions, stop)
    k_positions = q_positions if same else check_values("k_positions", k_positions, stop)
    return q_positions, k_positions


def check_score_positions(q_positions, k_positions):
    """A score hook's guard: each a ``range`` or an integer ``(batch|1, seq)`` tensor, batches
    that broadcast, values non-negative. Returns the positions to use (as
    :func:`check_hook`)."""
    rows = []
    for name, p in (("q_positions", q_positions), ("k_positions", k_positions)):
        if isinstance(p, range):
            if p.step != 1:
                raise ValueError(f"{name} must be a range of step 1, got {p}")
        elif not isinstance(p, torch.Tensor) or p.dim() != 2:
            got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"{name} must be a range or a (batch|1, seq) tensor, got {got}")
        else:
            rows.append(p.shape[0])
    if len(rows) == 2 and rows[0] != rows[1] and 1 not in rows:
        raise ValueError(
            f"k_positions must have the batch of q_positions ({rows[0]}), got {rows[1]}"
        )
    same = q_positions is k_positions
    q_positions = check_values("q_positions", q_positions)
    return q_positions, q_positions if same else check_values("k_positions", k_positions)


def check_pairing(pairing) -> str:
    """Return ``pairing`` if it is one of :data:`posenc.encodings.qk.rope.PAIRINGS`."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    return pairing


def check_heads(encoding, heads) -> None:
    """Refuse an encoding built for another number of heads (its ``heads``, if it has one)."""
    own = getattr(encoding, "heads", None)
    if isinstance(own, int) and own != heads:
        raise ValueError(
            f"encoding {type(encoding).__name__} was built for heads={own}, "
            f"attention has heads={heads}"
        )


def check_encoding(encoding, causal=True) -> PositionalEncoding:
    """Return ``encoding`` if it is a :class:`PositionalEncoding` usable with ``causal``."""
    if not isinstance(encoding, PositionalEncoding):
        raise ValueError(f"encoding must be a PositionalEncoding, got {type(encoding).__name__}")
    if not causal and encoding.requires_causal:
        raise ValueError(
            f"encoding {encoding!r} is for causal attention only (causal=False was given)"
        )
    return encoding
