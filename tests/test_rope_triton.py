"""The Triton RoPE kernel and the dispatch that picks it, on a machine without a GPU.

Without CUDA the kernel runs on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, set here before the kernel module is first imported; only the
forced ``"triton"`` implementation uses it, the CPU's own paths are untouched). With CUDA
the same tests run on the GPU. References: the float64 NumPy ``posenc.rope``; for
gradients, the transpose of the rotation built from ``posenc.rope`` applied to basis
vectors (independent of the kernel's ``conjugate`` flag), and the expression path.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel module is first imported

import posenc  # noqa: E402
from posenc.scaling import DynamicNTK, YaRN  # noqa: E402
from posenc.torch import RotaryEmbedding, XPos, apply_rope, kernels  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
HD = 16
POS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13], [0, 0, 0, 0, 1, 2, 3, 4, 5]])


def _qk(dtype, seq=9, heads=(4, 2), batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, h, seq, HD, generator=g, dtype=torch.float64) for h in heads)
    return q.to(DEV, dtype), k.to(DEV, dtype)


def _ref(x, pos, **kw):
    """float64 NumPy RoPE of ``x`` (b, h, s, d) at ``pos`` (range or (b|1, s))."""
    p = np.arange(pos.start, pos.stop) if isinstance(pos, range) else pos.numpy()[:, None]
    return posenc.rope(x.double().cpu().numpy(), p, **kw)


def _check(got, ref, dtype):
    """float32: float32 accuracy; 16-bit: within one ulp of the correctly rounded value."""
    got = got.double().cpu()
    ref = torch.from_numpy(ref)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)
        return
    rounded = ref.to(dtype).double()  # the correctly rounded result
    exp = torch.floor(torch.log2(rounded.abs().clamp_min(2.0**-100)))
    ulp = 2.0**exp * torch.finfo(dtype).eps  # eps = 2**-(mantissa bits)
    assert ((got - rounded).abs() <= ulp).all(), (got - rounded).abs().div(ulp).max()


@pytest.mark.parametrize("where", ["new", "out", "inplace"])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 10])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_forward_matches_numpy(pairing, dtype, rotary_dim, per_row, where):
    rot = RotaryEmbedding(HD, pairing=pairing, rotary_dim=rotary_dim, max_len=64)
    q, k = _qk(dtype)
    pos = POS if per_row else range(40, 49)
    q0, k0 = q.clone(), k.clone()
    with torch.no_grad(), kernels.use("triton"):
        if where == "out":
            out = (torch.empty_like(q), torch.empty_like(k))
            qr, kr = rot.rope(q, k, pos, out=out)
            assert qr is out[0] and kr is out[1]
        else:
            qr, kr = rot.encode_qk(q, k, pos, pos, inplace=where == "inplace")
    if where == "inplace":
        assert qr.data_ptr() == q.data_ptr() and kr.data_ptr() == k.data_ptr()
    else:  # the inputs are untouched
        assert torch.equal(q, q0) and torch.equal(k, k0)
    kw = dict(pairing=pairing, rotary_dim=rotary_dim)
    _check(qr, _ref(q0, pos, **kw), dtype)
    _check(kr, _ref(k0, pos, **kw), dtype)


def test_packed_documents_per_token_positions():
    # positions restarting at each packed document (flash-attention's varlen layout as
    # per-token positions): the kernel gathers each token's own row
    from posenc.torch import documents_from_cu_seqlens, positions_from_documents

    docs = documents_from_cu_seqlens(torch.tensor([0, 4, 7, 9])).expand(2, -1)
    pos = positions_from_documents(docs)  # (2, 9): 0..3, 0..2, 0..1
    rot = RotaryEmbedding(HD, max_len=64)
    q, k = _qk(torch.float32)
    with torch.no_grad(), kernels.use("triton"):
        qr, kr = rot.encode_qk(q, k, pos.to(DEV), pos.to(DEV))
    _check(qr, _ref(q, pos), torch.float32)
    _check(kr, _ref(k, pos), torch.float32)


@pytest.mark.parametrize("positions", ["range", "per-token"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_sixteen_bit_outputs_are_the_float32_rotation_rounded_once_to_nearest(
    pairing, dtype, positions
):
    # bit for bit: float32 products and sums, unfused, then one round-to-nearest-even (the
    # interpreter's own bf16 conversion truncates: the kernel rounds in integers)
    rot = RotaryEmbedding(64, pairing=pairing, rotary_dim=48, max_len=512)
    q, k = (t.to(DEV, dtype) for t in (torch.randn(2, 4, 100, 64), torch.randn(2, 2, 100, 64)))
    pos = torch.randint(0, 512, (2, 100)) if positions == "per-token" else range(300, 400)
    with torch.no_grad(), kernels.use("triton"):
        got = rot.encode_qk(q, k, pos, pos)
    cs = rot.table(pos)[:, None].to(DEV)  # float32 [cos, sin]
    for g, x in zip(got, (q, k), strict=True):
        want = kernels.rope_eager.rotate_expr(x.float(), cs, pairing).to(dtype)
        assert torch.equal(g, want)


@pytest.mark.parametrize("grad", [False, True])
def test_q_and_k_in_one_launch(grad, monkeypatch):
    from posenc.torch.kernels import rope_triton

    calls = []
    launch = rope_triton.launch
    monkeypatch.setattr(rope_triton, "launch", lambda pairs, *a: calls.append(len(pairs)) or
                        launch(pairs, *a))  # fmt: skip
    q, k = (t.requires_grad_(grad) for t in _qk(torch.bfloat16))
    with kernels.use("triton"):
        qr, kr = RotaryEmbedding(HD, max_len=64)(q, k)
    assert calls == [2]  # one launch, two tensors
    if grad:
        torch.autograd.backward((qr, kr), (torch.ones_like(qr), torch.ones_like(kr)))
        assert calls == [2, 2]


def test_empty_inputs():
    q, k = torch.ones(2, 4, 0, HD, device=DEV), torch.ones(2, 2, 0, HD, device=DEV)
    with torch.no_grad(), kernels.use("triton"):
        qr, kr = RotaryEmbedding(HD, max_len=8).encode_qk(q, k, range(0), range(0))
    assert qr.shape == q.shape and kr.shape == k.shape


def test_float32_equals_the_expression_path():
    rot = RotaryEmbedding(HD, pairing="interleaved", max_len=64)
    q, k = _qk(torch.float32)
    with torch.no_grad(), kernels.use("triton"):
        got = rot.encode_qk(q, k, POS, POS)
    with torch.no_grad(), kernels.use("expr"):
        want = rot.encode_qk(q, k, POS, POS)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_odd_shapes_gqa_and_strided_views_of_a_fused_projection():
    """423 tokens (not a block multiple), 6 query heads on 2 key heads, q and k sliced
    out of one qkv tensor (no copy: rotated in place inside it)."""
    g = torch.Generator().manual_seed(1)
    b, s, hq, hk = 2, 423, 6, 2
    qkv = torch.randn(b, s, (hq + 2 * hk) * HD, generator=g).to(DEV, torch.bfloat16)
    q = qkv[..., : hq * HD].unflatten(-1, (hq, HD)).transpose(1, 2)  # (b, hq, s, d) strided
    k = qkv[..., hq * HD : (hq + hk) * HD].unflatten(-1, (hk, HD)).transpose(1, 2)
    q0, k0 = q.clone(), k.clone()
    rot = RotaryEmbedding(HD, max_len=512)
    with torch.no_grad(), kernels.use("triton"):
        qr, kr = rot.encode_qk(q, k, range(s), range(s), inplace=True)
    assert qr.data_ptr() == q.data_ptr() and kr.data_ptr() == k.data_ptr()
    _check(q, _ref(q0, range(s)), torch.bfloat16)
    _check(k, _ref(k0, range(s)), torch.bfloat16)


@pytest.mark.parametrize("scaling", [DynamicNTK(4.0, 16), YaRN(4.0, 16)])
def test_scalings_and_apply_rope(scaling):
    x = _qk(torch.float32, seq=40)[0]
    pos = torch.tensor([[60 + i for i in range(40)]])
    with torch.no_grad(), kernels.use("triton"):
        got = apply_rope(x, pos, scaling=scaling)
    _check(got, _ref(x, pos, scaling=scaling), torch.float32)  # seq_len = 100 for NTK


def _transpose_ref(g, pos, **kw):
    """``R^T g`` per position, ``R`` read off ``posenc.rope`` of the basis vectors.

    ``pos``: NumPy positions ``(b|1, 1, s)``."""
    b, h, s, d = g.shape
    basis = np.broadcast_to(np.eye(d)[:, None, None, None], (d, b, h, s, d))  # [i] = e_i
    cols = posenc.rope(np.ascontiguousarray(basis), pos, **kw)  # [i, ...] = R e_i
    return np.einsum("ibhsj,bhsj->bhsi", cols, g.double().cpu().numpy())


@pytest.mark.parametrize("rotary_dim", [None, 10])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_backward_is_the_transposed_rotation(pairing, rotary_dim):
    rot = RotaryEmbedding(HD, pairing=pairing, rotary_dim=rotary_dim, scaling=YaRN(2.0, 32))
    q, k = _qk(torch.float32)
    gq, gk = _qk(torch.float32, seed=1)
    q.requires_grad_()
    k.requires_grad_()
    with kernels.use("triton"):
        qr, kr = rot.encode_qk(q, k, POS, POS)
    torch.autograd.backward((qr, kr), (gq, gk))
    kw = dict(pairing=pairing, rotary_dim=rotary_dim, scaling=YaRN(2.0, 32))
    _check(q.grad, _transpose_ref(gq, POS.numpy()[:, None], **kw), torch.float32)
    _check(k.grad, _transpose_ref(gk, POS.numpy()[:, None], **kw), torch.float32)
    qe, ke = (t.detach().clone().requires_grad_() for t in (q, k))
    with kernels.use("expr"):
        torch.autograd.backward(rot.encode_qk(qe, ke, POS, POS), (gq, gk))
    torch.testing.assert_close(q.grad, qe.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(k.grad, ke.grad, rtol=0, atol=1e-6)


def test_bfloat16_backward_and_gradcheck_in_float32():
    rot = RotaryEmbedding(HD, max_len=64)
    q, k = (t.requires_grad_() for t in _qk(torch.bfloat16))
    with kernels.use("triton"):
        qr, _ = rot(q, k)
    qr.float().square().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and k.grad.abs().max() == 0  # k unused: zeros
    x = torch.randn(1, 2, 5, HD, dtype=torch.float32, device=DEV, requires_grad=True)
    cs = rot.table(range(5))[:, None].to(DEV)  # (1, 1, 5, r // 2, 2)
    with kernels.use("triton"):
        jac = torch.autograd.functional.jacobian(lambda t: kernels.rotate(t, cs, "half"), x)
    with kernels.use("expr"):
        want = torch.autograd.functional.jacobian(lambda t: kernels.rotate(t, cs, "half"), x)
    torch.testing.assert_close(jac, want, rtol=0, atol=1e-6)


def test_xpos_uses_the_kernel_with_its_scaled_tables():
    xp = XPos(HD, max_len=64)
    q, k = _qk(torch.float32)
    with torch.no_grad(), kernels.use("triton"):
        got = xp.encode_qk(q, k, POS, POS)
    with torch.no_grad(), kernels.use("expr"):
        want = xp.encode_qk(q, k, POS, POS)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.compile
def test_compiled_forward_and_backward_call_the_kernel():
    rot = RotaryEmbedding(HD, pairing="interleaved", max_len=64)
    q, k = _qk(torch.float32)

    def loss(q, k):
        qr, kr = rot(q, k)
        return (qr * kr.repeat_interleave(2, 1)).sum()

    fn = torch.compile(loss, fullgraph=True)
    grads = []
    for impl, f in (("triton", fn), ("expr", loss)):
        qq, kk = (t.clone().requires_grad_() for t in (q, k))
        with kernels.use(impl):
            f(qq, kk).backward()
        grads.append((qq.grad, kk.grad))
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# -- the dispatch --------------------------------------------------------------------------
def test_the_table_rows():
    lo = torch.bfloat16
    want = {
        ("cpu", "plain"): ("eager", "eager", "eager"),
        ("cpu", "autograd"): ("expr", "expr", "expr"),
        ("cuda", "plain"): ("eager", "triton", "triton"),
        ("cuda", "compile"): ("expr", "expr", "expr"),  # inductor sees plain expressions
    }
    for (dev, mode), impls in want.items():
        for dtype, impl in zip((torch.float64, torch.float32, lo), impls, strict=True):
            assert kernels.lookup(dev, mode, dtype) == impl, (dev, mode, dtype)
    assert kernels.lookup("mps", "plain", lo) == "eager"  # other devices: the CPU row


def test_choose_per_call_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.ones(1, 1, 2, 4, dtype=torch.bfloat16)
    assert kernels.choose(x) == "eager"
    assert kernels.choose(x.clone().requires_grad_()) == "expr"
    with torch.no_grad():
        assert kernels.choose(x.clone().requires_grad_()) == "eager"
    seen = []
    torch.func.vmap(lambda t: seen.append(kernels.choose(t)) or t)(x)
    assert seen == ["expr"]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert kernels.choose(x) == "expr"


def test_a_bad_override_raises(monkeypatch):
    x = torch.ones(1, 1, 2, 4)
    with pytest.raises(ValueError, match="impl must be one of"):
        with kernels.use("cuda"):
            pass
    with pytest.raises(ValueError, match="impl='eager' needs plain eager inference"):
        kernels.choose(x.clone().requires_grad_(), "eager")
    with pytest.raises(ValueError, match="impl='triton' takes float32"):
        kernels.choose(x.double().to(DEV), "triton")
    if not CUDA:
        assert kernels.choose(x, "triton") == "triton"  # the interpreter serves CPU tensors
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(ValueError, match="impl='triton' needs triton and a CUDA tensor"):
            kernels.choose(x, "triton")


def test_triton_stays_optional():
    """Without triton installed, posenc imports, rotates, and refuses to force it."""
    code = (
        "import sys, os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "sys.modules['triton'] = None  # as if not installed\n"
        "import torch, posenc.torch\n"
        "from posenc.torch import RotaryEmbedding, kernels\n"
        "x = torch.ones(1, 2, 3, 8)\n"
        "RotaryEmbedding(8)(x, x)\n"
        "try:\n"
        "    kernels.choose(x, 'triton')\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "impl='triton' needs triton" in run.stdout


@pytest.mark.skipif(not CUDA, reason="needs a GPU: 2**31 elements")
def test_64_bit_offsets():
    x = torch.ones(1, 2**17 + 1, 256, 64, dtype=torch.bfloat16, device="cuda")  # > 2**31
    cs = RotaryEmbedding(64, max_len=256).table(range(256))[:, None].cuda()
    with torch.no_grad(), kernels.use("triton"):
        kernels.rotate(x, cs, "half", inplace=True)
    want = kernels.rotate(x[:, :1].clone().fill_(1), cs, "half", impl="eager")
    assert torch.equal(x[:, -1:], want)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_autograd_under_a_dispatch_mode_rotates_with_the_custom_ops(pairing):
    # under a TorchDispatchMode (FlopCounterMode here; make_fx and FakeTensorMode likewise) a
    # plain autograd.Function is not recorded: the custom ops rotate, with the same pairing
    from torch.utils.flop_counter import FlopCounterMode

    for x in _qk(torch.float32):
        x.requires_grad_()
        with kernels.use("triton"), FlopCounterMode(display=False):
            got = apply_rope(x, POS, pairing=pairing)
        _check(got.detach(), _ref(x.detach(), POS, pairing=pairing), torch.float32)
    q, k = (x.detach().requires_grad_() for x in _qk(torch.float32))
    with kernels.use("triton"), FlopCounterMode(display=False):  # q and k in one op
        got = RotaryEmbedding(HD, pairing=pairing, max_len=64).encode_qk(q, k, POS, POS)
    for x, y in zip((q, k), got, strict=True):
        _check(y.detach(), _ref(x.detach(), POS, pairing=pairing), torch.float32)


def test_plain_autograd_rotates_through_the_function_not_the_custom_ops(monkeypatch):
    # outside transforms and dispatch modes a plain autograd.Function costs less host time
    # than a custom op: the custom ops must not be reached (they would give the same numbers)
    from posenc.torch.kernels import rope_triton_ops

    def refuse(*args):
        raise AssertionError("custom op called in plain autograd")

    monkeypatch.setattr(rope_triton_ops, "rope", refuse)
    monkeypatch.setattr(rope_triton_ops, "rope_qk", refuse)
    q, k = (x.requires_grad_() for x in _qk(torch.float32))
    with kernels.use("triton"):
        got = RotaryEmbedding(HD, max_len=64).encode_qk(q, k, POS, POS)
        one = apply_rope(q, POS)
    for x, y in zip((q, k, q), (*got, one), strict=True):
        _check(y.detach(), _ref(x.detach(), POS), torch.float32)


@pytest.mark.parametrize("grad", [False, True])
def test_queries_and_keys_at_their_own_positions_share_one_launch(grad):
    # a decode-like step: three queries at the last positions, nine keys at all of them (two
    # tables of rows, not one), rotated together
    q9, k = _qk(torch.float32)
    q, qpos = q9[:, :, 6:].contiguous(), POS[:, 6:]
    q.requires_grad_(grad)
    k.requires_grad_(grad)
    with kernels.use("triton"), torch.set_grad_enabled(grad):
        got = RotaryEmbedding(HD, max_len=64).encode_qk(q, k, qpos, POS)
    _check(got[0].detach(), _ref(q.detach(), qpos), torch.float32)
    _check(got[1].detach(), _ref(k.detach(), POS), torch.float32)
