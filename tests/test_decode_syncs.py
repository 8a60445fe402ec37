"""A decode step reads nothing back from the device: no host sync, so CUDA graphs can replay it.

Counted on the CPU with ``torch.profiler`` (``aten::_local_scalar_dense`` is what
``.item()``, ``int(t)`` and ``bool(t)`` run; on CUDA each waits for the GPU) and by counting
:func:`posenc.torch.position_values.host_read`, the one place posenc reads values (its
``.tolist()`` does not show in the profiler). A depth-4 ``TransformerLM`` (depth 2 when
compiled) with ``new_cache(static=True)``, after a prefill:

* eager: no ``_local_scalar_dense`` and at most one host read per step (not per layer) --
  none at all, as the count, positions and their bounds are known on the host;
* compiled (``fullgraph=True``): no ``_local_scalar_dense``, and host reads only inside
  the checking op's CPU branch (a CPU tensor: nothing to wait for; on CUDA the op asserts
  on the device instead, which ``tools/gpu_checks.py`` runs with CUDA's sync debug mode).
"""

from __future__ import annotations

import re
import sys

import pytest
import torch
from test_real_user_matrix import MATRIX, NAMES, _make
from torch.profiler import profile

import posenc.torch.position_values as pv
from posenc.scaling import DynamicNTK
from posenc.torch import RotaryEmbedding, TransformerLM

D, HEADS = 16, 2


def _lm(name, depth=4):
    heads = HEADS if MATRIX[name].kind != "qk" or name == "pope" else 2
    return TransformerLM(11, D, depth, heads, encoding=_make(name), max_len=32).eval()


def _counted(monkeypatch):
    """Every host read, with the function that asked for it."""
    reads, real = [], pv.host_read

    def host_read(t):
        name = sys._getframe(1).f_code.co_name
        # under mutation testing the caller is mutmut's copy: x_bounds__mutmut_orig
        reads.append(re.sub(r"^x_|__mutmut_\w+$", "", name))
        return real(t)

    monkeypatch.setattr(pv, "host_read", host_read)
    return reads


def _step(lm, step, monkeypatch):
    """Prefill and two decode steps through ``step``; count the syncs of a third."""
    cache = lm.new_cache(2, 16, static=True)
    with torch.no_grad():
        logits = step(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=cache)
        for _ in range(2):
            logits = step(logits[:, -1:].argmax(-1), cache=cache)
        reads = _counted(monkeypatch)
        with profile() as prof:
            step(logits[:, -1:].argmax(-1), cache=cache)
    return _dense(prof), reads


def _dense(prof):
    """How often the profiled code ran ``aten::_local_scalar_dense`` (a read the host waits on)."""
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


def _decode_reads_nothing(lm, cache, monkeypatch, **prefill):
    """Prefill two rows as ``prefill`` says, then three decode steps: none reads anything back."""
    with torch.no_grad():
        logits = lm(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=cache, **prefill)
        reads = _counted(monkeypatch)
        for _ in range(3):
            with profile() as prof:
                logits = lm(logits[:, -1:].argmax(-1), cache=cache)
            assert _dense(prof) == 0 and reads == [], reads


@pytest.mark.parametrize("name", NAMES)
def test_an_eager_decode_step_reads_nothing_back(name, monkeypatch):
    lm = _lm(name)
    dense, reads = _step(lm, lm, monkeypatch)
    assert dense == 0 and len(reads) <= 1, reads
    assert reads == []  # the count and every position's bounds are known on the host


def test_the_counting_sees_a_read(monkeypatch):
    # the same step after something forgot what the host knew: the count is read, once
    lm = _lm("rope")
    cache = lm.new_cache(2, 16, static=True)
    with torch.no_grad():
        lm(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=cache)
        cache.filled.add_(0)  # an in-place change: its remembered value is forgotten
        reads = _counted(monkeypatch)
        lm(torch.tensor([[7], [8]]), cache=cache)
    assert reads == ["bounds"]


def test_a_reset_static_cache_knows_its_count_on_the_host(monkeypatch):
    lm = _lm("rope")
    cache = lm.new_cache(2, 16, static=True)
    with torch.no_grad():
        lm(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=cache)
        cache.reset()
        reads = _counted(monkeypatch)
        assert len(cache) == 0 and reads == []  # zeroed in place: its value is known
        _decode_reads_nothing(lm, cache, monkeypatch)


_PREFILLS = {  # how the prompt was given: the decode steps after it still read nothing
    "positions": {"positions": torch.tensor([[0, 1, 2], [4, 5, 6]])},
    "range": {"positions": range(2, 5)},
    "padding": {"padding_mask": torch.tensor([[False, True, True], [True, True, True]])},
    "documents": {"documents": torch.tensor([[0, 0, 1], [0, 1, 1]])},
}


@pytest.mark.parametrize("static", [False, True], ids=["KVCache", "StaticKVCache"])
@pytest.mark.parametrize("prefill", list(_PREFILLS))
@pytest.mark.parametrize("name", ["rope", "alibi", "mrope"])
def test_decode_steps_after_any_prefill_read_nothing_back(name, prefill, static, monkeypatch):
    if static and prefill == "documents":
        pytest.skip("a StaticKVCache refuses documents")
    lm = _lm(name)
    _decode_reads_nothing(lm, lm.new_cache(2, 16, static=static), monkeypatch, **_PREFILLS[prefill])


@pytest.mark.parametrize("static", [False, True], ids=["KVCache", "StaticKVCache"])
def test_a_length_dependent_scaling_decodes_without_reading_back(static, monkeypatch):
    # dynamic NTK's rates follow the length (largest key position + 1): known on the host
    enc = RotaryEmbedding(D // HEADS, scaling=DynamicNTK(2.0, 4), max_len=32)
    lm = TransformerLM(11, D, 4, HEADS, encoding=enc, max_len=32).eval()
    # the three steps reach lengths 4, 5, 6: past the original 4
    _decode_reads_nothing(lm, lm.new_cache(2, 16, static=static), monkeypatch)


def test_a_length_dependent_table_over_a_range_reads_nothing_back(monkeypatch):
    # the length of a range is known on the host: the table op is told it, not left to read
    rope = RotaryEmbedding(8, scaling=DynamicNTK(2.0, 4), max_len=32)
    q = torch.randn(1, 1, 10, 8)
    reads = _counted(monkeypatch)
    with profile() as prof:
        rope(q, q)
        rope.table(range(3), length_from=range(10))
    assert _dense(prof) == 0 and reads == [], reads


@pytest.mark.compile
@pytest.mark.parametrize("name", ["rope", "alibi", "mrope", "sinusoidal", "pope"])
def test_a_compiled_decode_step_reads_nothing_but_in_the_checking_op(name, monkeypatch):
    torch._dynamo.reset()
    lm = _lm(name, depth=2)  # two layers (the second reads what the first was given): each
    # layer adds to inductor's code, seconds of C++ compiling per encoding on a cold cache
    dense, reads = _step(lm, torch.compile(lm, fullgraph=True), monkeypatch)
    assert dense == 0
    assert set(reads) <= {"checked_positions"}  # its CPU branch; on CUDA a device assert
