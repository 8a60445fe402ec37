"""The rotation dispatch (posenc.torch.kernels) at its edges: what each table column and row
means, which kernel actually runs, what ``rotate`` returns for ``out=`` and ``inplace``, the
exact refusals, and the single-tensor Triton path (forward and backward, both pairings) under
Triton's interpreter. Reference: the float64 NumPy ``posenc.rope``.
"""

import os
import types

import numpy as np
import pytest
import torch
from expect import raises_exactly

pytest.importorskip("triton")
# CPU tensors through Triton's interpreter: on a machine with a GPU the kernel is compiled
# for it instead (tests/test_rope_triton.py runs it there), and these CPU cases do not apply
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's CPU cases")
os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel module is first imported

import posenc  # noqa: E402
from posenc.torch import kernels  # noqa: E402

HD, SEQ = 8, 5
OUT_ERROR = (  # rotate's refusal of out= for a recorded or traced call
    "out= needs plain eager inference: x requires grad or is being traced "
    "(use torch.no_grad() and no transform, or drop out=)"
)
INV_FREQ = 10_000.0 ** -(torch.arange(0, HD, 2, dtype=torch.float64) / HD)  # (HD // 2,)


def _x(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, SEQ, HD, generator=g, dtype=torch.float64).to(dtype)


def _cs(dtype=torch.float32):
    return kernels.cos_sin(torch.arange(SEQ), INV_FREQ, 1.0, dtype)  # (SEQ, HD // 2, 2)


def _ref(x, pairing):
    return torch.from_numpy(posenc.rope(x.double().numpy(), np.arange(SEQ), pairing=pairing))


def _spy(monkeypatch, name):
    """Count the calls of kernels.<name> (rotate_eager, rotate_expr, _triton, _triton_ops)."""
    calls, real = [], getattr(kernels, name)
    monkeypatch.setattr(kernels, name, lambda *a: calls.append(1) or real(*a))
    return calls


# --- the table and the modes --------------------------------------------------------------


def test_lookup_reads_one_column_per_dtype_and_the_cpu_row_for_other_devices(monkeypatch):
    # the shipped rows repeat the float32 entry for 16-bit: give every column its own name
    monkeypatch.setitem(kernels.TABLE, ("cpu", "plain"), ("f64", "f32", "f16"))
    monkeypatch.setitem(kernels.TABLE, ("cuda", "plain"), ("c64", "c32", "c16"))
    for dev, names in (("cpu", "f"), ("mps", "f"), ("cuda", "c")):
        got = [kernels.lookup(dev, "plain", d) for d in
               (torch.float64, torch.float32, torch.float16, torch.bfloat16)]  # fmt: skip
        assert got == [f"{names}64", f"{names}32", f"{names}16", f"{names}16"], dev
    assert kernels.lookup("cuda", "functorch", torch.float32) == "expr"


def test_mode_and_needs_expr_for_every_kind_of_call(monkeypatch):
    x = torch.ones(2)
    assert (kernels.mode(x), kernels.needs_expr(x)) == ("plain", False)
    w = x.clone().requires_grad_()
    assert (kernels.mode(w), kernels.needs_expr(w)) == ("autograd", True)
    with torch.no_grad():
        assert (kernels.mode(w), kernels.needs_expr(w)) == ("plain", False)
    seen = []
    torch.func.vmap(lambda t: seen.append((kernels.mode(t), kernels.needs_expr(t))) or t)(x[None])
    assert seen == [("functorch", True)]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert (kernels.mode(x), kernels.needs_expr(x)) == ("compile", True)


def test_triton_fits_cuda_or_the_interpreter_on_cpu_and_only_with_triton(monkeypatch):
    cuda = types.SimpleNamespace(device=torch.device("cuda"))  # no GPU needed to ask
    cpu = torch.ones(1)
    assert kernels._triton_fits(cuda) and kernels._triton_fits(cpu)  # interpreter is on
    assert not kernels._triton_fits(torch.ones(1, device="meta"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernels._triton_fits(cuda) and not kernels._triton_fits(cpu)
    monkeypatch.setattr(kernels, "_triton_ok", lambda: False)
    assert not kernels._triton_fits(cuda)


def test_a_triton_entry_falls_back_without_triton_or_beyond_4_dims(monkeypatch):
    monkeypatch.setitem(kernels.TABLE, ("cpu", "plain"), ("triton",) * 3)
    monkeypatch.setitem(kernels.TABLE, ("cpu", "autograd"), ("triton",) * 3)
    x = torch.ones(1, 1, 2, 4)
    assert kernels.choose(x) == "triton"
    assert kernels.choose(x[None]) == "eager"  # 5-D: the plain fallback
    assert kernels.choose(x[None].requires_grad_()) == "expr"  # 5-D: the autograd fallback
    monkeypatch.setattr(kernels, "_triton_ok", lambda: False)
    assert kernels.choose(x) == "eager" and kernels.choose(x.requires_grad_()) == "expr"


def test_each_refused_override_names_the_reason():
    x = torch.ones(1, 1, 2, 4)
    refusals = {
        ("eager", x.clone().requires_grad_()):
            "impl='eager' needs plain eager inference, this call is 'autograd'",
        ("triton", x.double()):
            "impl='triton' takes float32/16-bit, <= 4-D, no torch.func, got torch.float64, "
            "4-D, plain",
        ("triton", x[None]):
            "impl='triton' takes float32/16-bit, <= 4-D, no torch.func, got torch.float32, "
            "5-D, plain",
        ("triton", torch.ones(1, 4, device="meta")):
            "impl='triton' needs triton and a CUDA tensor, got meta",
        ("cpu", x): "impl='cpu' must be one of ('expr', 'eager', 'triton')",
    }  # fmt: skip
    for (impl, t), message in refusals.items():
        with raises_exactly(message):
            kernels.choose(t, impl)
    with (
        kernels.use("eager"),
        raises_exactly("impl='eager' needs plain eager inference, this call is 'autograd'"),
    ):
        kernels.rotate(x.clone().requires_grad_(), _cs()[:2], "half")  # the forced one
    with raises_exactly("impl='eager' needs plain eager inference, this call is 'autograd'"):
        kernels.rotate(x.clone().requires_grad_(), _cs()[:2], "half", impl="eager")


# --- which kernel runs, and what rotate returns -------------------------------------------


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_the_chosen_kernel_is_the_one_that_runs(monkeypatch, pairing):
    eager, expr = _spy(monkeypatch, "rotate_eager"), _spy(monkeypatch, "rotate_expr")
    x, cs = _x(), _cs()
    with torch.no_grad():
        got = kernels.rotate(x, cs, pairing)  # the table: eager on the CPU
        assert (len(eager), len(expr)) == (1, 0)
        other = kernels.rotate(x, cs, pairing, impl="expr")
        assert (len(eager), len(expr)) == (1, 1)
    for y in (got, other):  # the two kernels agree to float32 rounding
        torch.testing.assert_close(y.double(), _ref(x, pairing), rtol=0, atol=2e-6)


@pytest.mark.parametrize("impl", ["eager", "expr", "triton"])
def test_rotate_returns_out_or_x_itself_as_asked(impl):
    x, cs = _x(), _cs()
    want = _ref(x, "interleaved")
    with torch.no_grad():
        out = torch.full_like(x, float("nan"))
        assert kernels.rotate(x, cs, "interleaved", out=out, impl=impl) is out
        new = kernels.rotate(x, cs, "interleaved", impl=impl)
        assert new.data_ptr() != x.data_ptr()
        y = x.clone()
        assert kernels.rotate(y, cs, "interleaved", inplace=True, impl=impl) is y
    for got in (out, new, y):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6)


def test_recorded_calls_refuse_out_and_ignore_inplace():
    x, cs = _x().requires_grad_(), _cs()
    with raises_exactly(OUT_ERROR):
        kernels.rotate(x, cs, "half", out=torch.empty_like(x))
    x0 = x.detach().clone()
    y = kernels.rotate(x, cs, "half", inplace=True)  # a new tensor: x keeps its values
    assert y is not x and torch.equal(x.detach(), x0) and y.grad_fn is not None


# --- the single-tensor Triton path (rotate, not rotate_qk) --------------------------------


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_triton_rotates_one_tensor_forward_and_backward(monkeypatch, pairing, grad):
    # the kernel module (plain) or its custom ops (autograd) are asked for: Triton runs
    launched, ops = _spy(monkeypatch, "_triton"), _spy(monkeypatch, "_triton_ops")
    x, cs = _x(torch.float32).requires_grad_(grad), _cs()
    with kernels.use("triton"):
        y = kernels.rotate(x, cs, pairing)
    assert (len(launched), len(ops)) == ((0, 1) if grad else (1, 0))
    torch.testing.assert_close(y.detach().double(), _ref(x.detach(), pairing), rtol=0, atol=2e-6)
    if grad:  # the backward is the inverse rotation: rotate by -theta (cs with -sin)
        g = _x(torch.float32, seed=1)
        (y * g).sum().backward()
        inverse = _cs() * torch.tensor([1.0, -1.0])  # (SEQ, HD // 2, 2): [cos, -sin]
        want = kernels.rotate(g, inverse, pairing, impl="expr")
        torch.testing.assert_close(x.grad, want, rtol=0, atol=2e-6)


# --- rotate_qk: one launch for q and k exactly when they can share it ---------------------


def _launches(monkeypatch):
    """Record the number of (x, cs, out) pairs of every Triton launch."""
    rope_triton, calls = kernels._triton(), []
    real = rope_triton.launch
    monkeypatch.setattr(rope_triton, "launch", lambda pairs, *a: calls.append(len(pairs)) or
                        real(pairs, *a))  # fmt: skip
    return calls


def _cs_width(pairs):  # [cos, sin] for a rotary width of 2 * pairs dims: (SEQ, pairs, 2)
    inv = 10_000.0 ** -(torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / (2 * pairs))
    return kernels.cos_sin(torch.arange(SEQ), inv, 1.0, torch.float32)


def _check_qk(got, q, k, pairing, widths=(HD // 2, HD // 2)):
    for y, x, h in zip(got, (q, k), widths, strict=True):
        want = posenc.rope(x.double().numpy(), np.arange(SEQ), pairing=pairing, rotary_dim=2 * h)
        tol = 2e-6 if x.dtype == torch.float32 else 2e-2
        torch.testing.assert_close(y.double(), torch.from_numpy(want), rtol=0, atol=tol)


CASES = {  # name -> (q, k, pairs of cs_q, pairs of cs_k, launches)
    "shared": (_x(), _x(seed=1)[:, :2], 4, 4, [2]),
    "dtypes differ": (_x(), _x(torch.bfloat16, seed=1), 4, 4, [1, 1]),
    "batches differ": (_x(), _x(seed=1)[:1], 4, 4, [1, 1]),
    "head dims differ": (_x(), _x(seed=1)[..., :4], 4, 2, [1, 1]),
    "rotary widths differ": (_x(), _x(seed=1), 4, 2, [1, 1]),
}


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("case", list(CASES))
def test_q_and_k_share_a_launch_only_when_they_fit_one(monkeypatch, case, pairing):
    q, k, hq, hk, launches = CASES[case]
    calls = _launches(monkeypatch)
    with torch.no_grad(), kernels.use("triton"):
        got = kernels.rotate_qk(q, k, _cs_width(hq), _cs_width(hk), pairing)
    assert calls == launches
    _check_qk(got, q, k, pairing, (hq, hk))


def test_recorded_q_and_k_share_one_op_unless_their_modes_differ(monkeypatch):
    calls = _launches(monkeypatch)
    q, k, cs = _x().requires_grad_(), _x(seed=1).requires_grad_(), _cs()
    with kernels.use("triton"):
        got = kernels.rotate_qk(q, k, cs, cs, "interleaved")
        assert calls == [2] and all(y.grad_fn is not None for y in got)
        _check_qk([y.detach() for y in got], q.detach(), k.detach(), "interleaved")
        with raises_exactly(OUT_ERROR):
            kernels.rotate_qk(q, k, cs, cs, "half", out=(torch.empty_like(q), torch.empty_like(k)))
        calls.clear()
        got = kernels.rotate_qk(q, k.detach(), cs, cs, "half")  # autograd q, plain k
    assert calls == [1, 1] and got[0].grad_fn is not None and got[1].grad_fn is None
    _check_qk([y.detach() for y in got], q.detach(), k.detach(), "half")


@pytest.mark.parametrize("impl", ["triton", "eager", "expr"])
def test_rotate_qk_writes_into_out_or_in_place(impl):
    q, k, cs = _x(), _x(seed=1), _cs()
    with torch.no_grad():
        out = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
        got = kernels.rotate_qk(q, k, cs, cs, "half", out=out, impl=impl)
        assert got[0] is out[0] and got[1] is out[1]
        _check_qk(got, q, k, "half")
        q2, k2 = q.clone(), k.clone()
        got = kernels.rotate_qk(q2, k2, cs, cs, "half", inplace=True, impl=impl)
        assert got[0] is q2 and got[1] is k2
        _check_qk(got, q, k, "half")
        got = kernels.rotate_qk(q, k, cs, cs, "half", impl=impl)
        assert got[0] is not q and got[1] is not k
    _check_qk(got, q, k, "half")


def test_q_and_k_on_different_implementations_are_rotated_apart(monkeypatch):
    # a table that sends float64 to eager and float32 to Triton: q and k cannot share a launch
    monkeypatch.setitem(kernels.TABLE, ("cpu", "plain"), ("eager", "triton", "triton"))
    calls, eager = _launches(monkeypatch), _spy(monkeypatch, "rotate_eager")
    q, k, cs = _x(torch.float64), _x(seed=1), _cs()
    with torch.no_grad():
        got = kernels.rotate_qk(q, k, cs.double(), cs, "interleaved")
    assert calls == [1] and len(eager) == 1
    _check_qk(got, q, k, "interleaved")


def test_an_implementation_passed_to_rotate_qk_serves_both_q_and_k(monkeypatch):
    calls, expr = _launches(monkeypatch), _spy(monkeypatch, "rotate_expr")
    q, k, cs = _x(), _x(seed=1), _cs()
    with torch.no_grad():
        got = kernels.rotate_qk(q, k, cs, cs, "half", impl="triton")
        assert calls == [2] and expr == []  # one launch for both
        _check_qk(got, q, k, "half")
        got = kernels.rotate_qk(q, k, cs, cs, "half", impl="expr")
    assert calls == [2] and len(expr) == 2
    _check_qk(got, q, k, "half")


def test_triton_is_refused_under_torch_func_and_chosen_from_the_cuda_row():
    x = torch.ones(1, 1, 2, 4)
    message = "impl='triton' takes float32/16-bit, <= 4-D, no torch.func, got torch.float32, "
    errors = []

    def forced(t):
        try:
            kernels.choose(t, "triton")
        except ValueError as e:
            errors.append(str(e))
        return t

    torch.func.vmap(forced)(x[None])
    assert errors == [message + "4-D, functorch"]
    # a CUDA tensor's call reads the CUDA row (no GPU needed to ask _choose)
    cuda = types.SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32, dim=lambda: 4)
    assert kernels._choose(cuda, None, "plain") == "triton"
    assert kernels._choose(cuda, None, "autograd") == "triton"


# --- the Triton launcher reads any [cos, sin] view ----------------------------------------


def _views_of(cs):
    """``cs`` (seq, h, 2) as views with other strides: pairs strided or padded, [cos, sin]
    apart, transposed."""
    seq, h, _ = cs.shape
    spread = torch.zeros(seq, 2 * h, 2)
    spread[:, ::2] = cs  # every other pair: stride(-2) == 4
    apart = torch.zeros(seq, 2, h, 2)
    apart[..., 0] = cs.permute(0, 2, 1)  # cos and sin h * 2 apart: stride(-1) == 2 * h
    padded = torch.zeros(seq, h, 3)
    padded[..., :2] = cs  # each pair followed by a gap: stride(-2) == 3
    return {
        "pairs strided": spread[:, ::2],
        "pairs padded": padded[..., :2],
        "cos and sin apart": apart[..., 0].permute(0, 2, 1),
        "transposed": cs.permute(2, 0, 1).contiguous().permute(1, 2, 0),  # stride(-2) == 1
    }


@pytest.mark.parametrize(
    "view", ["pairs strided", "pairs padded", "cos and sin apart", "transposed"]
)
def test_triton_reads_a_table_of_any_strides(view):
    x, cs = _x(), _cs()
    strided = _views_of(cs)[view]
    assert torch.equal(strided, cs) and not strided.is_contiguous()
    with torch.no_grad():
        got = kernels.rotate(x, strided, "interleaved", impl="triton")
    torch.testing.assert_close(got.double(), _ref(x, "interleaved"), rtol=0, atol=2e-6)


def test_triton_rotates_a_sequence_longer_than_one_programs_block():
    # head_dim 8: a program takes _TILE / 8 = 512 rows; 9000 rows need 18 programs per head
    # (and more than the 8192 rows a block could ever be sized to)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 1, 9000, HD, generator=g)
    cs = kernels.cos_sin(torch.arange(9000), INV_FREQ, 1.0, torch.float32)
    with torch.no_grad():
        got = kernels.rotate(x, cs, "half", impl="triton")
    want = posenc.rope(x.double().numpy(), np.arange(9000))
    torch.testing.assert_close(got.double(), torch.from_numpy(want), rtol=0, atol=1e-5)


def test_rows_per_head_refuse_a_forced_triton_and_fall_back_otherwise(monkeypatch):
    x = _x()  # (2, 3, SEQ, HD)
    cs = _cs()[None].expand(3, -1, -1, -1)  # (heads, SEQ, HD // 2, 2): a row set per head
    with raises_exactly("impl='triton' needs [cos, sin] rows shared by the heads"):
        kernels.rotate(x, cs, "half", impl="triton")
    monkeypatch.setitem(kernels.TABLE, ("cpu", "plain"), ("triton",) * 3)  # as on a GPU
    monkeypatch.setattr(kernels, "_triton_ok", lambda: True)
    triton = _spy(monkeypatch, "_triton")
    got = kernels.rotate(x, cs, "half")
    assert triton == []  # the table's fallback ran instead
    torch.testing.assert_close(got.double(), _ref(x, "half"), rtol=0, atol=1e-5)


def test_rotate_qk_checks_the_rows_of_q_and_of_k_for_a_forced_triton():
    x = _x()  # (2, 3, SEQ, HD)
    shared, per_head = _cs(), _cs()[None].expand(3, -1, -1, -1)
    for cs_q, cs_k in [(per_head, shared), (shared, per_head)]:
        with raises_exactly("impl='triton' needs [cos, sin] rows shared by the heads"):
            kernels.rotate_qk(x, x, cs_q, cs_k, "half", impl="triton")


def test_a_table_that_requires_grad_is_recorded_even_when_x_does_not():
    # gradients reach the [cos, sin] rows (a learned table, a model fitting the angles)
    x = _x(torch.float64)
    cs = _cs(torch.float64).requires_grad_()
    assert kernels.mode(x, cs) == "autograd"
    y = kernels.rotate(x, cs, "half", out=None)
    weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=y.dtype)
    (y * weight).sum().backward()
    # d/d cos of x1 cos - x2 sin (first half) and x2 cos + x1 sin (second half), summed
    x1, x2, w1, w2 = (
        x[..., : HD // 2],
        x[..., HD // 2 :],
        weight[..., : HD // 2],
        weight[..., HD // 2 :],
    )
    want_cos = (w1 * x1 + w2 * x2).sum((0, 1))  # (SEQ, HD // 2)
    want_sin = (-w1 * x2 + w2 * x1).sum((0, 1))
    torch.testing.assert_close(cs.grad, torch.stack([want_cos, want_sin], -1), rtol=0, atol=1e-12)
    with torch.no_grad():
        assert kernels.mode(x, cs) == "plain"


def test_a_whole_head_rotation_copies_no_empty_tail(monkeypatch):
    # the expression path joins an unrotated tail back only where there is one: a full-width
    # rotation is returned as computed (a join with an empty tail is one more copy a call)
    from posenc.torch.kernels.rope_eager import rotate_expr

    x, cs = torch.randn(1, 2, 3, 8), torch.randn(3, 4, 2)  # (b, h, s, d), (s, d // 2, 2)
    joins, cat = [], torch.cat
    monkeypatch.setattr(
        torch, "cat", lambda ts, *a, **kw: joins.append(len(ts)) or cat(ts, *a, **kw)
    )
    rotate_expr(x, cs, "interleaved")
    assert joins == []
    rotate_expr(x, cs, "half")
    assert joins == [2]  # its two halves
    rotate_expr(x, cs[:, :2], "interleaved")  # 4 of 8 channels: the tail joins
    assert joins == [2, 2]


def test_table_rows_are_gathered_onto_the_device_asked_for():
    # a module's table on one device, the rotation on another (meta stands in for a GPU):
    # the rows go where they are asked for, else stay with the table
    from posenc.torch.kernels.rows import TableRows

    table = torch.arange(40.0).view(10, 2, 2)  # (rows, r // 2, 2)
    for positions in (range(2, 5), torch.tensor([[2, 3, 4]])):
        rows = TableRows(table, positions)
        assert torch.equal(rows.gather(), table[2:5][None])  # (1, seq, r // 2, 2)
        moved = rows.gather("meta")
        assert moved.device.type == "meta" and moved.shape == (1, 3, 2, 2)
