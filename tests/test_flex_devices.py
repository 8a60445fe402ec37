"""The flex planner's devices and compile settings, checked without torch.compile.

* ``flex_attention_compiled`` asks ``torch.compile`` for static shapes (``dynamic=False``)
  on every device, once per device type (``torch.compile`` is replaced by a recorder:
  nothing is compiled);
* a block mask lives on the device it is asked for (``"meta"`` stands in for a second
  device on a CPU-only machine), the causal mask cache keeps one mask per device, and
  ``device=None`` means the CPU even under another default device;
* a 0-d tensor ``q_start`` is used as given (no copy-construct warning), and the mask it
  makes hides the keys after each query's slot.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from posenc.torch import ALiBi
from posenc.torch.attention import flex as _flex


def _recorded_compile(monkeypatch):
    calls = []

    def fake_compile(fn, **kwargs):
        calls.append(kwargs)
        return ("compiled", fn, kwargs)

    monkeypatch.setattr(_flex, "_FLEX", {})
    monkeypatch.setattr(torch, "compile", fake_compile)
    return calls


def test_cpu_kernel_is_compiled_with_static_shapes(monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention

    calls = _recorded_compile(monkeypatch)
    got = _flex.flex_attention_compiled("cpu")
    assert got == ("compiled", flex_attention, {"dynamic": False})
    assert _flex.flex_attention_compiled() is got  # the default is the CPU's, made once
    assert calls == [{"dynamic": False}]


@pytest.mark.parametrize("device_type", ["cuda", "CPU", "xpu"])
def test_other_device_kernels_use_static_shapes_too_once_per_device(monkeypatch, device_type):
    # automatic dynamic shapes crashed inductor on CUDA (torch 2.11, H200): T5's score_mod
    # after ALiBi's generalised the captured tensors' sizes
    calls = _recorded_compile(monkeypatch)
    got = _flex.flex_attention_compiled(device_type)
    assert got[2] == {"dynamic": False}
    assert _flex.flex_attention_compiled(device_type) is got
    assert _flex.flex_attention_compiled("cpu") is not got
    assert calls == [{"dynamic": False}, {"dynamic": False}]


def _blocks_device(mask):
    return {t.device.type for t in (mask.kv_num_blocks, mask.kv_indices)}


def test_causal_mask_lives_on_the_device_asked_for_and_is_cached_per_device(monkeypatch):
    monkeypatch.setattr(_flex, "_MASKS", {})
    cpu = _flex._causal_block_mask(4, 8, 4, "cpu")
    meta = _flex._causal_block_mask(4, 8, 4, "meta")
    assert _blocks_device(cpu) == {"cpu"} and _blocks_device(meta) == {"meta"}
    assert meta is not cpu and meta.kv_num_blocks.shape == cpu.kv_num_blocks.shape
    assert _flex._causal_block_mask(4, 8, 4, torch.device("meta")) is meta
    assert _flex._causal_block_mask(4, 8, 4, None) is cpu  # None is the CPU
    assert len(_flex._MASKS) == 2


def test_causal_mask_without_device_is_on_the_cpu_under_another_default(monkeypatch):
    monkeypatch.setattr(_flex, "_MASKS", {})
    with torch.device("meta"):
        mask = _flex._causal_block_mask(3, 5, 2, None)
    assert _blocks_device(mask) == {"cpu"}
    q, kv = torch.arange(3)[:, None], torch.arange(5)[None, :]
    got = mask.mask_mod(0, 0, q, kv)
    # query i sits at slot i + 2 and sees keys 0 .. i + 2
    want = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(got, want)


def test_plain_causal_plan_builds_its_mask_on_the_device_asked_for(monkeypatch):
    monkeypatch.setattr(_flex, "_MASKS", {})
    _, cpu = _flex.flex_plan(ALiBi(2), range(4, 8), range(8), causal=True, device="cpu")
    _, meta = _flex.flex_plan(ALiBi(2), range(4, 8), range(8), causal=True, device="meta")
    assert _blocks_device(cpu) == {"cpu"} and _blocks_device(meta) == {"meta"}


@pytest.mark.parametrize("kind", ["padding", "tensor-start"])
def test_padding_and_tensor_start_plans_build_on_the_device_asked_for(kind):
    meta = torch.device("meta")
    if kind == "padding":
        kw = {"key_valid": torch.ones(2, 8, dtype=torch.bool, device=meta)}
    else:
        kw = {"q_start": torch.tensor(4, device=meta)}
    _, mask = _flex.flex_plan(ALiBi(2), range(4, 6), range(8), causal=True, device=meta, **kw)
    assert _blocks_device(mask) == {"meta"}
    assert mask.kv_num_blocks.shape[0] == (2 if kind == "padding" else 1)


def test_tensor_q_start_is_used_without_a_copy():
    start = torch.tensor(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.tensor(a_tensor) warns: not done here
        _, mask = _flex.flex_plan(ALiBi(2), range(4, 6), range(8), causal=True, q_start=start)
    q, kv = torch.arange(2)[:, None], torch.arange(8)[None, :]
    got = mask.mask_mod(0, 0, q, kv)
    # queries at slots 4 and 5 of an 8-slot buffer: keys 0..4 and 0..5
    want = torch.tensor([[1] * 5 + [0] * 3, [1] * 6 + [0] * 2], dtype=torch.bool)
    assert torch.equal(got, want)


@pytest.mark.parametrize("given", ["key_valid", "q_start"])
def test_mask_without_device_follows_the_tensors_it_reads(given):
    # device=None: the mask goes where key_valid / q_start live, not to torch's default
    # device (nor, on a machine with a GPU, to the current accelerator)
    kw = (
        {"key_valid": torch.ones(1, 8, dtype=torch.bool)}
        if given == "key_valid"
        else {"q_start": torch.tensor(4)}
    )
    with torch.device("meta"):
        _, mask = _flex.flex_plan(ALiBi(2), range(4), range(8), causal=True, **kw)
    assert _blocks_device(mask) == {"cpu"}
    q, kv = torch.arange(4)[:, None], torch.arange(8)[None, :]
    got = mask.mask_mod(torch.tensor(0), torch.tensor(0), q, kv)
    assert torch.equal(got, kv <= q + 4)  # the queries are the last 4 of 8 slots


def _plan_device(**kw):
    _, mask = _flex.flex_plan(ALiBi(2), range(4), range(8), causal=True, **kw)
    return _blocks_device(mask)


def test_mask_device_without_one_given_is_that_of_key_valid_else_of_q_start():
    on_meta = torch.ones(1, 8, dtype=torch.bool, device="meta")
    assert _plan_device(key_valid=on_meta) == {"meta"}
    assert _plan_device(q_start=torch.tensor(4, device="meta")) == {"meta"}


def test_traced_plan_without_tensors_builds_its_mask_on_the_cpu_not_the_default(monkeypatch):
    # while tracing, the cached causal mask is not used: the mask is built in the plan, on
    # the CPU when neither a device nor a tensor says otherwise. The eager call first lets
    # mutmut's stats (blind while is_compiling is patched) map this test to _mask_device.
    assert _plan_device(q_start=torch.tensor(4)) == {"cpu"}
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.device("meta"):
        assert _plan_device(q_start=4) == {"cpu"}
    assert _plan_device(q_start=4, device="meta") == {"meta"}  # the device given wins
