"""The FlexAttention branch of the attention core, run eagerly: ``flex_attention_compiled`` is
replaced by torch's eager ``flex_attention`` (it materialises the scores; the same numbers,
no compile), so these tests are not compile-marked and mutation testing sees this code.
Reference: a float64 softmax with the ALiBi bias written out (slopes from ``posenc``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from expect import raises_exactly
from torch.nn.attention.flex_attention import flex_attention

import posenc
from posenc.torch import ALiBi, attend
from posenc.torch.attention import core as core_mod
from posenc.torch.attention import run as run_mod

HEADS, SEQ, HD = 2, 5, 4
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture(autouse=True)
def _eager_flex(monkeypatch):
    monkeypatch.setattr(run_mod, "flex_attention_compiled", lambda device_type: flex_attention)


def _qkv(dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(0)
    t = [torch.randn(1, HEADS, SEQ, HD, generator=g, dtype=torch.float64) for _ in range(3)]
    return [x.to(dtype).requires_grad_(grad) for x in t]


def _reference(q, k, v):
    """Causal ALiBi attention in float64, the queries at the last key positions:
    softmax(q k^T / sqrt(d) - slope * (i - j), j <= i) v."""
    slopes = torch.from_numpy(posenc.alibi_slopes(HEADS))[:, None, None]  # (heads, 1, 1)
    i = torch.arange(k.shape[-2] - q.shape[-2], k.shape[-2])  # query positions (sq,)
    j = torch.arange(k.shape[-2])  # key positions (sk,)
    dist = (i[:, None] - j[None]).double()  # (sq, sk): query - key
    scores = q.double() @ k.double().transpose(-1, -2) / HD**0.5 - slopes * dist
    scores = scores.masked_fill(j[None] > i[:, None], float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


def test_flex_matches_the_float64_reference_and_keeps_the_dtype():
    q, k, v = _qkv()
    with torch.no_grad():
        got = attend(q, k, v, ALiBi(HEADS), backend="flex")
    assert got.dtype == torch.float32 and got.shape == (1, HEADS, SEQ, HD)
    torch.testing.assert_close(got.double(), _reference(q, k, v), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_run_in_float32_on_the_cpu_and_are_rounded_once(dtype):
    q, k, v = _qkv(dtype)
    with torch.no_grad():
        got = attend(q, k, v, ALiBi(HEADS), backend="flex")
        in_float32 = attend(q.float(), k.float(), v.float(), ALiBi(HEADS), backend="flex")
    assert got.dtype == dtype
    torch.testing.assert_close(got, in_float32.to(dtype), rtol=0, atol=0)


def test_training_through_flex_on_the_cpu_is_refused_but_inference_is_not():
    q, k, v = _qkv(grad=True)
    message = (
        "backend='flex' has no backward on the CPU (torch 2.13): use backend='sdpa' "
        "to train, or run under torch.no_grad()"
    )
    for grad in ((q, k, v), (q.detach(), k, v.detach()), (q.detach(), k.detach(), v)):
        with raises_exactly(message):
            attend(*grad, ALiBi(HEADS), backend="flex")
    with torch.no_grad():  # the same tensors, no graph recorded: allowed
        got = attend(q, k, v, ALiBi(HEADS), backend="flex")
    torch.testing.assert_close(got.double(), _reference(q, k, v).detach(), rtol=0, atol=1e-5)
    got = attend(*(t.detach() for t in (q, k, v)), ALiBi(HEADS), backend="flex")  # no grad
    assert np.isfinite(got.numpy()).all()


def test_inside_a_traced_call_the_kernel_is_called_directly(monkeypatch):
    q, k, v = _qkv(torch.bfloat16)
    with torch.no_grad():
        want = attend(q, k, v, ALiBi(HEADS), backend="flex")  # eager first (mutmut's stats)
    calls = []
    counted = lambda *a, **kw: calls.append(a) or flex_attention(*a, **kw)  # noqa: E731
    monkeypatch.setattr(run_mod, "flex_attention_compiled", lambda d: counted)
    step = core_mod.plan(ALiBi(HEADS), range(SEQ), range(SEQ), causal=True, key_valid=None,
                              heads=HEADS, backend="flex", dtype=q.dtype, device=None)  # fmt: skip
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        got = core_mod._run(q, k, v, step, HD**-0.5)
    assert len(calls) == 1 and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_eager_calls_allow_64_recompiles_inside_the_kernel_call_only(monkeypatch):
    # each new shape or score_mod compiles once: dynamo's default limit (8) is raised to 64
    # for this call alone
    limits = []

    def counted(*args, **kwargs):
        limits.append(torch._dynamo.config.recompile_limit)
        return flex_attention(*args, **kwargs)

    monkeypatch.setattr(run_mod, "flex_attention_compiled", lambda d: counted)
    before = torch._dynamo.config.recompile_limit
    q, k, v = _qkv()
    with torch.no_grad():
        attend(q, k, v, ALiBi(HEADS), backend="flex")
    assert limits == [64] and torch._dynamo.config.recompile_limit == before


def test_fewer_queries_than_keys_are_the_last_positions():
    q, k, v = _qkv()
    with torch.no_grad():
        got = attend(q[:, :, -2:], k, v, ALiBi(HEADS), backend="flex")  # queries 3, 4 of 0..4
    torch.testing.assert_close(got.double(), _reference(q[:, :, -2:], k, v), rtol=0, atol=1e-5)
