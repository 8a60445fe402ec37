"""Review: the compiled test of tests/test_rope_triton.py after an eager call of the same
layout (test_forward_matches_numpy[interleaved-float32-None-False-new]): does the compiled
forward reuse that prepared entry, and are the gradients still right?"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")
if not __import__("torch").cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from posenc.torch import RotaryEmbedding, kernels  # noqa: E402
from posenc.torch.kernels import rope_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HD = 16


def _qk(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, h, 9, HD, generator=g, dtype=torch.float64) for h in (4, 2))
    return q.to(DEV, torch.float32), k.to(DEV, torch.float32)


@pytest.mark.compile
def test_compiled_after_an_eager_call_of_the_same_layout(monkeypatch):
    keys = []
    key = rope_triton._key
    monkeypatch.setattr(rope_triton, "_key", lambda *a: keys.append(key(*a)) or keys[-1])
    rot0 = RotaryEmbedding(HD, pairing="interleaved", max_len=64)
    q, k = _qk()
    with torch.no_grad(), kernels.use("triton"):
        rot0.encode_qk(q, k, range(40, 49), range(40, 49))  # the earlier test's layout
    eager_key = keys[-1]

    rot = RotaryEmbedding(HD, pairing="interleaved", max_len=64)

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
    print("eager key", eager_key)
    print("compiled keys", keys[1:])
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert eager_key in keys[1:]  # the compiled forward reused the eager call's entry
