"""A preallocated key/value cache for decoding, shared by the layers of one model.

Shape legend: keys ``(batch, kv_heads, max_len, key_dim)``, values
``(batch, kv_heads, max_len, head_dim)``; ``positions`` int64 and ``valid`` bool, both
``(batch, max_len)``, are shared by every layer: the positions the tokens were encoded
at, and which cached tokens are real (``False`` for padding). Positions become
``(batch, max_len, n_axes)`` coordinates for the grid encodings.

Both caches take a step's positions through one path, :meth:`KVCache._new_positions`:
given positions of any kind, else the next ones after each row's largest coordinate.
"""

from __future__ import annotations

import torch

from posenc._checks import check_int
from posenc.torch import position_values as pv
from posenc.torch.documents import after_last_document, real_positions
from posenc.torch.position_values import carry_bounds, joined, known_bounds, remember_bounds
from posenc.torch.positions import position_arg

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of every attention layer, appended to one step at a time.

    Build one with the ``new_cache`` of :class:`~posenc.torch.TransformerLM` or
    :class:`~posenc.torch.MultiHeadAttention` and pass it as ``cache=`` to their forward:
    every call appends its tokens. Keys are stored after the encoding's query/key hook
    unless it says otherwise (``caches_encoded_keys``).

    Parameters
    ----------
    layers : int
        Number of attention layers.
    batch : int
        Batch size; every call must use it.
    max_len : int
        Capacity in tokens; appending past it raises :class:`ValueError`.
    kv_heads : int
        Key/value heads per layer.
    key_dim : int
        Width of a cached key (the encoding's ``qk_dim``).
    value_dim : int
        Width of a cached value (``head_dim``).
    dtype : torch.dtype, optional
        Dtype of keys and values (default: torch's default dtype).
    device : torch.device, optional
        Where the buffers live.
    position_axes : int
        Coordinates per token (the encoding's ``position_axes``): 1 keeps ``(batch,
        max_len)`` positions (a first grid step widens them), more allocates a grid.

    Attributes
    ----------
    keys, values : list of torch.Tensor
        One buffer per layer; the first ``length`` slots along dim 2 are filled.
    positions : torch.Tensor
        Int64 ``(batch, max_len)``: the position each cached token was encoded at;
        ``(batch, max_len, n_axes)`` for grid coordinates (1-D ``p`` stored as ``(p, ..., p)``).
    next_position : torch.Tensor
        Int64 ``(batch, 1)``: where a step without positions continues (past each row's
        largest coordinate; its last document's after a packed prefill).
    valid, documents : torch.Tensor
        ``(batch, max_len)``: bool, ``True`` where a real token is cached; int64, the
        document of each slot (packed rows).
    length : int
        Number of filled slots. ``keeps_raw_keys``: whether keys are re-encoded every step.

    Examples
    --------
    >>> from posenc.torch import KVCache
    >>> cache = KVCache(layers=2, batch=1, max_len=8, kv_heads=2, key_dim=4, value_dim=4)
    >>> cache.keys[0].shape, len(cache)
    (torch.Size([1, 2, 8, 4]), 0)
    """

    keeps_raw_keys = False

    def __init__(
        self, *, layers, batch, max_len, kv_heads, key_dim, value_dim, dtype=None, device=None,
        position_axes=1,
    ):  # fmt: skip
        layers = check_int("layers", layers, minimum=1)
        self.batch = check_int("batch", batch, minimum=1)
        self.max_len = check_int("max_len", max_len, minimum=1)
        kv_heads, key_dim, value_dim = (check_int(name, x, minimum=1) for name, x in (
            ("kv_heads", kv_heads), ("key_dim", key_dim), ("value_dim", value_dim)))  # fmt: skip
        axes = check_int("position_axes", position_axes, minimum=1)
        kw = {"dtype": dtype, "device": device}
        self.keys = [torch.zeros(batch, kv_heads, max_len, key_dim, **kw) for _ in range(layers)]
        self.values = [
            torch.zeros(batch, kv_heads, max_len, value_dim, **kw) for _ in range(layers)
        ]
        grid = (axes,) if axes > 1 else ()
        self.positions = torch.zeros(batch, max_len, *grid, dtype=torch.long, device=device)
        self.next_position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.documents = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.reset()

    def reset(self) -> None:
        """Empty the cache (the buffers are kept)."""
        self.length = 0
        self.padded = False  # was a padding mask ever given?
        self.contiguous = True  # are the positions 0 .. length - 1 in every row?
        self.packed = False  # were documents given (a packed prefill)?
        self.last_document = None  # (batch, 1): the document later steps continue
        self.valid.fill_(False)
        self.documents.zero_()
        remember_bounds(self.positions.zero_(), 0, 0)  # known on the host: no read later
        remember_bounds(self.next_position.zero_(), 0, 0)
        self._pending = None

    def __len__(self) -> int:
        return self.length

    def _check_for(self, *, layers, kv_heads, key_dim, value_dim, dtype, device, **_):
        """Raise ``ValueError`` saying what differs if a model of these sizes cannot use it."""
        keys, values = self.keys[0], self.values[0]
        made = "; make the cache with the model's new_cache (after any .to())"
        if len(self.keys) < layers:
            raise ValueError(f"cache has {len(self.keys)} layers, the model has {layers}{made}")
        if keys.dtype != dtype or values.dtype != dtype:
            raise ValueError(f"cache holds {keys.dtype}, the model computes in {dtype}{made}")
        if keys.device != torch.device(device):
            raise ValueError(f"cache is on {keys.device}, the model on {device}{made}")
        got = (keys.shape[1], keys.shape[-1], values.shape[-1])
        if got != (kv_heads, key_dim, value_dim):
            raise ValueError(
                f"cache has (kv_heads, key_dim, value_dim) = {got}, the model needs "
                f"{(kv_heads, key_dim, value_dim)}{made}"
            )

    def _check_batch(self, batch):
        if batch != self.batch:
            raise ValueError(f"batch must be {self.batch} (the cache's), got {batch}")

    def _new_positions(self, positions, batch, n, default, real=None):
        """The positions of a step's ``n`` new tokens, the one path of both caches.

        ``positions``: what the caller gave (validated here, any number of axes), or
        ``None`` for ``default`` (the cache's own guess while rows share their positions)
        or, once positions or padding were given, each row's :attr:`next_position` on
        (counted over the real tokens of ``real``, the step's padding mask, if given).
        A 1-D step into a grid cache is widened to ``(p, ..., p)``; a first grid step
        widens the stored positions alike. Returns a ``range`` or an int64 tensor.
        """
        if positions is not None:
            q_pos = position_arg(positions, batch, n, axes=None)
        elif default is not None and real is None:
            q_pos = default
        else:  # continue every row after its own largest coordinate
            nxt = self.next_position  # (batch, 1); then (n,) or (batch, n) padding skipped
            ahead = torch.arange(n, device=nxt.device) if real is None else real_positions(real)
            q_pos = nxt + ahead.to(nxt.device)  # (batch, n)
            if (known := known_bounds(nxt)) is not None:  # from next_position's: no read
                remember_bounds(q_pos, known[0], known[1] + n - 1)
        return self._grid_positions(q_pos)

    def _grid_positions(self, q_pos):
        """Coordinates on a grid ``(batch|1, n, n_axes)``: the cache keeps every axis.

        A 1-D position ``p`` is the point ``(p, ..., p)`` (a text token in M-RoPE), so the
        first grid step widens the stored positions that way, and later 1-D steps into an
        n-D cache are widened alike. Returns ``q_pos`` (a tensor, widened, when the cache
        is n-D).
        """
        grid = not isinstance(q_pos, range) and q_pos.dim() == 3
        if grid and self.positions.dim() == 2:
            self._keep_positions(self.positions[..., None].repeat(1, 1, q_pos.shape[2]))
        if self.positions.dim() == 2:
            return q_pos
        axes = self.positions.shape[2]
        given = q_pos
        if isinstance(q_pos, range):
            q_pos = torch.arange(q_pos.start, q_pos.stop, device=self.positions.device)[None]
        if q_pos.dim() == 2:
            q_pos = q_pos[..., None].expand(-1, -1, axes)  # (b|1, n, n_axes)
        if q_pos.shape[2] != axes:
            raise ValueError(f"positions must have n_axes={axes} (the cache's), got {q_pos.shape}")
        return carry_bounds(given, q_pos)

    def _keep_positions(self, positions):
        """Replace the stored positions (a grid step widened them)."""
        self.positions = positions

    def _next_after(self, q_pos):
        """:attr:`next_position` once ``q_pos`` is stored (the running maximum, plus one) and
        its largest value where the host knows it (else ``None``)."""
        prev, new = known_bounds(self.next_position), known_bounds(q_pos)
        hi = None if prev is None or new is None else max(prev[1], new[1] + 1)
        return self._next_tensor(q_pos), hi

    def _next_tensor(self, q_pos):
        if isinstance(q_pos, range):  # its largest value is known: no tensor to read
            return self.next_position.clamp(min=q_pos.stop) if len(q_pos) else self.next_position
        if not q_pos.numel():
            return self.next_position
        t = q_pos.to(self.next_position.device)
        last = t.reshape(t.shape[0], -1).amax(1, keepdim=True)  # (batch|1, 1), every axis
        return torch.maximum(self.next_position, last + 1)  # (batch, 1)

    def _begin(self, positions, padding_mask, batch, n, documents=None):
        """Reserve ``n`` slots for a step; record its positions, padding and documents.

        Returns ``(start, q_positions, k_positions, key_valid, documents)``: the first new
        slot; the positions of the new and of every cached token (``range`` while
        contiguous, else int64); each cached token's validity (``None`` without padding);
        ``(q_documents, k_documents)`` after a packed prefill (later steps continue each
        row's last document), else ``None``.
        """
        self._check_batch(batch)
        if documents is not None and self.length:
            raise ValueError(f"documents must be given on a cache's first step (a packed "
                             f"prefill), got them with {self.length} tokens cached")  # fmt: skip
        start, stop = self.length, self.length + n
        if stop > self.max_len:
            raise ValueError(
                f"cache is full: max_len={self.max_len}, holds {start} tokens, got {n} more"
            )
        saved = (self.length, self.padded, self.contiguous)
        stored = known_bounds(self.positions)  # before this step writes into them
        default = range(start, stop) if self.contiguous else None
        q_pos = self._new_positions(positions, batch, n, default, padding_mask)
        if not (isinstance(q_pos, range) and q_pos.start == start):
            self.contiguous = False
        if isinstance(q_pos, range):  # its own values (a range need not start at the slot)
            self.positions[:, start:stop] = torch.arange(
                q_pos.start, q_pos.stop, device=self.positions.device
            )
        else:
            self.positions[:, start:stop] = q_pos.to(self.positions.device)
        if padding_mask is None:
            self.valid[:, start:stop] = True
        else:
            self.valid[:, start:stop] = padding_mask.to(self.valid.device)
            self.padded = True
        self.length = stop
        self._pending = (saved, *self._next_after(q_pos))  # until the step commits
        docs = None
        if documents is not None:
            documents = documents.to(self.documents.device)
            self.documents[:, start:stop] = documents
            self.packed = True
            real = self.valid[:, start:stop]  # (batch, n): padding continues no document
            nxt, self.last_document = after_last_document(q_pos, documents, real)
            self._pending = (saved, nxt, pv.max_position(nxt))  # read once, not at each step
        elif self.packed:  # the new tokens continue each row's last real document
            self.documents[:, start:stop] = self.last_document
        if self.packed:
            docs = (self.documents[:, start:stop], self.documents[:, :stop])
        hi = joined(stored, known_bounds(q_pos))
        remember_bounds(self.positions, 0, hi)  # what the host knows of every stored position
        k_pos = range(stop) if self.contiguous else remember_bounds(self.positions[:, :stop], 0, hi)
        key_valid = self.valid[:, :stop] if self.padded else None
        return start, q_pos, k_pos, key_valid, docs

    def _commit(self):
        """The step that called ``_begin`` finished: keep what it wrote."""
        if self._pending is not None:
            _, nxt, hi = self._pending
            remember_bounds(self.next_position.copy_(nxt), 0, hi)
        self._pending = None

    def _rollback(self):
        """Undo an uncommitted ``_begin`` (a step that raised must leave no trace)."""
        if getattr(self, "_pending", None) is None:
            return  # nothing begun
        length, padded, contiguous = self._pending[0]
        self.valid[:, length:] = False
        self.positions[:, length:] = 0
        self.length, self.padded, self.contiguous = length, padded, contiguous
        self.documents[:, length:] = 0
        self.packed = self.packed and length > 0
        self._pending = None

    def _store(self, layer, start, k, v, full=False):
        """Write ``k``, ``v`` ``(batch, kv_heads, n, ·)`` at ``start``; return the cached ones.

        ``full``: return the whole buffers (unfilled slots included) instead of the filled part.
        """
        keys, values = self.keys[layer], self.values[layer]
        stop = start + k.shape[2]
        self._check_kv(k, keys)
        keys[:, :, start:stop] = k
        values[:, :, start:stop] = v
        if full:
            return keys, values  # (batch, kv_heads, max_len, ·)
        return keys[:, :, :stop], values[:, :, :stop]  # (batch, kv_heads, stop, ·)

    @staticmethod
    def _check_kv(k, keys):
        if k.shape[:2] != keys.shape[:2] or k.shape[-1] != keys.shape[-1]:
            raise ValueError(
                f"keys must have shape (batch, kv_heads, n, key_dim) = "
                f"({keys.shape[0]}, {keys.shape[1]}, n, {keys.shape[-1]}), got {tuple(k.shape)}"
            )
