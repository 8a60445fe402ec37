"""Review of f204556/29dced0: the Triton RoPE launcher's prepared-layout cache, the eager
autograd.Function and rotate_qk's shortcuts, each against a float64 plain-torch rotation.

Run under the interpreter on a CPU (TRITON_INTERPRET=1, set before the kernel is imported).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")
if not __import__("torch").cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from posenc.torch import RotaryEmbedding, kernels  # noqa: E402
from posenc.torch.kernels import rope_triton, rope_triton_ops  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HD = 16


def ref(x, cs, pairing="half"):
    """float64 rotation of the first 2 * cs.shape[-2] dims of x by cs (broadcast)."""
    x, cs = x.double().cpu(), cs.double().cpu()
    h = cs.shape[-2]
    c, s = cs[..., 0], cs[..., 1]
    if pairing == "half":
        x1, x2 = x[..., :h], x[..., h : 2 * h]
        o = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    else:
        x1, x2 = x[..., 0 : 2 * h : 2], x[..., 1 : 2 * h : 2]
        o = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)
    return torch.cat([o, x[..., 2 * h :]], -1)


def table(seq, half=HD // 2, seed=0, batch=1):
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(batch, 1, seq, half, generator=g, dtype=torch.float64) * 6
    return torch.stack([ang.cos(), ang.sin()], -1).float().to(DEV)  # (b, 1, s, h, 2)


def rnd(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEV, dtype)


def close(got, want, atol=2e-6):
    torch.testing.assert_close(got.double().cpu(), want, rtol=0, atol=atol)


def launch1(x, cs, out=None, interleaved=False, conjugate=False):
    out = torch.empty_like(x) if out is None else out
    return rope_triton.launch([(x, cs, out)], interleaved, conjugate)[0]


# -- the prepared-layout cache: one key, several tensors ----------------------------------
def test_cs_batch_expanded_with_stride_zero_then_another_of_the_same_layout():
    x = rnd(3, 2, 5, HD)
    for seed in (0, 1):  # same layout, new values: the second reads its own table
        base = table(5, seed=seed)  # (1, 1, 5, 8, 2)
        cs = base.expand(3, 1, 5, HD // 2, 2)  # batch stride 0
        close(launch1(x, cs), ref(x, cs))


@pytest.mark.parametrize("dims", [2, 3, 4])
def test_cs_of_fewer_dims(dims):
    x = rnd(2, 3, 5, HD)
    for seed in (0, 1):
        full = table(5, seed=seed)  # (1, 1, 5, 8, 2)
        cs = full[0, 0, :1, :, :][0] if dims == 2 else full[0, 0] if dims == 3 else full[0]
        close(launch1(x, cs), ref(x, cs))


def test_cs_slices_at_different_offsets_share_one_layout():
    big = table(40)  # (1, 1, 40, 8, 2)
    x = rnd(1, 2, 7, HD)
    for start in (0, 3, 17, 33):
        cs = big[:, :, start : start + 7]
        close(launch1(x, cs), ref(x, cs))


def test_a_copied_table_reads_each_calls_values():
    x = rnd(2, 2, 6, HD)
    for seed in (0, 1, 2):
        t = table(6, seed=seed, batch=2)  # (2, 1, 6, 8, 2)
        cs = t.transpose(-1, -2).contiguous().transpose(-1, -2)  # stride(-1) == 8: copied
        assert cs.stride(-1) != 1
        close(launch1(x, cs), ref(x, cs))


def test_cs5_with_a_head_dim_stride_not_one_row():
    # cs5[:, 0] with shape[1] == 1 but stride(1) huge: the view starts where cs starts
    t = table(6, batch=2)
    cs = torch.empty(2, 7, 6, HD // 2, 2, device=DEV)[:, 3:4]
    cs.copy_(t)
    x = rnd(2, 3, 6, HD)
    close(launch1(x, cs), ref(x, cs))


def test_table_dtype_is_not_in_the_key_but_is_read_per_call():
    x = rnd(1, 2, 5, HD)
    cs32 = table(5)
    cs64 = table(5, seed=1).double()  # same shape and strides, float64
    close(launch1(x, cs32), ref(x, cs32))
    close(launch1(x, cs64), ref(x, cs64))


@pytest.mark.parametrize("pdtype", [torch.int64, torch.int32])
def test_indexed_positions_dtype_and_shape(pdtype):
    whole = table(32)[0, 0]  # (32, 8, 2)
    x = rnd(2, 2, 5, HD)
    for pos in (torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]),
                torch.tensor([7, 0, 31, 2, 2])):  # fmt: skip
        pos = pos.to(DEV, pdtype)
        got = launch1(x, (whole, pos))
        rows = whole[pos.long()]  # (b|1, s, 8, 2) or (s, 8, 2)
        want = ref(x, rows[:, None] if rows.dim() == 4 else rows)
        close(got, want)


def test_indexed_positions_int32_after_int64_same_layout():
    whole = table(32)[0, 0]
    x = rnd(1, 2, 5, HD)
    p64 = torch.tensor([[3, 1, 4, 1, 5]], device=DEV)
    p32 = torch.tensor([[9, 2, 6, 5, 3]], device=DEV, dtype=torch.int32)
    close(launch1(x, (whole, p64)), ref(x, whole[p64][:, None]))
    close(launch1(x, (whole, p32)), ref(x, whole[p32.long()][:, None]))


def test_same_layout_in_place_then_new_then_in_place():
    cs = table(5)
    for inplace in (True, False, True):
        x = rnd(1, 2, 5, HD + 4, seed=int(inplace))  # a tail of 4 (partial rotary)
        want = ref(x, cs)
        got = launch1(x, cs, out=x if inplace else None)
        close(got, want)


def test_x_expanded_over_heads_stride_zero():
    x = rnd(2, 1, 5, HD).expand(2, 3, 5, HD)
    cs = table(5)
    close(launch1(x, cs), ref(x, cs))


def test_zero_sized_dims_return_without_launching():
    cs = table(0)
    for shape in ((2, 3, 0, HD), (0, 3, 5, HD)):
        x = torch.empty(*shape, device=DEV)
        c = cs if shape[2] == 0 else table(5)
        assert launch1(x, c).shape == x.shape


def test_zero_heads_return_without_launching():
    x = torch.empty(2, 0, 5, HD, device=DEV)
    assert launch1(x, table(5)).shape == x.shape  # a ZeroDivisionError in plan (old and new)


def test_two_pairs_same_layout_with_a_shared_and_a_distinct_table():
    q, k = rnd(2, 4, 5, HD), rnd(2, 2, 5, HD, seed=1)
    a, b = table(5, seed=0), table(5, seed=1)
    for cq, ck in ((a, a), (a, b), (b, a)):
        qo, ko = rope_triton.launch([(q, cq, torch.empty_like(q)), (k, ck, torch.empty_like(k))],
                                    False)  # fmt: skip
        close(qo, ref(q, cq))
        close(ko, ref(k, ck))


# -- the eager autograd.Function -----------------------------------------------------------
def _grad_ref(g, cs, pairing="half"):
    """R^T g: the rotation by -theta."""
    c = cs.clone()
    c[..., 1] = -c[..., 1]
    return ref(g, c, pairing)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_only_q_used_k_gets_zero_grad(pairing):
    rot = RotaryEmbedding(HD, pairing=pairing, max_len=64)
    q = rnd(2, 4, 5, HD).requires_grad_()
    k = rnd(2, 2, 5, HD, seed=1).requires_grad_()
    w = rnd(2, 4, 5, HD, seed=2)
    with kernels.use("triton"):
        qr, kr = rot(q, k)
    (qr * w).sum().backward()
    cs = rot.table(range(5))[:, None]
    close(q.grad, _grad_ref(w, cs, pairing))
    assert k.grad is not None and k.grad.abs().max() == 0


def test_expanded_and_transposed_grads():
    cs = table(5)
    x = rnd(2, 3, 5, HD).requires_grad_()
    with kernels.use("triton"):
        y = kernels.rotate(x, cs, "half")
    y.sum().backward(retain_graph=True)  # grad: ones expanded, all strides 0
    close(x.grad, _grad_ref(torch.ones(2, 3, 5, HD), cs))
    x.grad = None
    gt = rnd(HD, 5, 3, 2, seed=3).permute(3, 2, 1, 0)  # non-contiguous grad
    y.backward(gt)
    close(x.grad, _grad_ref(gt, cs))


def test_double_backward_is_r_v():
    cs = table(5)
    x = rnd(1, 2, 5, HD).requires_grad_()
    w = rnd(1, 2, 5, HD, seed=1).requires_grad_()
    v = rnd(1, 2, 5, HD, seed=2)
    with kernels.use("triton"):
        y = kernels.rotate(x, cs, "interleaved")
        (gx,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)  # R^T w
        close(gx, _grad_ref(w.detach(), cs, "interleaved"))
        (gw,) = torch.autograd.grad((gx * v).sum(), w)  # d/dw <R^T w, v> = R v
    close(gw, ref(v, cs, "interleaved"))


def test_a_table_that_requires_grad_gets_its_gradient(monkeypatch):
    """A learnable/transformed table: the kernel gives it no gradient, so the dispatch takes
    the expressions for it (the CUDA row put on the CPU row), and forcing the kernel is
    refused by name instead of dropping the gradient."""
    monkeypatch.setitem(kernels.TABLE, ("cpu", "autograd"), ("expr", "triton", "triton"))
    base = table(5)
    x = rnd(1, 2, 5, HD).requires_grad_()
    w = rnd(1, 2, 5, HD, seed=1)
    cs = base.clone().requires_grad_()
    (kernels.rotate(x, cs, "half") * w).sum().backward()
    c2 = base.double().clone().requires_grad_()  # float64: torch's own kernels, the reference
    (kernels.rotate(x.detach().double(), c2, "half") * w.double()).sum().backward()
    close(cs.grad, c2.grad.cpu(), atol=1e-5)
    with kernels.use("triton"), pytest.raises(ValueError, match="requires grad no gradient"):
        kernels.rotate(x, base.clone().requires_grad_(), "half")


def test_under_torch_func_grad_a_closed_over_parameter():
    """torch.func.grad active; x an ordinary requires-grad tensor (not wrapped): mode()
    says 'autograd', and a plain autograd.Function without setup_context raises under an
    active functorch transform."""
    cs = table(5)
    p = rnd(1, 2, 5, HD).requires_grad_()  # e.g. a module parameter, not an input

    def f(scale):
        return (kernels.rotate(p, cs, "half") * scale).sum()

    with kernels.use(None):  # the table picks: CPU -> expr; CUDA -> triton
        g = torch.func.grad(f)(torch.tensor(2.0, device=DEV))
    want = ref(p.detach(), cs).sum()
    close(g.reshape(()), want.reshape(()), atol=1e-5)


def test_under_torch_func_grad_forced_triton():
    cs = table(5)
    p = rnd(1, 2, 5, HD).requires_grad_()

    def f(scale):
        return (kernels.rotate(p, cs, "half") * scale).sum()

    with kernels.use("triton"):
        g = torch.func.grad(f)(torch.tensor(2.0, device=DEV))
    close(g.reshape(()), ref(p.detach(), cs).sum().reshape(()), atol=1e-5)


def test_vmap_never_reaches_the_function():
    cs = table(5)
    xs = rnd(3, 2, 5, HD).requires_grad_()
    out = torch.func.vmap(lambda x: kernels.rotate(x, cs[0], "half"))(xs)
    close(out, ref(xs.detach()[:, :, None].squeeze(2), cs[0]))


def test_inference_mode_plain():
    cs = table(5)
    with torch.inference_mode(), kernels.use("triton"):
        x = rnd(1, 2, 5, HD)
        y = kernels.rotate(x, cs, "half")
    close(y, ref(x, cs))


# -- rotate_qk's shortcuts -----------------------------------------------------------------
def test_rotate_qk_q_4d_k_3d_share_one_table():
    cs = table(5)  # (1, 1, 5, 8, 2)
    q, k = rnd(1, 4, 5, HD), rnd(2, 5, HD, seed=1)
    with torch.no_grad(), kernels.use("triton"):
        qr, kr = kernels.rotate_qk(q, k, cs, cs, "half")
    close(qr, ref(q, cs))
    close(kr, ref(k, cs[0]))


def test_rotate_qk_dtypes_differ_share_one_table():
    cs = table(5)
    q, k = rnd(1, 4, 5, HD), rnd(1, 2, 5, HD, seed=1, dtype=torch.bfloat16)
    with torch.no_grad(), kernels.use("triton"):
        qr, kr = kernels.rotate_qk(q, k, cs, cs, "half")
    close(qr, ref(q, cs))
    close(kr, ref(k, cs), atol=2e-2)


@pytest.mark.parametrize("which", ["q", "k"])
def test_rotate_qk_requires_grad_differs(which):
    rot = RotaryEmbedding(HD, max_len=64)
    q, k = rnd(2, 4, 5, HD), rnd(2, 2, 5, HD, seed=1)
    (q if which == "q" else k).requires_grad_()
    pos = torch.tensor([[4, 2, 9, 1, 0], [3, 3, 3, 7, 8]], device=DEV)
    with kernels.use("triton"):
        qr, kr = rot.encode_qk(q, k, pos, pos)
    cs = rot.table(pos)[:, None]
    close(qr, ref(q.detach(), cs))
    close(kr, ref(k.detach(), cs))
    t = q if which == "q" else k
    w = rnd(*t.shape, seed=5)
    ((qr if which == "q" else kr) * w).sum().backward()
    close(t.grad, _grad_ref(w, cs))


def test_rotate_qk_tensor_positions_shared_table_plain_and_grad():
    rot = RotaryEmbedding(HD, pairing="interleaved", max_len=64)
    pos = torch.tensor([[4, 2, 9, 1, 0], [3, 3, 3, 7, 8]], device=DEV)
    for grad in (False, True):
        q = rnd(2, 4, 5, HD).requires_grad_(grad)
        k = rnd(2, 2, 5, HD, seed=1).requires_grad_(grad)
        with kernels.use("triton"):
            qr, kr = rot.encode_qk(q, k, pos, pos)
        cs = rot.table(pos)[:, None]
        close(qr, ref(q.detach(), cs, "interleaved"))
        close(kr, ref(k.detach(), cs, "interleaved"))


def test_function_called_directly_with_two_tensors_of_one_table():
    cs = table(5)
    q = rnd(1, 4, 5, HD).requires_grad_()
    k = rnd(1, 2, 5, HD, seed=1).requires_grad_()
    qr, kr = rope_triton_ops.rotate((q, k), (cs, cs), False)
    torch.autograd.backward((qr, kr), (torch.ones_like(qr), rnd(1, 2, 5, HD, seed=4)))
    close(q.grad, _grad_ref(torch.ones(1, 4, 5, HD), cs))
    close(k.grad, _grad_ref(rnd(1, 2, 5, HD, seed=4), cs))


def test_under_torch_func_grad_default_dispatch_as_on_cuda(monkeypatch):
    """The CUDA row of TABLE ('autograd' -> triton), put on the CPU row so the interpreter
    shows what a CUDA call with impl=None does under torch.func.grad."""
    monkeypatch.setitem(kernels.TABLE, ("cpu", "autograd"), ("expr", "triton", "triton"))
    cs = table(5)
    p = rnd(1, 2, 5, HD).requires_grad_()

    def f(scale):
        return (kernels.rotate(p, cs, "half") * scale).sum()

    g = torch.func.grad(f)(torch.tensor(2.0, device=DEV))
    close(g.reshape(()), ref(p.detach(), cs).sum().reshape(()), atol=1e-5)


def test_forward_ad_dual_tensor_keeps_its_tangent(monkeypatch):
    import torch.autograd.forward_ad as fwAD

    monkeypatch.setitem(kernels.TABLE, ("cpu", "plain"), ("eager", "triton", "triton"))
    cs = table(5)
    x, t = rnd(1, 2, 5, HD), rnd(1, 2, 5, HD, seed=1)
    with fwAD.dual_level():
        y = kernels.rotate(fwAD.make_dual(x, t), cs, "half")
        tangent = fwAD.unpack_dual(y).tangent
        with kernels.use("triton"), pytest.raises(ValueError, match="no torch.func"):
            kernels.rotate(fwAD.make_dual(x, t), cs, "half")  # refused, not dropped
    assert tangent is not None
    close(tangent, ref(t, cs))


def test_make_fx_records_the_rotation():
    """make_fx (real tensors, grad on, x requires grad): is_compiling() is False, so mode()
    says 'autograd' and the plain Function runs; the old custom op was recorded as an op."""
    from torch.fx.experimental.proxy_tensor import make_fx

    cs = table(5)
    x = rnd(1, 2, 5, HD).requires_grad_()
    with kernels.use("triton"):
        g = make_fx(lambda t: kernels.rotate(t, cs, "half"))(x)
    close(g(x).detach(), ref(x.detach(), cs))


@pytest.mark.parametrize("dims", [2, 3])
def test_function_on_fewer_dims(dims):
    cs = table(5)[0, 0]  # (5, 8, 2)
    x = rnd(*(2, 5, HD)[3 - dims :]).requires_grad_()
    w = rnd(*x.shape, seed=1)
    with kernels.use("triton"):
        y = kernels.rotate(x, cs, "interleaved")
    close(y, ref(x.detach(), cs, "interleaved"))
    (y * w).sum().backward()
    close(x.grad, _grad_ref(w, cs, "interleaved"))


def test_q_is_k_under_grad():
    rot = RotaryEmbedding(HD, max_len=64)
    q = rnd(2, 2, 5, HD).requires_grad_()
    w1, w2 = rnd(2, 2, 5, HD, seed=1), rnd(2, 2, 5, HD, seed=2)
    with kernels.use("triton"):
        a, b = rot(q, q)
    (a * w1 + b * w2).sum().backward()
    cs = rot.table(range(5))[:, None]
    close(q.grad, _grad_ref(w1 + w2, cs))


def test_threads_share_the_cache_through_its_clearing(monkeypatch):
    import threading

    monkeypatch.setattr(rope_triton, "_PREPARED", {("filler", i): None for i in range(510)})
    lock, kernel = threading.Lock(), rope_triton._rope_fwd

    class Serial:  # the interpreter is not thread-safe; the cache is what is under test
        def __getitem__(self, grid):
            def run(*a, **kw):
                with lock:
                    return kernel[grid](*a, **kw)

            return run

    monkeypatch.setattr(rope_triton, "_rope_fwd", Serial())
    errors = []

    def work(seq):
        try:
            for rep in range(3):
                x, cs = rnd(1, 2, seq, HD, seed=rep), table(seq, seed=rep)
                close(launch1(x, cs), ref(x, cs))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (3, 4, 5, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
