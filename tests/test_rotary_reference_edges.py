"""NumPy RoPE / xPos reference (posenc.rotary) at the edges the mutation run left unpinned.

* the exact refusals naming ``base``, ``scaling``, ``rotary_dim`` and ``scale_base``;
* ``rope_frequencies`` returns float64 even when a user's ``Scaling`` subclass does not;
* 1-D float positions such as ``2.0`` are accepted by ``rope`` (and negatives named);
* ``xpos_decay`` against Sun et al.'s formula written out in plain Python: the default
  ``scale_base=512``, a non-zero ``center`` (which cancels in every q.k score), an int
  length, 1-D and 2-D (per-row) positions;
* ``xpos`` passes ``base`` and ``rotary_dim`` on to RoPE and leaves the tail untouched.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from expect import raises_exactly

import posenc
from posenc.scaling import DynamicNTK, Scaling


def _zeta(r):
    """Sun et al.'s zeta_j = (2j / r + 0.4) / 1.4 for pair j < r / 2, in plain Python."""
    return [(2 * j / r + 0.4) / 1.4 for j in range(r // 2)]


def _decay(r, positions, scale_base, center=0.0, key=False):
    """Plain-Python xPos scale zeta_j ** (+-(p - center) / scale_base), nested like positions."""
    if isinstance(positions, (list, tuple)):
        return [_decay(r, p, scale_base, center, key) for p in positions]
    power = (positions - center) / scale_base
    return [z ** (-power if key else power) for z in _zeta(r)]


def _rope_half(x, positions, base, r):
    """Plain float64 RoPE, half pairing, of ``x`` (seq, d) rotating the first ``r`` dims."""
    out = np.array(x, dtype=np.float64)
    h = r // 2
    for s, p in enumerate(positions):
        for j in range(h):
            ang = p * base ** (-2 * j / r)
            a, b = x[s][j], x[s][j + h]
            out[s, j] = a * math.cos(ang) - b * math.sin(ang)
            out[s, j + h] = b * math.cos(ang) + a * math.sin(ang)
    return out


# -- refusals ----------------------------------------------------------------------------------


def test_rope_frequencies_names_base():
    with raises_exactly("base must be a positive finite number, got 0.0"):
        posenc.rope_frequencies(8, base=0)


def test_rope_frequencies_names_a_bad_scaling():
    with raises_exactly("scaling must be a posenc.scaling object, got 'linear'"):
        posenc.rope_frequencies(8, scaling="linear")


def test_xpos_decay_names_rotary_dim():
    with raises_exactly("rotary_dim must be even, got 3"):
        posenc.xpos_decay(3, 4)
    with raises_exactly("rotary_dim must be a positive even integer, got 0"):
        posenc.xpos_decay(0, 4)


def test_xpos_decay_names_scale_base():
    with raises_exactly("scale_base must be a positive finite number, got 0.0"):
        posenc.xpos_decay(4, 4, scale_base=0)


def test_xpos_decay_refuses_bad_1d_positions():
    with raises_exactly("positions must be non-negative, got -1"):
        posenc.xpos_decay(4, [0, -1])
    with raises_exactly("positions must hold integers, got 0.5"):
        posenc.xpos_decay(4, [0.5])


# -- rope_frequencies / rope --------------------------------------------------------------------


class _Float32Halving(Scaling):
    """A user's scaling that returns float32 rates: half the default ones."""

    def inv_freq(self, dim, base, seq_len=None):
        return (base ** (-np.arange(0, dim, 2) / dim) / 2).astype(np.float32), 1


def test_rope_frequencies_is_float64_for_a_user_scaling():
    inv, scale = posenc.rope_frequencies(4, base=100.0, scaling=_Float32Halving())
    assert inv.dtype == np.float64 and type(scale) is float and scale == 1.0
    np.testing.assert_array_equal(inv, np.float32([0.5, 0.05]).astype(np.float64))


def test_rope_accepts_integral_float_positions_in_1d():
    x = np.random.default_rng(0).standard_normal((2, 4))
    np.testing.assert_array_equal(posenc.rope(x, [0.0, 2.0]), posenc.rope(x, [0, 2]))
    with raises_exactly("positions must be non-negative, got -1"):
        posenc.rope(x, [-1, 0])


def test_rope_computes_in_float64_whatever_the_input_dtype():
    # float32 and int inputs are converted first: the result is the float64 rotation, not one
    # rounded to (or truncated in) the input's dtype. Checked against the plain-Python loop.
    x32 = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    got = posenc.rope(x32, [0, 1, 5], base=100.0)
    assert got.dtype == np.float64
    want = _rope_half(x32.astype(np.float64), [0, 1, 5], 100.0, 4)  # exact widening
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    ints = posenc.rope(np.array([[1, 0]]), [1])  # (seq=1, head_dim=2): (cos 1, sin 1)
    np.testing.assert_array_equal(ints, [[math.cos(1.0), math.sin(1.0)]])


def test_rope_names_x_of_one_axis():
    with raises_exactly("x must have shape (..., seq, head_dim), got (4,)"):
        posenc.rope(np.ones(4), [0])


def test_rope_of_an_empty_sequence_is_empty_also_for_a_length_dependent_scaling():
    # no positions: no maximum to read; the length is taken as 0 (seq_len not given)
    got = posenc.rope(np.zeros((2, 0, 4)), np.zeros((2, 0), int), scaling=DynamicNTK(2.0, 4))
    assert got.shape == (2, 0, 4) and got.dtype == np.float64


# -- xpos_decay against Sun et al. -------------------------------------------------------------


def test_xpos_decay_default_scale_base_is_512():
    got = posenc.xpos_decay(4, [0, 700])
    np.testing.assert_allclose(got, _decay(4, [0, 700], 512.0), rtol=1e-15)
    np.testing.assert_array_equal(got, posenc.xpos_decay(4, [0, 700], scale_base=512.0))
    assert not np.allclose(got, _decay(4, [0, 700], 513.0), rtol=1e-6)


def test_xpos_decay_int_length_means_0_to_n_minus_1():
    got = posenc.xpos_decay(6, 3, scale_base=2.0)
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got, _decay(6, [0, 1, 2], 2.0), rtol=1e-15)


@pytest.mark.parametrize("key", [False, True])
def test_xpos_decay_with_a_center(key):
    pos = [0, 3, 10]
    got = posenc.xpos_decay(8, pos, scale_base=4.0, center=6, key=key)
    np.testing.assert_allclose(got, _decay(8, pos, 4.0, center=6.0, key=key), rtol=1e-15)
    # position 6 is the centre: no scaling there
    assert (posenc.xpos_decay(8, [6], scale_base=4.0, center=6, key=key) == 1.0).all()


def test_xpos_decay_product_depends_on_m_minus_n_whatever_the_center():
    # q scale at m times k scale at n is zeta ** ((m - n) / s) for every centre
    m, n, s = np.array([9, 5]), np.array([2, 0]), 3.0
    want = np.array(_zeta(8))[None, :] ** ((m - n)[:, None] / s)
    for center in (0, 4, 11.5):
        q = posenc.xpos_decay(8, m, scale_base=s, center=center)
        k = posenc.xpos_decay(8, n, scale_base=s, center=center, key=True)
        np.testing.assert_allclose(q * k, want, rtol=1e-13)


def test_xpos_decay_2d_positions_per_row():
    pos = [[0, 5, 9], [3, 1, 12]]
    got = posenc.xpos_decay(4, np.array(pos), scale_base=8.0, center=2)
    assert got.shape == (2, 3, 2)
    np.testing.assert_allclose(got, _decay(4, pos, 8.0, center=2.0), rtol=1e-15)


# -- xpos: rotation then decay -----------------------------------------------------------------


@pytest.mark.parametrize("key", [False, True])
def test_xpos_partial_rotary_with_a_non_default_base(key):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8))
    pos, r, base, s = [1, 4, 7], 4, 50.0, 5.0
    got = posenc.xpos(x, pos, key=key, scale_base=s, base=base, rotary_dim=r)
    want = _rope_half(x.tolist(), pos, base, r)
    dec = np.array(_decay(r, pos, s, key=key))  # (seq, r // 2), half pairing: (j, j + r / 2)
    want[:, : r // 2] *= dec
    want[:, r // 2 : r] *= dec
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(got[:, r:], x[:, r:])  # the tail passes through


def test_xpos_2d_positions_match_row_by_row():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4))
    pos = np.array([[0, 2, 9], [5, 1, 3]])
    got = posenc.xpos(x, pos, scale_base=6.0, base=30.0)
    for i in range(2):
        want = _rope_half(x[i].tolist(), pos[i].tolist(), 30.0, 4)
        dec = np.array(_decay(4, pos[i].tolist(), 6.0))
        want[:, :2] *= dec
        want[:, 2:] *= dec
        np.testing.assert_allclose(got[i], want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("positions", [[[-1, 2]], [[0.5, 2.0]], [[0.0, 1.0]]])
def test_xpos_decay_refuses_per_row_positions_that_rope_refuses(positions):
    # rows of positions are checked as rope checks them (ints >= 0), not read as numbers
    with raises_exactly("positions must hold non-negative integers"):
        posenc.xpos_decay(4, positions)
    with raises_exactly("positions must hold non-negative integers"):
        posenc.rope(np.ones((1, 2, 4)), positions)
