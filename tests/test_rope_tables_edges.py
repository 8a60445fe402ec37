"""RoPE's cos/sin tables (encodings.qk.rope_tables): what the mutation run left unpinned.

* ``base`` is validated before anything else in ``apply_rope`` (a bad base is refused with
  its own message, not with the message of a later check on the positions or ``seq_len``);
* a scaling is carried by value: a fixed scaling of any class works (its rates are computed
  at construction); a length-dependent one must be a dataclass importable by its path, and
  is refused at construction, by name, otherwise (there is no registry to outgrow);
* tables computed at call time are built next to the input, not on torch's default device
  (checked with ``with torch.device("meta")`` around a call on CPU tensors);
* the table is float32 for every input dtype but float64 (also for length-dependent scalings);
* the lazily grown table reaches exactly ``last + 1`` rows when doubling is not enough, and
  grows when the position asked for is the first row it lacks.

Values are checked against the float64 NumPy reference (``posenc.rope``) or a hand formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from expect import raises_exactly

import posenc
from posenc.scaling import DynamicNTK
from posenc.torch import RotaryEmbedding, apply_rope
from posenc.torch.encodings.qk import rope_dynamic as tables
from posenc.torch.encodings.qk.rope_tables import rows_to_build


class _Opaque(posenc.scaling.Scaling):
    """A user's scaling that is not a dataclass: rates divided by ``div``."""

    def __init__(self, div=1.0, length_dependent=False):
        self.div, self.length_dependent = div, length_dependent

    def __repr__(self):  # says nothing of ``div``: the settings must not be read from it
        return "_Opaque()"

    def inv_freq(self, dim, base, seq_len=None):
        inv, _ = posenc.rope_frequencies(dim, base=base)
        return inv / self.div, 1.0


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


# -- scalings travel as values -----------------------------------------------------------------


def test_fixed_scalings_of_any_class_are_kept_by_value_even_with_one_repr():
    x = torch.ones(1, 1, 5, 8, dtype=torch.float64)
    for div in (2.0, 3.0):  # two modules whose scalings print alike: each its own rates
        rope = RotaryEmbedding(8, scaling=_Opaque(div), max_len=16)
        want = _rope_ref(x, range(5), scaling=_Opaque(div))
        np.testing.assert_allclose(rope(x, x)[0].numpy(), want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(apply_rope(x, scaling=_Opaque(div)).numpy(), want, atol=1e-12)


def test_length_dependent_scalings_that_cannot_travel_are_refused_by_name():
    @dataclass(frozen=True)
    class Local(posenc.scaling.Scaling):  # a dataclass defined inside a function
        factor: float = 2.0
        length_dependent = True

        def inv_freq(self, dim, base, seq_len=None):
            return posenc.rope_frequencies(dim, base=base)[0] / self.factor, 1.0

    path = f"{__name__}:test_length_dependent_scalings_that_cannot_travel_are_refused_by_name"
    for scaling, why in [
        (_Opaque(2.0, length_dependent=True), "it is not a dataclass"),
        (Local(), f"its class cannot be imported as {path}.<locals>.Local"),
    ]:
        name = type(scaling).__qualname__
        msg = (f"scaling {name} cannot travel as a value (a module rebuilds a length-dependent "
               f"scaling from its class and fields): {why}")  # fmt: skip
        with raises_exactly(
            msg + (" (define it at a module's top level)" if "import" in why else "")
        ):
            RotaryEmbedding(8, scaling=scaling, max_len=16)
        with raises_exactly(
            msg + (" (define it at a module's top level)" if "import" in why else "")
        ):
            apply_rope(torch.ones(1, 1, 2, 8), scaling=scaling)
    assert not hasattr(tables, "_OPAQUE")  # no process-local registry left


def test_a_dataclass_scaling_is_rebuilt_from_its_key_in_every_process_alike():
    rope = RotaryEmbedding(8, base=123.0, scaling=DynamicNTK(3.0, 4), max_len=64)
    assert tables._settings(rope._key) == (8, 123.0, DynamicNTK(3.0, 4), 8)
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 10, 8, dtype=torch.float64), torch.randn(1, 1, 10, 8)
    qr, kr = rope(q, k)
    kw = {"base": 123.0, "scaling": DynamicNTK(3.0, 4)}
    np.testing.assert_allclose(qr.numpy(), _rope_ref(q, range(10), **kw), rtol=0, atol=1e-12)
    np.testing.assert_allclose(kr.numpy(), _rope_ref(k, range(10), **kw), rtol=0, atol=1e-5)


class _Holder:
    @dataclass(frozen=True)
    class Halved(posenc.scaling.Scaling):  # nested: its path has a dotted qualname
        below: int = 4
        length_dependent = True

        def inv_freq(self, dim, base, seq_len=None):
            inv, _ = posenc.rope_frequencies(dim, base=base)
            return (inv / 2 if (seq_len or 0) > self.below else inv), 1.0


@dataclass(frozen=True)
class _SetField(posenc.scaling.Scaling):
    skip: frozenset = frozenset({1})
    length_dependent = True

    def inv_freq(self, dim, base, seq_len=None):
        return posenc.rope_frequencies(dim, base=base)[0], 1.0


def test_a_nested_dataclass_scaling_travels_by_its_dotted_path():
    key = tables.settings_key(8, 100.0, _Holder.Halved(3), None)
    assert f"{__name__}:_Holder.Halved" in key
    assert tables._settings(key) == (8, 100.0, _Holder.Halved(3), None)
    x = torch.ones(1, 1, 5, 8, dtype=torch.float64)  # length 5 > 3: rates halved
    rope = RotaryEmbedding(8, base=100.0, scaling=_Holder.Halved(3), max_len=16)
    want = _rope_ref(x, range(5), base=100.0, scaling=posenc.scaling.Linear(2.0))
    np.testing.assert_allclose(rope(x, x)[0].numpy(), want, rtol=0, atol=1e-12)


def test_settings_that_are_not_json_or_not_valid_are_refused_with_their_reason():
    msg = ("scaling _SetField cannot travel as a value (a module rebuilds a length-dependent "
           "scaling from its class and fields): its fields are not JSON values")  # fmt: skip
    with raises_exactly(msg):
        tables.settings_key(8, 10_000.0, _SetField(), None)
    # validated by rope_frequencies first, with its own messages
    with raises_exactly("base must be a positive finite number, got 0.0"):
        tables.settings_key(8, 0.0, DynamicNTK(2.0, 4), None)
    with raises_exactly("scaling must be a posenc.scaling object, got 'yarn'"):
        tables.settings_key(8, 10_000.0, "yarn", None)
    with raises_exactly("rotary_dim must be <= head_dim=8, got 10"):
        tables.settings_key(8, 10_000.0, DynamicNTK(2.0, 4), 10)


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


def test_a_users_fixed_scaling_rotates_like_the_builtin_with_the_same_rates():
    # _Opaque(2) halves every rate, as Linear(2) does; it takes the other branch of apply_rope
    # (its rates computed once, not a table keyed by settings) and must give the same bits:
    # a float32 table for float32 input, and only the first rotary_dim dims rotated.
    x = torch.randn(2, 3, 40, 8, generator=torch.Generator().manual_seed(0))
    for rotary_dim in (None, 4):
        kw = dict(base=100.0, rotary_dim=rotary_dim)
        got = apply_rope(x, scaling=_Opaque(2.0), **kw)
        torch.testing.assert_close(
            got, apply_rope(x, scaling=posenc.scaling.Linear(2.0), **kw), rtol=0, atol=0
        )
        want = _rope_ref(x, range(40), scaling=_Opaque(2.0), **kw)
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=1e-5)


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


def test_table_growth_compares_positions_with_rows_not_with_pairs(monkeypatch):
    # a table of fewer first rows (4) than pairs (5): position 4 still needs a row
    from posenc.torch.encodings.qk import rope_tables

    monkeypatch.setattr(rope_tables, "_FIRST_ROWS", 4)
    rope = RotaryEmbedding(10, max_len=5)
    assert rope.cos_sin.shape[:2] == (4, 5)
    q = torch.zeros(1, 1, 1, 10)
    q[..., 0], q[..., 5] = 1.0, 2.0  # pair 0 (half pairing: dims 0 and r/2)
    qr, _ = rope(q, q, torch.tensor([[4]]))
    assert rope.cos_sin.shape[0] == 5
    c, s = math.cos(4.0), math.sin(4.0)  # pair 0 turns at rate 1
    torch.testing.assert_close(qr[0, 0, 0, [0, 5]], torch.tensor([c - 2 * s, s + 2 * c]),
                               rtol=0, atol=1e-6)  # fmt: skip


def test_table_grows_to_exactly_the_rows_needed():
    rope = RotaryEmbedding(8, max_len=20_000)
    rope(torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), torch.tensor([[4095]]))
    assert rope.cos_sin.shape[0] == 4096  # its last row: no growth
    q = torch.ones(1, 1, 1, 8)
    qr, _ = rope(q, q, torch.tensor([[9_999]]))  # past 2 * 4096 rows: exactly 10 000
    assert rope.cos_sin.shape[0] == 10_000
    np.testing.assert_allclose(qr.numpy(), _rope_ref(q, [9_999]), rtol=0, atol=1e-5)


def test_table_reads_the_length_from_length_from_not_from_its_positions():
    # dynamic NTK past its original length: rows 0..2 of the table for a 100-token step use
    # the rates of length 100, not of length 3 (the positions asked for)
    rope = RotaryEmbedding(8, base=100.0, scaling=DynamicNTK(2.0, 16), max_len=128)
    got = rope.table(range(3), torch.float64, length_from=range(100))[0]  # (3, 4, 2)
    inv, scale = posenc.rope_frequencies(8, base=100.0, scaling=DynamicNTK(2.0, 16), seq_len=100)
    angles = np.arange(3)[:, None] * inv  # (3, 4)
    want = scale * np.stack([np.cos(angles), np.sin(angles)], -1)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-15)
    short = rope.table(range(3), torch.float64)[0]  # length 3 < 16: the plain rates
    assert not np.allclose(short.numpy(), want)


def test_encode_qk_reads_the_length_from_the_keys_when_they_reach_further():
    # queries at 0, 1 and keys at 0..9: the length is 10 (past the original 4) for both
    rope = RotaryEmbedding(8, scaling=DynamicNTK(2.0, 4), max_len=32)
    torch.manual_seed(2)
    q, k = (
        torch.randn(1, 1, 2, 8, dtype=torch.float64),
        torch.randn(1, 1, 10, 8, dtype=torch.float64),
    )
    for q_pos, k_pos in [(range(2), range(10)), (torch.tensor([[0, 1]]), torch.arange(10)[None])]:
        qr, kr = rope.encode_qk(q, k, q_pos, k_pos)
        ref = {"scaling": DynamicNTK(2.0, 4), "seq_len": 10}
        np.testing.assert_allclose(qr.numpy(), _rope_ref(q, range(2), **ref), rtol=0, atol=1e-12)
        np.testing.assert_allclose(kr.numpy(), _rope_ref(k, range(10), **ref), rtol=0, atol=1e-12)
