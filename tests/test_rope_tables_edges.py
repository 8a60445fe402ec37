"""RoPE's cos/sin tables (encodings.qk.rope_tables): what the mutation run left unpinned.

* ``base`` is validated before anything else in ``apply_rope`` (a bad base is refused with
  its own message, not with the message of a later check on the positions or ``seq_len``);
* a dataclass scaling (``DynamicNTK``) is keyed by value, so it never depends on the
  bounded registry of scalings that are not dataclasses: many of those later, it still works;
* that registry evicts the least recently registered settings: settings registered again
  (a second layer built with them) move to the back and outlive newer ones;
* tables computed at call time are built next to the input, not on torch's default device
  (checked with ``with torch.device("meta")`` around a call on CPU tensors);
* the table is float32 for every input dtype but float64 (also for length-dependent scalings);
* the lazily grown table reaches exactly ``last + 1`` rows when doubling is not enough, and
  grows when the position asked for is the first row it lacks.

Values are checked against the float64 NumPy reference (``posenc.rope``) or a hand formula.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from expect import raises_exactly

import posenc
from posenc.scaling import DynamicNTK
from posenc.torch import RotaryEmbedding, apply_rope
from posenc.torch.encodings.qk import rope_dynamic as tables
from posenc.torch.encodings.qk.rope_tables import rows_to_build

_TAGS = itertools.count()


class _Opaque(posenc.scaling.Scaling):
    """A user's scaling that is not a dataclass: rates divided by ``div`` (``tag``: identity)."""

    def __init__(self, tag, div=1.0, length_dependent=False):
        self.tag, self.div, self.length_dependent = tag, div, length_dependent

    def __repr__(self):
        return f"_Opaque({self.tag!r}, {self.div!r})"

    def inv_freq(self, dim, base, seq_len=None):
        inv, _ = posenc.rope_frequencies(dim, base=base)
        return inv / self.div, 1.0


def _fresh_opaque_settings(n):
    """Register ``n`` never-seen opaque settings the way a user would: ``apply_rope`` calls."""
    x = torch.ones(1, 1, 1, 4)
    for _ in range(n):
        apply_rope(x, scaling=_Opaque(f"fresh-{next(_TAGS)}"))


def _rope_ref(x, positions, **kw):
    return posenc.rope(x.double().numpy(), np.asarray(positions), **kw)


# -- base validated first ----------------------------------------------------------------------


def test_bad_base_is_refused_before_positions_are_read():
    x = torch.ones(1, 1, 3, 8)
    with raises_exactly("base must be a positive finite number, got 0.0"):
        apply_rope(x, torch.tensor([0, 1, -1]), base=0.0)
    with raises_exactly("base must be a positive finite number, got -1e-300"):
        apply_rope(x, base=-1e-300, seq_len=0)


def test_smallest_positive_base_is_accepted():
    x = torch.ones(1, 1, 2, 2, dtype=torch.float64)
    got = apply_rope(x, base=5e-324)  # head_dim 2: the one rate is base**0 = 1
    np.testing.assert_allclose(got.numpy(), _rope_ref(x, [0, 1]), rtol=0, atol=1e-15)


# -- the opaque registry -----------------------------------------------------------------------


def test_dataclass_scaling_does_not_depend_on_the_opaque_registry():
    rope = RotaryEmbedding(8, base=123.0, scaling=DynamicNTK(3.0, 4), max_len=64)
    _fresh_opaque_settings(tables._OPAQUE_MAX + 1)  # a registry's worth of other settings
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 10, 8, dtype=torch.float64), torch.randn(1, 1, 10, 8)
    qr, kr = rope(q, k)
    kw = {"base": 123.0, "scaling": DynamicNTK(3.0, 4)}
    np.testing.assert_allclose(qr.numpy(), _rope_ref(q, range(10), **kw), rtol=0, atol=1e-12)
    np.testing.assert_allclose(kr.numpy(), _rope_ref(k, range(10), **kw), rtol=0, atol=1e-5)


def test_settings_registered_again_outlive_newer_ones():
    scaling = _Opaque(f"kept-{next(_TAGS)}", div=2.0, length_dependent=True)
    first = RotaryEmbedding(8, scaling=scaling, max_len=16)
    _fresh_opaque_settings(tables._OPAQUE_MAX - 1)  # now the oldest of a full registry
    RotaryEmbedding(8, scaling=scaling, max_len=16)  # a second layer: the most recent now
    _fresh_opaque_settings(1)  # one more evicts the oldest, which is no longer ``first``'s
    x = torch.ones(1, 1, 5, 8, dtype=torch.float64)
    qr, _ = first(x, x)
    want = _rope_ref(x, range(5), scaling=_Opaque("ref", div=2.0))
    np.testing.assert_allclose(qr.numpy(), want, rtol=0, atol=1e-12)


# -- device: next to the input -----------------------------------------------------------------


def test_apply_rope_stays_on_the_input_device_under_another_default_device():
    x = torch.arange(2 * 3 * 8, dtype=torch.float64).reshape(1, 2, 3, 8)
    for kw in ({}, {"seq_len": 7}, {"scaling": DynamicNTK(2.0, 2)}):
        with torch.device("meta"):
            got = apply_rope(x, **kw)
        assert got.device.type == "cpu"
        want = _rope_ref(x, range(3), **kw)
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


def test_dynamic_rope_stays_with_the_module_under_another_default_device():
    rope = RotaryEmbedding(8, scaling=DynamicNTK(2.0, 2), max_len=32)
    q = torch.arange(3 * 8, dtype=torch.float64).reshape(1, 1, 3, 8)
    with torch.device("meta"):
        qr, kr = rope(q, q)
        cs = rope.table(range(1, 4))
    assert qr.device.type == kr.device.type == cs.device.type == "cpu"
    want = _rope_ref(q, range(3), scaling=DynamicNTK(2.0, 2))
    np.testing.assert_allclose(qr.numpy(), want, rtol=0, atol=1e-12)


# -- table dtype -------------------------------------------------------------------------------


def test_dynamic_table_is_float32_except_for_float64():
    rope = RotaryEmbedding(8, scaling=DynamicNTK(2.0, 2), max_len=32)
    for dtype, want in [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float64, torch.float64),
    ]:
        assert rope.table(range(4), dtype).dtype == want
    # the float32 table is the float64 one rounded once
    np.testing.assert_array_equal(
        rope.table(range(4), torch.float32).numpy(),
        rope.table(range(4), torch.float64).float().numpy(),
    )


def test_apply_rope_table_is_float32_for_float32_input():
    # position 3, rate 1: the rotation of (1, 0) is (cos 3, sin 3) computed in float32
    x = torch.tensor([[[[1.0, 0.0]]]])
    got = apply_rope(x, torch.tensor([3]))
    c, s = torch.tensor(np.cos(3.0), dtype=torch.float32), torch.tensor(np.sin(3.0)).float()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[0, 0, 0], torch.stack([c, s]), rtol=0, atol=0)


# -- lazily grown table ------------------------------------------------------------------------


def test_rows_to_build_at_its_boundaries():
    assert rows_to_build(4, 3, 100) == 4  # the last row it has: nothing to build
    assert rows_to_build(4, 4, 100) == 8  # the first row it lacks: doubles
    assert rows_to_build(4, 8, 100) == 9  # doubling reaches 8 rows: exactly last + 1
    assert rows_to_build(4, 20, 100) == 21
    assert rows_to_build(4, 20, 21) == 21
    assert rows_to_build(4, 4, 6) == 6  # never more than max_len


def test_table_grows_when_asked_for_its_first_missing_row():
    rope = RotaryEmbedding(8, max_len=5000)
    have = rope.cos_sin.shape[0]
    assert have == 4096
    torch.manual_seed(1)
    q = torch.randn(1, 1, 4, 8)
    qr, _ = rope(q, q, range(have - 3, have + 1))  # last position = have
    assert rope.cos_sin.shape[0] == 5000
    want = _rope_ref(q, range(have - 3, have + 1))
    np.testing.assert_allclose(qr.numpy(), want, rtol=0, atol=2e-5)


def test_table_grows_to_exactly_the_rows_needed():
    rope = RotaryEmbedding(8, max_len=20_000)
    rope(torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), torch.tensor([[4095]]))
    assert rope.cos_sin.shape[0] == 4096  # its last row: no growth
    q = torch.ones(1, 1, 1, 8)
    qr, _ = rope(q, q, torch.tensor([[9_999]]))  # past 2 * 4096 rows: exactly 10 000
    assert rope.cos_sin.shape[0] == 10_000
    np.testing.assert_allclose(qr.numpy(), _rope_ref(q, [9_999]), rtol=0, atol=1e-5)
