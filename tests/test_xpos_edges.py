"""torch xPos (posenc.torch.xpos) at its edges: what the mutation run left unpinned.

* the defaults (``max_len=4096``) and the settings passed on to RoPE (``base``,
  ``rotary_dim``), checked in float64 against a plain NumPy formula, with the scale
  exponent ``(p - center) / scale_base`` taken in float64;
* float32 inputs get a float32 table: the float64 scale is rounded once into it;
* the float16 window's boundaries for ``range`` positions, on both sides of the centre and
  for a window whose two ends are equally far (the lower one is named), with the exact
  message, and the ``max_len`` refusal at its boundary;
* ``inplace=True`` writes into ``q`` and ``k``;
* the tables stay with the module under another default device and are built where the
  inputs are for a module made on the meta device;
* the exact ``NotImplementedError`` messages of ``from_hf`` and ``rope``, and the repr.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from expect import raises_exactly

from posenc.torch import XPos


def _zeta(r):
    """xPos's per-pair decay base (Sun et al.): (2j + 0.4 r) / (1.4 r), j < r / 2."""
    return (np.arange(0, r, 2, dtype=np.float64) + 0.4 * r) / (1.4 * r)


def _ref(x, pos, *, r, base, scale_base, center, key=False):
    """Plain float64 xPos of ``x`` (b, h, s, d) at ``pos`` (b|1, s): half pairing, centred."""
    x = np.asarray(x, dtype=np.float64)
    pos = np.broadcast_to(np.asarray(pos, dtype=np.float64), (x.shape[0], x.shape[2]))
    h = r // 2
    theta = base ** (-np.arange(0, r, 2, dtype=np.float64) / r)  # (h,)
    ang = pos[:, None, :, None] * theta  # (b, 1, s, h)
    power = (pos[:, None, :, None] - center) / scale_base
    scale = _zeta(r) ** (-power if key else power)
    xa, xb = x[..., :h], x[..., h:r]
    out = x.copy()
    out[..., :h] = (xa * np.cos(ang) - xb * np.sin(ang)) * scale
    out[..., h:r] = (xb * np.cos(ang) + xa * np.sin(ang)) * scale
    return out  # dims >= r pass through


def test_default_max_len_is_4096():
    xpos = XPos(8)
    assert xpos.max_len == 4096 and xpos.center == 2048
    x = torch.ones(1, 1, 1, 8)
    qx, kx = xpos(x, x, torch.tensor([[4095]]))  # the last position accepted
    assert torch.isfinite(qx).all() and torch.isfinite(kx).all()
    with raises_exactly("q_positions must be < max_len=4096, got 4096"):
        xpos(x, x, torch.tensor([[4096]]))


def test_float64_values_follow_base_rotary_dim_and_scale_base():
    torch.manual_seed(0)
    # scale_base=3: (p - c) / 3 is not exact in float32, so the exponent must be float64
    xpos = XPos(8, base=100.0, rotary_dim=4, scale_base=3.0, max_len=20)
    assert xpos.center == 10 and xpos.rotary_dim == 4
    q = torch.randn(2, 2, 5, 8, dtype=torch.float64)
    k = torch.randn(2, 1, 5, 8, dtype=torch.float64)
    pq = torch.tensor([[0, 3, 7, 12, 19], [1, 2, 10, 15, 18]])
    pk = torch.tensor([[19, 0, 4, 9, 11]])
    qx, kx = xpos.encode_qk(q, k, pq, pk)
    kw = dict(r=4, base=100.0, scale_base=3.0, center=10)
    np.testing.assert_allclose(qx.numpy(), _ref(q.numpy(), pq.numpy(), **kw), rtol=1e-13)
    np.testing.assert_allclose(kx.numpy(), _ref(k.numpy(), pk.numpy(), key=True, **kw), rtol=1e-13)
    assert torch.equal(qx[..., 4:], q[..., 4:]) and torch.equal(kx[..., 4:], k[..., 4:])


def test_float32_scale_is_rounded_once_into_the_float32_table():
    # at position 0 the rotation is exactly the identity (cos 0 = 1, sin 0 = 0), so
    # q' = q * float32(zeta_j ** ((0 - 32) / 512)): one float32 product per entry (k': +)
    torch.manual_seed(1)
    xpos = XPos(8, max_len=64)
    q = torch.randn(1, 64, 1, 8)
    scale_q = torch.from_numpy(_zeta(8) ** (-32 / 512)).float().repeat(2)  # half pairing
    scale_k = torch.from_numpy(_zeta(8) ** (32 / 512)).float().repeat(2)  # keys: -power
    for pos in (range(0, 1), torch.tensor([[0]])):
        qx, kx = xpos.encode_qk(q, q, pos, pos)
        assert qx.dtype == kx.dtype == torch.float32
        assert torch.equal(qx, q * scale_q)
        assert torch.equal(kx, q * scale_k)


# scale_base=1, max_len=64: centre 32; the float16 window is
# int(log(65504 / 16) / -log(0.4 / 1.4)) = int(8.3173 / 1.2528) = 6 positions
def _small():
    xpos = XPos(4, scale_base=1.0, max_len=64)
    assert xpos.center == 32 and xpos.window(torch.float16) == 6
    return xpos


def _call(xpos, pos):
    x = torch.ones(1, 1, len(pos), 4, dtype=torch.float16)
    return xpos.encode_qk(x, x, pos, pos)


def _outside(got):
    return (
        "positions must be within 6 of the centre 32 for xPos in torch.float16 "
        f"(its scales would overflow), got {got}"
    )


@pytest.mark.parametrize(
    ("inside", "outside", "named"),
    [
        (range(32, 39), range(33, 40), 39),  # last position 38: exactly 6 above the centre
        (range(26, 31), range(25, 30), 25),  # first position 26: exactly 6 below the centre
    ],
    ids=["upper", "lower"],
)
def test_float16_window_edge_for_a_range(inside, outside, named):
    xpos = _small()
    qx, kx = _call(xpos, inside)
    assert torch.isfinite(qx).all() and torch.isfinite(kx).all()
    with raises_exactly(_outside(named)):
        _call(xpos, outside)


def test_float16_window_names_the_lower_end_when_both_are_as_far():
    with raises_exactly(_outside(25)):
        _call(_small(), range(25, 40))  # 25 and 39 are both 7 from the centre


def test_vmapped_positions_are_checked_against_the_window_too():
    # under vmap the positions are out of Python's reach: the window check is an op
    xpos = _small()
    x = torch.ones(1, 1, 3, 4, dtype=torch.float16)

    def call(qp, kp):
        return xpos.encode_qk(x, x, qp, kp)

    good = torch.tensor([[[26, 27, 28]], [[36, 37, 38]]])  # (sets, 1, 3): the window's ends
    got = torch.func.vmap(call)(good, good)
    want = [call(p, p) for p in good]
    for i in range(2):
        assert torch.equal(got[0][i], want[i][0]) and torch.equal(got[1][i], want[i][1])
    why = "; xPos in torch.float16 keeps within 6 of the centre 32"
    for name, bad, msg in [
        ("q_positions", [37, 38, 39], "must be < 39, got 39"),
        ("k_positions", [25, 26, 27], "must be >= 26, got 25"),
    ]:
        sets = torch.tensor([[[30, 31, 32]], [bad]])
        q, k = (sets, good) if name == "q_positions" else (good, sets)
        with raises_exactly(f"{name} {msg}{why}"):
            torch.func.vmap(call)(q, k)


def test_max_len_refused_just_past_the_float32_reach():
    # float32 reach for scale_base=1: int(log(finfo.max / 16) / 1.2528) = int(68.6) = 68
    assert XPos(8, scale_base=1.0, max_len=137).window(torch.float32) == 68
    assert XPos(8, scale_base=1.0, max_len=137).center == 68
    with raises_exactly(
        "max_len must be <= 137 for xPos with scale_base=1.0 "
        "(its scales would overflow float32), got 138"
    ):
        XPos(8, scale_base=1.0, max_len=138)


def test_inplace_writes_into_q_and_k():
    torch.manual_seed(2)
    xpos = XPos(8, max_len=16)
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8)
    want_q, want_k = xpos.encode_qk(q, k, range(3, 7), range(3, 7))
    with torch.no_grad():
        got_q, got_k = xpos.encode_qk(q, k, range(3, 7), range(3, 7), inplace=True)
    assert got_q is q and got_k is k
    torch.testing.assert_close(q, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, want_k, rtol=1e-6, atol=1e-6)


def test_meta_built_module_encodes_cpu_inputs_on_the_cpu():
    torch.manual_seed(3)
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    pos = torch.tensor([[1, 2, 3, 4]])
    want_q, want_k = XPos(8, max_len=16).encode_qk(q, k, pos, pos)
    with torch.device("meta"):
        xpos = XPos(8, max_len=16)  # empty-weight loading: meta tables until used
    got_q, got_k = xpos.encode_qk(q, k, pos, pos)
    assert got_q.device.type == got_k.device.type == "cpu"
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_tables_stay_with_the_module_under_another_default_device():
    torch.manual_seed(4)
    xpos = XPos(8, max_len=16)
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    want_q, want_k = xpos(q, k)
    with torch.device("meta"):
        got_q, got_k = xpos(q, k)  # positions 0..3 as a range
    assert got_q.device.type == got_k.device.type == "cpu"
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_from_hf_refuses_with_its_message():
    with pytest.raises(NotImplementedError) as err:
        XPos.from_hf({"hidden_size": 64, "num_attention_heads": 8})
    assert str(err.value) == "XPos has no Hugging Face config; build it directly"


def test_rope_out_path_refuses_with_its_message():
    x = torch.ones(1, 1, 2, 8)
    with pytest.raises(NotImplementedError) as err:
        XPos(8, max_len=16).rope(x, x, out=(torch.empty_like(x), torch.empty_like(x)))
    assert str(err.value) == "XPos has no rope(out=) path; call it or use encode_qk"


def test_repr_names_scale_base_and_centre():
    assert repr(XPos(8, scale_base=64.0, rotary_dim=4, max_len=33)) == (
        "XPos(head_dim=8, rotary_dim=4, base=10000.0, pairing='half', max_len=33, "
        "scale_base=64.0, center=16)"
    )
    assert math.isclose(XPos(8).scale_base, 512.0)
