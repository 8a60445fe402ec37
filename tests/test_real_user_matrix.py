"""One real-user matrix for every encoding of posenc.torch, grid ones included.

Each encoding in ``MATRIX`` goes through the paths users take: pickled into another
process, built on meta inside a user's own ``nn.Module`` and loaded with ``assign=True``,
``deepcopy``, ``.half()`` / ``.to(bfloat16)``, ``vmap`` over positions, ``torch.compile
(fullgraph=True)`` with in-range and out-of-range positions, ``StaticKVCache`` decoding
against the full forward, and ``torch.export``. A new encoding joins by being listed in
``MATRIX`` (a test checks that every encoding class of posenc.torch is).

The expected values are independent of the path under test: the same module called in
eager float64 (or float32 for the 16-bit casts), a loop instead of ``vmap``, the full
forward instead of cached decoding.
"""

from __future__ import annotations

import copy
import functools
import inspect
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import posenc.torch as pt
from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    AxialRotaryEmbedding,
    ChannelSlice,
    LearnedEncoding,
    MRoPE,
    NoPE,
    PoPE,
    QueryTemperature,
    RotaryEmbedding,
    SinusoidalEncoding,
    SinusoidalEncoding2D,
    SoftmaxFactor,
    T5RelativeBias,
    TransformerLM,
    XPos,
)

S, D, H, HD = 6, 16, 2, 8  # tokens, model width, heads, head width


@dataclass(frozen=True)
class Case:
    make: object  # () -> module
    kind: str  # "input", "qk" or "scores"
    axes: int = 1  # coordinates per token
    limit: int | None = 32  # max_len, or None: no table (out of range = negative)
    message: str = "must be < max_len=32"


MATRIX = {
    "nope": Case(NoPE, "input", limit=None, message=""),
    "sinusoidal": Case(lambda: SinusoidalEncoding(D, max_len=32), "input"),
    "learned": Case(lambda: LearnedEncoding(32, D), "input"),
    "sincos_2d": Case(lambda: SinusoidalEncoding2D(D, max_len=32), "input", axes=2),
    "rope": Case(lambda: RotaryEmbedding(HD, max_len=32), "qk"),
    "xpos": Case(lambda: XPos(HD, max_len=32), "qk"),
    "pope": Case(lambda: PoPE(HD, H, delta_init="uniform"), "qk", limit=None,
                 message="must be non-negative"),
    "axial": Case(lambda: AxialRotaryEmbedding(HD, max_len=32), "qk", axes=2),
    "mrope": Case(lambda: MRoPE(HD, sections=(2, 1, 1), max_len=32), "qk", axes=3),
    "alibi": Case(lambda: ALiBi(H), "scores", limit=None, message="must be non-negative"),
    "t5": Case(lambda: T5RelativeBias(H, num_buckets=8, max_distance=16), "scores",
               limit=None, message="must be non-negative"),
    "kerple": Case(lambda: KERPLE(H, variant="power"), "scores", limit=None,
                   message="must be non-negative"),
    "fire": Case(lambda: FIRE(H, hidden=4), "scores", limit=None,
                 message="must be non-negative"),
    "channel_slice": Case(lambda: ChannelSlice(RotaryEmbedding(4, max_len=32), start=4), "qk"),
    "temperature": Case(lambda: QueryTemperature(RotaryEmbedding(HD, max_len=32), scale=0.5,
                                                 floor=3, shift=1), "qk"),
    "softmax_factor": Case(lambda: SoftmaxFactor(KERPLE(H, variant="power"), factor=1.5),
                           "scores", limit=None, message="must be non-negative"),
}  # fmt: skip
NAMES = list(MATRIX)


def _make(name, seed=0):
    torch.manual_seed(seed)
    enc = MATRIX[name].make()
    for p in enc.parameters():  # away from their init, so a dropped load would show
        p.data.add_(0.01 * torch.randn_like(p))
    return enc


@functools.cache
def _inputs(dtype=torch.float64):  # drawn once: calls under vmap may not draw
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, S, D, generator=g, dtype=torch.float64).to(dtype)
    q = torch.randn(2, H, S, HD, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 1, S, HD, generator=g, dtype=torch.float64).to(dtype)
    return x, q, k


def _positions(name, start=3):
    p = torch.arange(start, start + S).expand(2, S)  # (batch, seq)
    axes = MATRIX[name].axes
    if axes == 1:
        return p.clone()
    steps = torch.stack([p + a for a in range(axes)], -1)  # (batch, seq, axes), distinct
    return steps.contiguous()


def _bad(name):
    p = _positions(name)
    limit = MATRIX[name].limit
    return p + (limit - p.max()) if limit else p - 4  # the first value past the table, or < 0


def _call(enc, name, positions, dtype=torch.float64, inputs=None):
    """What the encoding computes at ``positions``: one tensor (its hooks, as users call)."""
    x, q, k = _inputs(dtype) if inputs is None else inputs
    kind = MATRIX[name].kind
    if kind == "input":
        return enc(x, positions)
    if kind == "qk":
        qo, ko = enc(q, k, positions)
        return torch.cat([qo.flatten(), ko.flatten()])
    return enc(positions, positions)  # (batch, heads, seq, seq)


def _want(name, enc=None, positions=None):
    enc = _make(name).double() if enc is None else enc
    return _call(enc, name, _positions(name) if positions is None else positions)


def test_every_encoding_of_posenc_torch_is_in_the_matrix():
    classes = {
        obj
        for _, obj in inspect.getmembers(pt, inspect.isclass)
        if issubclass(obj, pt.PositionalEncoding) and obj is not pt.PositionalEncoding
    }
    listed = {type(case.make()) for case in MATRIX.values()}
    assert classes - listed == set()


# -- pickle into another process -----------------------------------------------------------------

RUN_PICKLED = """
    import pickle, sys, torch
    sys.path.insert(0, sys.argv[2])
    import test_real_user_matrix as m
    encs = pickle.loads(open(sys.argv[1], "rb").read())
    outs = {n: m._call(e, n, m._positions(n)) for n, e in encs.items()}
    open(sys.argv[1], "wb").write(pickle.dumps(outs))
"""


@pytest.fixture(scope="module")
def pickled_results(tmp_path_factory):
    path = tmp_path_factory.mktemp("pickled") / "encodings.pkl"
    path.write_bytes(pickle.dumps({n: _make(n).double() for n in NAMES}))
    here = str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN_PICKLED), str(path), here],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return pickle.loads(path.read_bytes())


@pytest.mark.parametrize("name", NAMES)
def test_pickled_into_another_process_computes_the_same(name, pickled_results):
    torch.testing.assert_close(pickled_results[name], _want(name), rtol=0, atol=0)


# -- meta construction, assign=True, inside a user's own module ---------------------------------


class _UserModel(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.enc = _make(name)


@pytest.mark.parametrize("name", NAMES)
def test_meta_built_in_a_users_module_then_loaded_with_assign_is_exact(name):
    ref = _UserModel(name)  # float32, as built: the loaded one must match it exactly
    with torch.device("meta"):
        user = _UserModel(name)
    user.load_state_dict(ref.state_dict(), assign=True)
    got = _call(user.enc, name, _positions(name))
    torch.testing.assert_close(got, _want(name, ref.enc), rtol=0, atol=0)
    assert not any(b.is_meta for b in user.buffers())  # derived tables built, not left meta


@pytest.mark.parametrize("name", NAMES)
def test_deepcopy_computes_the_same_and_shares_nothing(name):
    enc = _make(name).double()
    twin = copy.deepcopy(enc)
    torch.testing.assert_close(_want(name, twin), _want(name, enc), rtol=0, atol=0)
    mine = {id(t) for t in [*enc.parameters(), *enc.buffers()]}
    assert not mine & {id(t) for t in [*twin.parameters(), *twin.buffers()]}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_half_and_bfloat16_round_once_from_the_float32_result(name, dtype):
    enc = _make(name)
    want = _call(enc, name, _positions(name), torch.float32)  # float32 module and inputs
    low = copy.deepcopy(enc).to(dtype) if dtype == torch.bfloat16 else copy.deepcopy(enc).half()
    got = _call(low, name, _positions(name), dtype).float()
    # the inputs were rounded to dtype, so the result differs by a few of its ulps only
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, rtol=8 * eps, atol=8 * eps * want.abs().max().item())


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_positions_equals_a_loop(name):
    enc = _make(name).double()
    inputs = _inputs()  # drawn outside: vmap refuses random draws (the first call draws)
    rows = torch.stack([_positions(name, s)[:1] for s in (0, 3, 7)])  # (3, 1, seq[, axes])
    got = torch.func.vmap(lambda p: _call(enc, name, p, inputs=inputs))(rows)
    want = torch.stack([_call(enc, name, p, inputs=inputs) for p in rows])
    # vmap takes the tensor-expression path, the loop the eager kernels: float64 rounding
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-14)
    if MATRIX[name].message:  # and out of range, under vmap, the same error
        with pytest.raises(ValueError, match=MATRIX[name].message):
            bad = torch.stack([rows[0], _bad(name)[:1]])
            torch.func.vmap(lambda p: _call(enc, name, p, inputs=inputs))(bad)


@pytest.mark.compile
@pytest.mark.parametrize("name", NAMES)
def test_compiled_fullgraph_equals_eager_and_refuses_out_of_range(name):
    torch._dynamo.reset()
    enc = _make(name).double()
    inputs = _inputs()  # drawn outside: the compiled function only reads them
    fn = torch.compile(lambda p: _call(enc, name, p, inputs=inputs), fullgraph=True)
    torch.testing.assert_close(fn(_positions(name)), _want(name, enc), rtol=1e-12, atol=1e-12)
    if MATRIX[name].message:  # posenc's ValueError, not an index error or a wrapped row
        with pytest.raises(ValueError, match=MATRIX[name].message):
            fn(_bad(name))


@pytest.mark.parametrize("name", NAMES)
def test_static_cache_decoding_equals_the_full_forward(name):
    torch.manual_seed(2)
    enc = _make(name)
    heads = H if MATRIX[name].kind != "qk" or name == "pope" else D // HD
    lm = TransformerLM(11, D, 2, heads, encoding=enc, max_len=32).double().eval()
    idx = torch.randint(0, 11, (2, S + 3), generator=torch.Generator().manual_seed(3))
    pos = _positions(name, 0)
    pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, 4).view(1, 3, *[1] * (pos.dim() - 2))], 1)
    with torch.no_grad():
        full = lm(idx, pos)
        cache = lm.new_cache(2, S + 3, static=True)
        steps = [lm(idx[:, :S], pos[:, :S], cache=cache)]
        steps += [lm(idx[:, i : i + 1], pos[:, i : i + 1], cache=cache) for i in range(S, S + 3)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)


class _Exported(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name, self.enc = name, _make(name).double()
        for label, t in zip("xqk", _inputs(), strict=True):
            self.register_buffer(label, t)

    def forward(self, positions):
        return _call(self.enc, self.name, positions, inputs=(self.x, self.q, self.k))


@pytest.mark.compile
@pytest.mark.parametrize("name", NAMES)
def test_torch_export_runs_and_equals_eager(name):
    module = _Exported(name)
    exported = torch.export.export(module, (_positions(name),))
    got = exported.module()(_positions(name, 5))  # other values, same shape
    want = _want(name, module.enc, _positions(name, 5))  # eager: its kernels, not expressions
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
