"""Test-suite hooks that only act under ``nox -s mutation`` (mutmut).

mutmut wraps every library function in a trampoline. While it maps tests to functions
(``MUTANT_UNDER_TEST=stats``) the trampoline keeps a ``ContextVar`` call stack and a hit
table, which TorchDynamo cannot trace; eager FlexAttention traces each ``score_mod`` with
Dynamo, so the eager flex tests would fail in that pass alone. Here that bookkeeping steps
aside while Dynamo traces (the hits inside a traced ``score_mod`` go unrecorded; every
mutant run itself is unaffected). Outside mutmut this file does nothing.
"""

from __future__ import annotations

import os

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
