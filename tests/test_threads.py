"""Modules shared by threads: derived tables are values, never shared mutable state.

16 threads share one RoPE and one M-RoPE module and reach new positions in random order
(RoPE's table grows on demand, so concurrent first uses race to grow it): every result
equals the single-threaded one exactly, and the table ends no longer than the doubling
rule asks for the largest position used (never past ``max_len``). ``kernels.use`` is per
thread too.
"""

from __future__ import annotations

import random
import sys
import threading

import torch

from posenc.torch import MRoPE, RotaryEmbedding, kernels
from posenc.torch.encodings.qk.rope_tables import rows_to_build

THREADS = 16


def _run_threads(fn, n=THREADS):
    """Start ``n`` threads on ``fn(i)`` together; re-raise the first error."""
    errors, start = [], threading.Barrier(n)

    def work(i):
        try:
            start.wait()
            fn(i)
        except BaseException as err:  # noqa: BLE001  (handed to the test)
            errors.append(err)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as Python allows
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    if errors:
        raise errors[0]


def _windows(seed, n_windows, top, width):
    rng = random.Random(seed)
    return [rng.randrange(0, top - width) for _ in range(n_windows)]


def test_sixteen_threads_growing_one_rope_table_agree_with_one_thread():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 8, 16)
    k = torch.randn(1, 1, 8, 16)
    starts = [_windows(i, 6, 60_000, 8) for i in range(THREADS)]  # past the first 4096 rows

    shared = RotaryEmbedding(16, max_len=60_000)
    got = {}

    def work(i):
        for s in starts[i]:
            got[i, s] = shared(q, k, range(s, s + 8))

    _run_threads(work)
    alone = RotaryEmbedding(16, max_len=60_000)
    for (i, s), (qr, kr) in got.items():
        want_q, want_k = alone(q, k, range(s, s + 8))
        assert torch.equal(qr, want_q) and torch.equal(kr, want_k), (i, s)
    last = max(s + 7 for row in starts for s in row)
    rows = shared.cos_sin.shape[0]
    assert last < rows <= max(rows_to_build(4096, last, 60_000), 2 * (last + 1))
    assert rows <= 60_000
    fresh = RotaryEmbedding(16, max_len=60_000).table(range(rows))  # every row where it belongs
    assert torch.equal(shared.cos_sin, fresh[0])


def test_sixteen_threads_sharing_one_mrope_agree_with_one_thread():
    torch.manual_seed(1)
    mrope = MRoPE(12, sections=(2, 2, 2), max_len=512)
    q = torch.randn(2, 2, 6, 12)
    coords = {
        i: torch.randint(0, 512, (2, 6, 3), generator=torch.Generator().manual_seed(i))
        for i in range(THREADS)
    }
    got = {}
    _run_threads(lambda i: got.__setitem__(i, mrope(q, q, coords[i])))
    for i, (qr, kr) in got.items():
        want_q, want_k = mrope(q, q, coords[i])
        assert torch.equal(qr, want_q) and torch.equal(kr, want_k)


def test_a_forced_kernel_stays_in_its_own_thread():
    x = torch.ones(1, 1, 2, 4)
    seen, inside, done = {}, threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["other"] = kernels.choose(x)  # while the main thread forces "expr"
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with kernels.use("expr"):
        inside.set()
        done.wait()
        seen["main"] = kernels.choose(x)
    t.join()
    assert seen == {"main": "expr", "other": "eager"}
