"""Convert q/k projection weights between the two RoPE pairings.

A head's coordinates paired ``(2j, 2j + 1)`` ("interleaved") and ``(j, j + r/2)``
("half") differ by one fixed permutation. Permuting the rows of the query and key
projections by it leaves every score ``q . k`` unchanged, so a checkpoint trained with one
pairing runs with the other.
"""

from __future__ import annotations

import torch

__all__ = ["interleaved_to_half", "half_to_interleaved"]


def _pairing_permutation(head_dim, rotary_dim):
    r = head_dim if rotary_dim is None else rotary_dim
    perm = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, head_dim)])
    return perm  # new dim i takes old dim perm[i]


def _permute_rows(weight, head_dim, perm):
    """Reorder the rows of every head of a ``(heads * head_dim, dim)`` weight by ``perm``."""
    if weight.shape[0] % head_dim:
        raise ValueError(
            f"weight rows must be a multiple of head_dim={head_dim}, got {weight.shape[0]}"
        )
    w = weight.reshape(-1, head_dim, *weight.shape[1:])  # (heads, head_dim, ...)
    return w[:, perm].reshape(weight.shape)


def interleaved_to_half(weight, *, head_dim, rotary_dim=None):
    """Reorder q/k projection rows so an interleaved-RoPE checkpoint runs with ``pairing="half"``.

    Parameters
    ----------
    weight : torch.Tensor
        A q or k projection weight, ``(heads * head_dim, dim)`` (``nn.Linear`` layout).
    head_dim : int
        Width of one head.
    rotary_dim : int, optional
        Rotated width (default ``head_dim``); the tail is left in place.

    Returns
    -------
    torch.Tensor
        The reordered weight. Scores ``q . k`` are unchanged, because q and k are
        permuted alike.
    """
    return _permute_rows(weight, head_dim, _pairing_permutation(head_dim, rotary_dim))


def half_to_interleaved(weight, *, head_dim, rotary_dim=None):
    """Inverse of :func:`interleaved_to_half`.

    Parameters
    ----------
    weight : torch.Tensor
        A q or k projection weight, ``(heads * head_dim, dim)``.
    head_dim : int
        Width of one head.
    rotary_dim : int, optional
        Rotated width (default ``head_dim``).

    Returns
    -------
    torch.Tensor
        The reordered weight.
    """
    perm = torch.argsort(_pairing_permutation(head_dim, rotary_dim))
    return _permute_rows(weight, head_dim, perm)
