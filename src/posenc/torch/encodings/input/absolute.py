"""Absolute encodings added to the input ``(batch, seq, dim)``: sinusoidal and learned."""

from __future__ import annotations

import torch
from torch import nn

import posenc
from posenc._checks import check_dim, check_int, check_positive
from posenc.torch.encodings.base import PositionalEncoding
from posenc.torch.encodings.checks import check_float
from posenc.torch.position_values import check_values
from posenc.torch.positions import position_arg

__all__ = ["SinusoidalEncoding", "LearnedEncoding"]


class _TableEncoding(PositionalEncoding):
    """Shared plumbing: look rows of a ``(max_len, dim)`` table up and add them."""

    dim: int
    max_len: int

    def _table(self) -> torch.Tensor:  # (max_len, dim)
        raise NotImplementedError

    def encode_input(self, x: torch.Tensor, positions) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape (batch, seq, dim={self.dim}), got {tuple(x.shape)}"
            )
        check_float("x", x)  # an integer x would truncate the encoding
        positions = position_arg(positions, x.shape[0], x.shape[1])
        hint = "; build the encoding with a larger max_len"
        positions = check_values("positions", positions, self.max_len, why=hint)
        self._materialize(x.device)  # meta tables after load_state_dict(assign=True)
        table = self._table()  # (max_len, dim)
        if isinstance(positions, range):  # contiguous: a slice, no gather
            pe = table[positions.start : positions.stop][None]  # (1, seq, dim)
        else:
            pe = table[positions.to(table.device)]  # (batch or 1, seq, dim)
        return x + pe.to(x.dtype)  # (batch, seq, dim), rounded once to x's dtype

    def forward(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        """Add the encoding to ``x`` of shape ``(batch, seq, dim)``.

        Parameters
        ----------
        x : torch.Tensor
            Embeddings ``(batch, seq, dim)``.
        positions : torch.Tensor or range, optional
            Int ``(seq,)`` or ``(batch, seq)``, default ``0 .. seq - 1``; pass offsets for
            continued sequences or per-row positions for padding.

        Returns
        -------
        torch.Tensor
            ``x`` plus the rows of its positions, same shape and dtype.
        """
        return self.encode_input(x, positions)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}"


class SinusoidalEncoding(_TableEncoding):
    r"""Adds the fixed sinusoidal table of Vaswani et al. (2017) to token embeddings.

    The table is computed by :func:`posenc.sinusoidal` in float64 and kept as a
    non-persistent float64 buffer: never saved to or loaded from ``state_dict``, and exact
    after ``.to()``, ``.half()``, device moves, ``to_empty()`` and meta-device loading with
    ``load_state_dict(assign=True)``. It stays float64 whatever the module's dtype; at run time the
    rows are rounded once to the input's dtype.

    Parameters
    ----------
    dim : int
        Embedding width; a positive even integer.
    max_len : int
        Number of positions in the table. Positions ``>= max_len`` raise
        :class:`ValueError` (the table does not grow silently).
    base : float
        The constant that sets the slowest rate.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import SinusoidalEncoding
    >>> pe = SinusoidalEncoding(4, max_len=8)
    >>> pe(torch.zeros(1, 2, 4))[0, 1]
    tensor([0.8415, 0.5403, 0.0100, 0.9999])
    >>> pe(torch.zeros(1, 2, 4), positions=torch.tensor([6, 7])).shape
    torch.Size([1, 2, 4])
    """

    def __init__(self, dim: int, *, max_len: int = 4096, base: float = 10_000.0):
        super().__init__()
        self.dim = check_dim("dim", dim)
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.base = check_positive("base", base)
        self._register_derived()

    _DERIVED = ("table",)

    def _derived_tensors(self):
        table = posenc.sinusoidal(self.max_len, self.dim, base=self.base)  # float64
        return {"table": torch.from_numpy(table)}  # (max_len, dim)

    def _table(self) -> torch.Tensor:
        return self.table


class LearnedEncoding(_TableEncoding):
    """A trained table of position vectors added to the input (GPT-2, BERT).

    The table has shape ``(max_len, dim)``; rows are initialised from
    ``N(0, 0.02^2)`` as in GPT-2. Positions past
    ``max_len - 1`` have no row and raise :class:`ValueError`.

    Parameters
    ----------
    max_len : int
        Number of trainable positions.
    dim : int
        Embedding width.

    Examples
    --------
    >>> import torch
    >>> from posenc.torch import LearnedEncoding
    >>> _ = torch.manual_seed(0)
    >>> pe = LearnedEncoding(16, 8)
    >>> pe.weight.shape, pe.places
    (torch.Size([16, 8]), ('input',))
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.dim = check_int("dim", dim, minimum=1)
        self.weight = nn.Parameter(torch.empty(self.max_len, self.dim))
        nn.init.normal_(self.weight, std=0.02)

    def _table(self) -> torch.Tensor:
        return self.weight
