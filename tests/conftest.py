"""Test-suite hooks: the pytest-xdist workers of ``nox -s tests``, and mutmut's mapping pass.

Under ``nox -s mutation``: mutmut wraps every library function in a trampoline. While it
maps tests to functions (``MUTANT_UNDER_TEST=stats``) the trampoline keeps a ``ContextVar``
call stack and a hit table, which TorchDynamo cannot trace; eager FlexAttention traces each
``score_mod`` with Dynamo, so the eager flex tests would fail in that pass alone. Here that
bookkeeping steps aside while Dynamo traces (the hits inside a traced ``score_mod`` go
unrecorded; every mutant run itself is unaffected). Outside mutmut that part does nothing.
"""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # nox -s tests: two worker processes, two cores
    # One intra-op thread per worker (two workers of two threads would oversubscribe the
    # cores), and inductor compiles C++ in the worker itself rather than starting a pool of
    # compile subprocesses in each worker. Neither changes what a test computes.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch
    import torch._inductor.config

    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1

if os.environ.get("MUTANT_UNDER_TEST") == "stats":  # pragma: no cover - mutmut only
    import torch
    from mutmut.mutation import trampoline

    _stack, _hit = trampoline.MutmutCallStack, trampoline.record_trampoline_hit

    class _TraceableStack:
        @staticmethod
        def get():
            return (None, 0) if torch.compiler.is_compiling() else _stack.get()

        @staticmethod
        def set(value):
            return None if torch.compiler.is_compiling() else _stack.set(value)

        @staticmethod
        def reset(token):
            if token is not None and not torch.compiler.is_compiling():
                _stack.reset(token)

    def _traceable_hit(name, caller=None):
        if not torch.compiler.is_compiling():
            _hit(name, caller=caller)

    trampoline.MutmutCallStack = _TraceableStack
    trampoline.record_trampoline_hit = _traceable_hit


import pytest  # noqa: E402


@pytest.fixture
def no_kept_masks(monkeypatch):
    """The per-thread workspace path of score-bias masks, as tensor positions and large
    masks take it: step masks over ranges are not kept (posenc.torch.attention.reuse)."""
    from posenc.torch.attention import reuse

    monkeypatch.setattr(reuse, "MAX_ELEMENTS", 0)


# Under pytest-xdist (nox -s tests: two workers, --dist loadfile) the files go to the
# workers in the order collected. These compile the most graphs (tens of seconds to minutes
# each on a cold inductor cache, as on a fresh clone): they go first, longest first, so
# that no worker is left running one alone at the end. Any order within a file is kept.
HEAVY_FIRST = [
    "test_static_cache.py",
    "test_limits_by_position.py",
    "test_flex_host.py",
    "test_score_bias.py",
    "test_decode_syncs.py",
    "test_kv_cache.py",
    "test_real_user_matrix.py",
    "test_documents.py",
    "test_rotary_nd_torch.py",
    "test_composable.py",
    "test_schedule.py",
    "test_flex_paths.py",
    "test_hook_checks.py",
    "test_edge_cases.py",
    "test_rope_triton.py",
    "test_from_hf_mrope.py",
    "test_real_user_paths.py",
    "test_bad_inputs.py",
    "test_attend_limits.py",
    "test_atlas.py",
    "test_context_parallel.py",
]


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None):  # the xdist controller: keep our order
        config.option.loadscopereorder = False  # (not xdist's: files with most tests first)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker collects; all in one order
        rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable sort
