"""torch PoPE at its edges: exact refusals at each boundary, base and positions honoured
against the float64 NumPy reference, the output dtype per input dtype, float32 work for
float32 and lower inputs (float64 only in the phase reduction), and where the encoding
builds its tensors (on the inputs' device, whatever torch's default device), and the
rotation hooks (PoPE, RoPE, xPos) refusing positions that do not fit q or k."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from expect import raises_exactly
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import posenc
from posenc.torch import AxialRotaryEmbedding, PoPE, RotaryEmbedding, XPos


def _scores(q2, k2):
    """``q' . k'`` per head, float64, key heads repeated for grouped queries."""
    k2 = k2.repeat_interleave(q2.shape[1] // k2.shape[1], dim=1)
    return (q2.double() @ k2.double().transpose(-1, -2)).detach().numpy()


def _reference(q, k, qp, kp, delta, base=10_000.0):
    """posenc.pope_scores row by row (plain float64 NumPy), key heads repeated."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).double().numpy()
    q = q.double().numpy()
    qp, kp = (
        np.broadcast_to(qp, (q.shape[0], q.shape[2])),
        np.broadcast_to(kp, (k.shape[0], k.shape[2])),
    )
    delta = delta.detach().double().numpy()
    return np.stack([posenc.pope_scores(q[b], k[b], qp[b], kp[b], delta=delta, base=base)
                     for b in range(q.shape[0])])  # fmt: skip


def test_head_dim_and_heads_refused_below_one():
    with raises_exactly("head_dim must be >= 1, got 0"):
        PoPE(0, 2)
    with raises_exactly("head_dim must be >= 1, got -1"):
        PoPE(-1, 2)
    with raises_exactly("heads must be >= 1, got 0"):
        PoPE(8, 0)
    with raises_exactly("heads must be >= 1, got -3"):
        PoPE(8, -3)
    with raises_exactly("heads must be an integer, got 2.0"):
        PoPE(8, 2.0)
    pope = PoPE(1, 1)  # the smallest accepted: one head of width one
    q2, k2 = pope(torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
    assert (pope.head_dim, pope.heads, q2.shape, k2.shape) == (1, 1, (1, 1, 2, 2), (1, 1, 2, 2))


def test_base_refused_unless_positive_and_finite():
    with raises_exactly("base must be a positive finite number, got 0.0"):
        PoPE(8, 2, base=0)
    with raises_exactly("base must be a positive finite number, got -1.0"):
        PoPE(8, 2, base=-1.0)
    with raises_exactly("base must be a positive finite number, got inf"):
        PoPE(8, 2, base=math.inf)
    with raises_exactly("base must be a positive real number, got '10'"):
        PoPE(8, 2, base="10")
    assert PoPE(2, 1, base=5e-324).base == 5e-324  # the smallest positive float is accepted


def test_base_sets_the_frequencies_and_the_scores():
    pope = PoPE(4, 1, base=100.0, delta_init="uniform").double()
    # theta_c = 100^(-c/4): 1, 10^(-1/2), 1/10, 10^(-3/2)
    want = [1.0, 10**-0.5, 0.1, 10**-1.5]
    np.testing.assert_allclose(pope.theta.numpy(), want, rtol=1e-15)
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 6, 4, dtype=torch.float64).unbind(0)
    with torch.no_grad():
        q2, k2 = pope(q, k)
    ref = _reference(q, k, np.arange(6), np.arange(6), pope.raw_delta, base=100.0)
    np.testing.assert_allclose(_scores(q2, k2), ref, rtol=1e-12, atol=1e-12)


def test_uniform_init_draws_raw_delta_inside_its_interval():
    torch.manual_seed(0)
    raw = PoPE(64, 8, delta_init="uniform").raw_delta.detach()  # 512 draws
    assert raw.min() >= -2 * math.pi and raw.max() <= 0.0  # the parameter itself, not wrapped
    assert raw.min() < -2 * math.pi + 0.1 and raw.max() > -0.1  # and it spans the interval
    assert (PoPE(8, 2).raw_delta == 0).all()  # "zeros", the default


def test_encode_qk_refuses_bad_shapes_naming_the_tensor():
    pope = PoPE(8, 2)
    good = torch.zeros(1, 2, 3, 8)
    with raises_exactly("k must have shape (batch, heads, seq, head_dim=8), got (1, 2, 3, 7)"):
        pope.encode_qk(good, torch.zeros(1, 2, 3, 7), range(3), range(3))  # 4-D, wrong width
    with raises_exactly("k must have shape (batch, heads, seq, head_dim=8), got (2, 3, 8)"):
        pope.encode_qk(good, torch.zeros(2, 3, 8), range(3), range(3))  # right width, 3-D
    with raises_exactly("q must have shape (batch, heads, seq, head_dim=8), got (1, 2, 3, 9)"):
        pope.encode_qk(torch.zeros(1, 2, 3, 9), good, range(3), range(3))


def test_encode_qk_refuses_heads_and_batches_that_do_not_fit():
    pope = PoPE(8, 4)
    q = torch.zeros(2, 4, 3, 8)
    shared = "q and k must share batch and k's heads must divide q's, got {} and {}"
    for qs, ks, msg in [
        ((2, 4, 3, 8), (2, 3, 3, 8), shared),  # right heads and batch, 3 does not divide 4
        ((2, 4, 3, 8), (1, 2, 3, 8), shared),  # heads fit, batches differ
        ((2, 2, 3, 8), (2, 2, 3, 8), "q must have heads=4, got {}"),  # not the encoding's
    ]:
        with raises_exactly(msg.format(qs, ks)):
            pope.encode_qk(torch.zeros(qs), torch.zeros(ks), range(3), range(3))
    q2, k2 = pope.encode_qk(q, torch.zeros(2, 1, 3, 8), range(3), range(3))  # 1 divides 4
    assert q2.shape == (2, 4, 3, 16) and k2.shape == (2, 1, 3, 16)


def test_forward_honours_positions_per_row():
    torch.manual_seed(1)
    pope = PoPE(8, 4, delta_init="uniform").double()
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64)  # batch 2 != heads 4
    k = torch.randn(2, 2, 5, 8, dtype=torch.float64)
    rows = torch.tensor([[7, 8, 9, 10, 11], [0, 3, 3, 40, 1_000_000]])
    for positions, p in [(rows, rows.numpy()), (range(5, 10), np.arange(5, 10)),
                         (None, np.arange(5))]:  # fmt: skip
        with torch.no_grad():
            q2, k2 = pope(q, k, positions)
        ref = _reference(q, k, p, p, pope.raw_delta)
        np.testing.assert_allclose(_scores(q2, k2), ref, rtol=1e-10, atol=1e-10)


def test_forward_refuses_positions_of_another_batch():
    pope = PoPE(8, 4)
    q, k = torch.zeros(2, 4, 5, 8), torch.zeros(2, 4, 5, 8)
    with raises_exactly("positions must have shape (seq,) or (batch, seq) = (2, 5), got (3, 5)"):
        pope(q, k, torch.zeros(3, 5, dtype=torch.long))


def test_long_positions_in_float32_match_the_float64_reference():
    torch.manual_seed(2)
    pope = PoPE(16, 2, delta_init="uniform")
    q, k = torch.randn(2, 1, 2, 4, 16).unbind(0)
    p = torch.tensor([10**6, 10**6 + 1, 10**6 + 7, 2 * 10**6])  # m theta_0 ~ 1e6 rad
    with torch.no_grad():
        q2, k2 = pope(q, k, p)
    ref = _reference(q, k, p.numpy(), p.numpy(), pope.raw_delta)
    np.testing.assert_allclose(_scores(q2, k2), ref, rtol=0, atol=2e-5)  # float32 rounding only


@pytest.mark.parametrize("grad", [False, True])
def test_output_dtype_is_the_input_dtype(grad):
    pope = PoPE(4, 2, delta_init="uniform")
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        q = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(3)).to(dtype)
        with torch.set_grad_enabled(grad):
            q2, k2 = pope(q, q[:, :1])
        assert (q2.dtype, k2.dtype, q2.shape, k2.shape) == (
            dtype,
            dtype,
            (1, 2, 3, 8),
            (1, 1, 3, 8),
        )


class _Float32Work(TorchFunctionMode):
    """Records ops that compute a tensor (conversions aside) from or into a 4-D tensor while
    some floating tensor they touch is not float32."""

    def __init__(self):
        super().__init__()
        self.bad = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        ts = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        floats = [t for t in ts if t.dtype.is_floating_point]
        computed = isinstance(out, torch.Tensor) and name != "to"  # conversions are fine
        if computed and any(t.dim() == 4 for t in ts):
            if any(t.dtype != torch.float32 for t in floats):
                self.bad.append((name, [(tuple(t.shape), t.dtype) for t in floats]))
        return out


@pytest.mark.parametrize("grad", [False, True])
def test_float32_and_lower_inputs_are_encoded_in_float32(grad):
    # float64 enters only for the (seq, head_dim) phase reduction; softplus, cos/sin and the
    # products over (batch, heads, seq, head_dim) run in float32 -- also with a float64 module
    for module_dtype in (torch.float32, torch.float64):
        pope = PoPE(4, 2, delta_init="uniform").to(module_dtype)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            q = torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(4)).to(dtype)
            with torch.set_grad_enabled(grad), _Float32Work() as rec:
                pope(q, q, range(10**6, 10**6 + 5))
            assert rec.bad == [], (module_dtype, dtype, rec.bad)


@pytest.mark.parametrize("grad", [False, True])
def test_tensors_are_built_where_the_inputs_are_not_on_the_default_device(grad):
    pope = PoPE(4, 2, delta_init="uniform")
    q = torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(5))
    with torch.set_grad_enabled(grad):
        want = pope.encode_qk(q, q, range(3, 8), range(3, 8))
        with torch.device("meta"):  # another default device: positions and outputs stay on cpu
            got = pope.encode_qk(q, q, range(3, 8), range(3, 8))
    for g, w in zip(got, want, strict=True):
        assert g.device.type == "cpu"
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("make", [lambda: PoPE(4, 2), lambda: RotaryEmbedding(4), lambda: XPos(4)])
def test_hooks_refuse_positions_that_do_not_fit_q_or_k(make):
    # broadcasting them would change the outputs' batch or seq without a word
    enc, q = make(), torch.randn(1, 2, 1, 4)
    msg = "must be a range of 1 or have shape (batch|1, seq) with batch 1 and seq 1, got"
    with raises_exactly(f"q_positions {msg} range(0, 3)"):
        enc.encode_qk(q, q, range(3), range(1))
    with raises_exactly(f"q_positions {msg} (2, 1)"):
        enc.encode_qk(q, q, torch.tensor([[1], [2]]), range(1))
    with raises_exactly(f"k_positions {msg} (1,)"):
        enc.encode_qk(q, q, range(1), torch.tensor([1]))
    two = torch.randn(2, 2, 1, 4)  # (1, seq) positions are shared by the batch
    assert enc.encode_qk(two, two, torch.tensor([[5]]), range(1))[0].shape[:3] == (2, 2, 1)


def test_hooks_refuse_a_stepped_range_and_grid_hooks_misfitting_coordinates():
    q = torch.randn(1, 2, 4, 8)
    with raises_exactly("q_positions must be a range of 4 or have shape (batch|1, seq) with "
                        "batch 1 and seq 4, got range(0, 8, 2)"):  # fmt: skip
        RotaryEmbedding(8).encode_qk(q, q, range(0, 8, 2), range(4))
    axial, grid = AxialRotaryEmbedding(8), torch.zeros(3, 4, 2, dtype=torch.long)
    with raises_exactly("k_positions must be a range of 4 or have shape (batch|1, seq) or "
                        "(batch|1, seq, n_axes=2) with batch 1 and seq 4, "
                        "got (3, 4, 2)"):  # fmt: skip
        axial.encode_qk(q, q, grid[:1], grid)
    with raises_exactly("q_positions must be a range of 4 or have shape (batch|1, seq) or "
                        "(batch|1, seq, n_axes=2) with batch 1 and seq 4, "
                        "got (1, 3, 2)"):  # fmt: skip
        axial.encode_qk(q, q, grid[:1, :3], grid[:1])
    assert axial.encode_qk(q, q, grid[:1], range(4))[0].shape == (1, 2, 4, 8)
