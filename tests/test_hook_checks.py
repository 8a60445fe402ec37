"""Every public hook checks the positions it is given, as ``forward`` and ``attend`` do.

``encode_qk``, ``score_bias``, ``score_mod``, ``encode_input`` and RoPE's ``table`` are
public: a negative position, one at or past ``max_len``, or float positions raise a
``ValueError`` naming the argument, in eager mode and under ``torch.compile`` -- never a
rotation by whatever the last table row is, nor a coordinate wrapped into the table.
"""

from __future__ import annotations

import pytest
import torch
from expect import raises_exactly
from test_real_user_matrix import MATRIX, NAMES, S, _inputs, _make, _positions


def _hook(enc, name, q_positions, k_positions):
    x, q, k = _inputs()
    kind = MATRIX[name].kind
    if kind == "input":
        return enc.encode_input(x, q_positions)
    if kind == "qk":
        return enc.encode_qk(q, k, q_positions, k_positions)
    enc.score_mod(q_positions, k_positions)
    return enc.score_bias(q_positions, k_positions)


CHECKED = [n for n in NAMES if n != "nope"]  # NoPE reads no position


@pytest.mark.parametrize("which", ["q_positions", "k_positions"])
@pytest.mark.parametrize("name", CHECKED)
def test_a_hook_refuses_a_negative_position_naming_the_argument(name, which):
    if MATRIX[name].kind == "input" and which == "k_positions":
        pytest.skip("encode_input takes one set of positions")
    enc = _make(name).double()
    good, bad = _positions(name), _positions(name).clone()
    bad[1, 2] = -1  # one position of one row
    args = {"q_positions": good, "k_positions": good, which: bad}
    label = "positions" if MATRIX[name].kind == "input" else which
    with raises_exactly(f"{label} must be non-negative, got -1"):
        _hook(enc, name, args["q_positions"], args["k_positions"])


@pytest.mark.parametrize("name", [n for n in CHECKED if MATRIX[n].limit])
def test_a_hook_refuses_a_position_past_its_table(name):
    enc = _make(name).double()
    past = _positions(name).clone()
    past[0, -1] = MATRIX[name].limit  # the first row the table does not have
    label = "positions" if MATRIX[name].kind == "input" else "q_positions"
    hint = "; build the encoding with a larger max_len" if MATRIX[name].kind == "input" else ""
    with raises_exactly(f"{label} must be < max_len=32, got 32{hint}"):
        _hook(enc, name, past, _positions(name))


@pytest.mark.parametrize("name", CHECKED)
def test_a_hook_refuses_float_positions(name):
    enc = _make(name).double()
    floats = _positions(name).double()
    label = "positions" if MATRIX[name].kind == "input" else "q_positions"
    with pytest.raises(ValueError, match=f"^{label} must be an integer tensor, got dtype"):
        _hook(enc, name, floats, _positions(name))


@pytest.mark.parametrize("name", [n for n in CHECKED if MATRIX[n].kind != "input"])
def test_a_hook_refuses_a_negative_range_and_bool_positions(name):
    # input hooks take a range through position_arg, which refuses it with its own words
    enc = _make(name).double()
    if MATRIX[name].axes == 1:
        with raises_exactly("q_positions must be non-negative, got -2"):
            _hook(enc, name, range(-2, S - 2), _positions(name))
    flags = _positions(name) % 2 == 0
    with raises_exactly("q_positions must be an integer tensor, got dtype torch.bool"):
        _hook(enc, name, flags, _positions(name))


@pytest.mark.parametrize(
    "name", [n for n in CHECKED if MATRIX[n].kind == "input" and MATRIX[n].axes == 1]
)
def test_an_input_hook_names_its_hint_for_a_range_past_the_table(name):
    enc = _make(name).double()
    x = torch.zeros(1, S, enc.dim, dtype=torch.float64)
    stop = MATRIX[name].limit
    why = (
        f"positions must be < max_len={stop}, got {stop}; build the encoding with a larger max_len"
    )
    with raises_exactly(why):
        enc.encode_input(x, range(stop + 1 - S, stop + 1))


@pytest.mark.parametrize("name", CHECKED)
def test_a_hook_on_the_meta_device_reads_no_value(name):
    # shapes only (a model run on meta): the position check must not read values
    with torch.device("meta"):
        enc = _make(name)
    x, q, k = (t.float().to("meta") for t in _inputs())
    p = _positions(name).to("meta")
    kind = MATRIX[name].kind
    if kind == "input":
        out = enc.encode_input(x, p)
        assert out.is_meta and out.shape == x.shape
    elif kind == "qk":
        out_q, out_k = enc.encode_qk(q, k, p, p)
        assert out_q.is_meta and out_q.shape[:3] == q.shape[:3]
    else:
        assert enc.score_bias(p, p).is_meta


def test_ropes_table_refuses_what_its_hook_refuses():
    rope = _make("rope")
    with raises_exactly("positions must be non-negative, got -1"):
        rope.table(torch.tensor([[0, -1]]))
    with raises_exactly("positions must be < max_len=32, got 32"):
        rope.table(range(30, 33))
    row = rope.table(torch.tensor([[31]]))  # the last row is fine, and is row 31
    torch.testing.assert_close(row, rope.table(range(31, 32)), rtol=0, atol=0)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["rope", "mrope", "sincos_2d", "alibi"])
def test_a_compiled_hook_refuses_a_negative_position(name):
    torch._dynamo.reset()
    enc = _make(name).double()
    inputs = _inputs()

    def call(p):
        x, q, k = inputs
        kind = MATRIX[name].kind
        if kind == "input":
            return enc.encode_input(x, p)
        if kind == "qk":
            return enc.encode_qk(q, k, p, p)[0]
        return enc.score_bias(p, p)

    fn = torch.compile(call, fullgraph=True)
    fn(_positions(name))
    bad = _positions(name).clone()
    bad[0, 0] = -1
    with pytest.raises(ValueError, match="positions must be non-negative, got -1"):
        fn(bad)
