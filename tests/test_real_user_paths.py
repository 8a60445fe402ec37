"""Issue 17: paths real users take that used to give silent wrong answers or unclear errors.

Every expected value is independent of the code under test: the NumPy reference
(float64), a model built and loaded the ordinary way, an eager run, or HF's own classes.
Each test fails on the main branch before this work (the item of the issue is named).
"""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import (
    FIRE,
    KERPLE,
    ALiBi,
    LearnedEncoding,
    MultiHeadAttention,
    NoPE,
    PoPE,
    RotaryEmbedding,
    SinusoidalEncoding,
    T5RelativeBias,
    TransformerLM,
    XPos,
    apply_rope,
    attend,
)

SRC = str(pathlib.Path(posenc.__file__).parents[1])


def _run(code, *args):
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


# -- 1. pickled RoPE / xPos in another process -------------------------------------------------

SAVE = """
    import pickle, sys, torch
    from posenc.scaling import DynamicNTK
    from posenc.torch import RotaryEmbedding, TransformerLM, XPos
    RotaryEmbedding(32, base=77.0, max_len=8)  # built first: would take a registry's index 0
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, base=100.0, max_len=64)
    ntk = RotaryEmbedding(8, base=100.0, scaling=DynamicNTK(4.0, 16), max_len=64)
    lm = TransformerLM(11, 16, 2, 4, encoding=RotaryEmbedding(4, base=50.0, max_len=32))
    torch.save({"rope": rope, "xpos": XPos(8, max_len=64), "ntk": ntk, "lm": lm}, sys.argv[1])
    with open(sys.argv[2], "wb") as f:
        pickle.dump(rope, f)
    torch.save(lm(torch.tensor([[1, 2, 3, 4, 5]])), sys.argv[3])
"""

LOAD = """
    import pickle, sys, numpy as np, torch, posenc
    from posenc.scaling import DynamicNTK
    from posenc.torch import RotaryEmbedding
    other = RotaryEmbedding(8, base=3.0, max_len=64)  # a different RoPE built first here
    RotaryEmbedding(8, base=5.0, scaling=DynamicNTK(2.0, 8), max_len=64)
    saved = torch.load(sys.argv[1], weights_only=False)
    with open(sys.argv[2], "rb") as f:
        pickled = pickle.load(f)
    x = torch.randn(1, 2, 40, 8, generator=torch.Generator().manual_seed(0))
    xd = x.double().numpy()
    ref = posenc.rope(xd, np.arange(40), base=100.0)
    ref_ntk = posenc.rope(xd, np.arange(40), base=100.0, scaling=DynamicNTK(4.0, 16))
    errs = []
    for rope in (saved["rope"], pickled):
        for m in (rope, rope.to("cpu"), rope.float(), rope.half().float(), rope.double()):
            errs.append(np.abs(m(x, x)[0].double().numpy() - ref).max())
        errs.append(np.abs(rope(x.double(), x.double())[0].numpy() - ref).max())
    ntk = saved["ntk"]
    errs.append(np.abs(ntk(x, x)[0].double().numpy() - ref_ntk).max())
    errs.append(np.abs(ntk(x.double(), x.double())[0].numpy() - ref_ntk).max())
    xq, _ = saved["xpos"].double()(x.double(), x.double())  # runs, float64 tables
    logits = saved["lm"](torch.tensor([[1, 2, 3, 4, 5]]))
    same = bool(torch.equal(logits, torch.load(sys.argv[3])))
    print(max(errs), same, bool(torch.isfinite(xq).all()))
"""


def test_rope_saved_and_pickled_then_loaded_in_a_fresh_process_is_exact(tmp_path):
    files = [tmp_path / n for n in ("mods.pt", "rope.pkl", "logits.pt")]
    _run(SAVE, *files)
    err, same, finite = _run(LOAD, *files).split()
    assert float(err) < 2e-6 and same == "True" and finite == "True"


def test_settings_are_values_and_parsing_them_is_bounded():
    from posenc.scaling import DynamicNTK
    from posenc.torch.encodings.qk import rope_dynamic as tables

    a = RotaryEmbedding(8, base=100.0, scaling=DynamicNTK(4.0, 16), max_len=64)
    b = RotaryEmbedding(8, base=100.0, scaling=DynamicNTK(4.0, 16), max_len=64)
    assert a._key == b._key and isinstance(a._key, str)  # the same settings, the same key
    assert tables._settings(a._key) == (8, 100.0, DynamicNTK(4.0, 16), 8)
    x = torch.randn(1, 1, 20, 8)
    for base in range(200, 500):  # many distinct settings: the parse cache stays bounded
        apply_rope(x, base=float(base), scaling=DynamicNTK(2.0, 8))
    assert tables._settings.cache_info().currsize <= 128


class _Tagged(posenc.scaling.Scaling):
    """A fixed scaling of a user's own class holding a function: pickle cannot carry it."""

    def __init__(self, fn):
        self.fn = fn

    def inv_freq(self, dim, base, seq_len=None):
        return self.fn(posenc.rope_frequencies(dim, base=base)[0]), 1.0


def test_a_scaling_pickle_cannot_carry_is_refused_when_pickled_by_name():
    import copy
    import pickle

    rope = RotaryEmbedding(8, scaling=_Tagged(lambda inv: inv / 2), max_len=16)
    with pytest.raises(pickle.PicklingError, match="^RotaryEmbedding's scaling _Tagged cannot be"):
        pickle.dumps(rope)
    twin = copy.deepcopy(rope)  # deepcopy keeps the function by reference: allowed
    x = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    torch.testing.assert_close(twin(x, x)[0], rope(x, x)[0], rtol=0, atol=0)
    assert twin.cos_sin is not rope.cos_sin  # and copies the tables


# -- 2. meta-device init, then load_state_dict(assign=True) --------------------------------------

ENCODINGS = {
    "nope": NoPE,
    "sinusoidal": lambda: SinusoidalEncoding(16, max_len=32),
    "learned": lambda: LearnedEncoding(32, 16),
    "rope": lambda: RotaryEmbedding(4, max_len=32),
    "xpos": lambda: XPos(4, max_len=32),
    "alibi": lambda: ALiBi(4),
    "t5": lambda: T5RelativeBias(4, num_buckets=8, max_distance=16),
    "kerple": lambda: KERPLE(4, variant="power"),
    "fire": lambda: FIRE(4, hidden=8),
    "pope": lambda: PoPE(4, 4, delta_init="uniform"),
}


def _lm(name):
    return TransformerLM(11, 16, 2, 4, kv_heads=2, encoding=ENCODINGS[name]())


def _mha(name):
    enc = ENCODINGS[name]()
    return MultiHeadAttention(16, 4, kv_heads=2, encoding=None if "input" in enc.places else enc)


@pytest.mark.parametrize("pattern", ["assign", "to_empty"])
@pytest.mark.parametrize("build", [_lm, _mha], ids=["lm", "mha"])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_meta_init_then_load_equals_a_normally_built_model(name, build, pattern):
    torch.manual_seed(0)
    trained = build(name).eval()
    with torch.device("meta"):
        model = build(name)
    if pattern == "to_empty":
        model = model.to_empty(device="cpu")
        model.load_state_dict(trained.state_dict())
    else:  # HF's / accelerate's empty-weight loading
        model.load_state_dict(trained.state_dict(), assign=True)
    model.eval()
    assert not [n for n, t in model.named_buffers() if t.is_meta]  # nothing left on meta
    x = torch.tensor([[1, 2, 3, 4, 5, 6]]) if build is _lm else torch.randn(1, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), trained(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["t5", "alibi", "rope", "pope", "sinusoidal"])
def test_a_standalone_encoding_loaded_with_assign_is_exact(name):
    torch.manual_seed(0)
    trained = ENCODINGS[name]()
    with torch.device("meta"):
        enc = ENCODINGS[name]()
    enc.load_state_dict(trained.state_dict(), assign=True)
    with torch.no_grad():
        if name in ("rope", "pope"):
            q, k = torch.randn(1, 4, 6, 4), torch.randn(1, 4, 6, 4)
            got, want = enc(q, k), trained(q, k)
        elif name == "sinusoidal":
            x = torch.randn(1, 6, 16)
            got, want = enc(x), trained(x)
        else:
            got, want = enc(range(6)), trained(range(6))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- 3. re-entrancy: another attention call between two layers -----------------------------------


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple"])
def test_a_hook_running_another_attention_between_layers_changes_nothing(name):
    torch.manual_seed(0)
    lm = _lm(name).eval()
    idx = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        clean = lm(idx)
    other = ALiBi(4, symmetric=True)  # writes its bias into a reused mask buffer

    def hook(module, args, out):  # same shape as the model's mask: (1, 4, 7, 7), no causal
        q = torch.randn(1, 4, 7, 4)
        attend(q, q, q, other, causal=False)

    handle = lm.blocks[0].register_forward_hook(hook)
    try:
        with torch.no_grad():
            hooked = lm(idx)
            changed = lm(torch.tensor([[1, 2, 3, 4, 5, 6, 9]]))  # only the last token differs
    finally:
        handle.remove()
    torch.testing.assert_close(hooked, clean, rtol=0, atol=0)
    torch.testing.assert_close(changed[:, :-1], clean[:, :-1], rtol=0, atol=0)  # causal


def test_the_workspace_is_reused_by_consecutive_steps_and_not_held_after_a_failure(no_kept_masks):
    from posenc.torch.attention import mask as mask_mod

    lm = _lm("alibi").eval()
    with torch.no_grad():
        lm(torch.tensor([[1, 2, 3]]))
        first = mask_mod._LOCAL.mask.data_ptr()
        lm(torch.tensor([[3, 2, 1]]))
        assert mask_mod._LOCAL.mask.data_ptr() == first  # reused between steps
        assert getattr(mask_mod._LOCAL, "holder", None) is None  # released after the step

        def fail(module, args, out):
            raise RuntimeError("a hook failed mid-step")

        handle = lm.blocks[0].register_forward_hook(fail)
        with pytest.raises(RuntimeError, match="a hook failed mid-step"):
            lm(torch.tensor([[1, 2, 3]]))
        handle.remove()
        assert getattr(mask_mod._LOCAL, "holder", None) is None  # released even after an error
        lm(torch.tensor([[1, 2, 3]]))
        assert mask_mod._LOCAL.mask.data_ptr() == first  # and reused again


# -- 4. negative positions: eager and under vmap (compiled: test_compile_negative below) --------


def test_negative_positions_raise_eager_and_under_vmap():
    rope = RotaryEmbedding(8, max_len=16)
    x = torch.randn(1, 1, 4, 8)
    neg = torch.tensor([-4, -3, -2, -1])
    for call in (lambda: rope(x, x, neg), lambda: apply_rope(x, neg)):
        with pytest.raises(ValueError, match="positions must be non-negative, got -4"):
            call()
    batched = torch.stack([torch.arange(4), neg])  # (2, 4): one good row, one negative
    with pytest.raises(ValueError, match="positions must be non-negative, got -4"):
        torch.func.vmap(lambda p: apply_rope(x, p))(batched)
    with pytest.raises(ValueError, match="positions must be < max_len=16, got 19"):
        torch.func.vmap(lambda p: rope(x, x, p)[0])(torch.stack([torch.arange(4), neg + 20]))


@pytest.mark.compile
@pytest.mark.parametrize("name", ["rope", "xpos", "sinusoidal"])
def test_compiled_negative_positions_raise_instead_of_wrapping(name):
    torch._dynamo.reset()
    enc = {
        "rope": lambda: RotaryEmbedding(8, max_len=16),
        "xpos": lambda: XPos(8, max_len=16),
        "sinusoidal": lambda: SinusoidalEncoding(8, max_len=16),
    }[name]()
    x = torch.randn(1, 1, 4, 8)
    if name == "sinusoidal":
        fn = torch.compile(lambda p: enc(x[0], p), fullgraph=True)
    else:
        fn = torch.compile(lambda p: enc(x, x, p)[0], fullgraph=True)
    good = fn(torch.tensor([12, 13, 14, 15]))  # compiled once
    with pytest.raises(ValueError, match="positions must be non-negative, got -4"):
        fn(torch.tensor([-4, -3, -2, -1]))  # used to give the rows of 12 .. 15
    with pytest.raises(ValueError, match="positions must be < max_len=16, got 16"):
        fn(torch.tensor([13, 14, 15, 16]))
    eager = enc(x[0], torch.tensor([12, 13, 14, 15])) if name == "sinusoidal" else None
    if eager is not None:
        torch.testing.assert_close(good, eager)


# -- 6. integer queries and keys -------------------------------------------------------------


def test_integer_queries_and_keys_are_refused():
    qi = torch.tensor([[[[-1, 4]]]])
    q = torch.ones(1, 4, 3, 8, dtype=torch.int32)
    calls = {
        "apply_rope": (lambda: apply_rope(qi, torch.tensor([1])), "x"),
        "rope": (lambda: RotaryEmbedding(8, max_len=8)(q, q), "q"),
        "xpos": (lambda: XPos(8, max_len=8)(q, q), "q"),
        "pope": (lambda: PoPE(8, 4)(q, q), "q"),
        "attend": (lambda: attend(q.float(), q, q.float()), "k"),
    }
    for call, arg in calls.values():
        with pytest.raises(ValueError, match=f"{arg} must be a floating-point tensor, got dtype"):
            call()
    got = apply_rope(qi.float(), torch.tensor([1]))  # the answer an integer input would want
    c, s = np.cos(1.0), np.sin(1.0)  # [-1, 4] turned by 1 radian
    torch.testing.assert_close(got, torch.tensor([[[[-c - 4 * s, 4 * c - s]]]]).float())


# -- 7. huge contexts ----------------------------------------------------------------------------

QWEN_1M = {  # Qwen/Qwen2.5-7B-Instruct-1M: the keys RoPE reads
    "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
    "max_position_embeddings": 1010000, "rope_theta": 10000000.0,
}  # fmt: skip


def test_a_million_positions_build_fast_small_and_exact_at_the_far_end():
    t0 = time.perf_counter()
    rope = RotaryEmbedding.from_hf(QWEN_1M)
    built = time.perf_counter() - t0
    assert rope.max_len == 1010000 and built < 1.0
    assert rope.cos_sin.numel() * 4 < 8 << 20  # MiBs, not the 493 MiB of a full table
    for move in (lambda m: m.to("cpu"), lambda m: m.to(torch.bfloat16), lambda m: m.float()):
        table = rope.cos_sin
        took = []  # the best of 5: a busy machine (CI, a mutation run) delays single calls
        for _ in range(5):
            t0 = time.perf_counter()
            move(rope)
            took.append(time.perf_counter() - t0)
        assert min(took) < 0.01
        assert rope.cos_sin is table  # nothing rebuilt, nothing copied
    x = torch.randn(1, 2, 3, 128, dtype=torch.float64)
    far = torch.tensor([0, 500_000, 1_009_999])
    ref = posenc.rope(x.numpy(), far.numpy(), base=1e7)
    with torch.no_grad():
        got32 = rope(x.float(), x.float(), far)[0].double().numpy()
        got64 = rope(x, x, far)[0].numpy()
    np.testing.assert_allclose(got64, ref, rtol=0, atol=1e-9)  # float64 angles
    np.testing.assert_allclose(got32, ref, rtol=0, atol=5e-6)  # one float32 rounding
    assert rope.cos_sin.shape[0] == 1010000  # grown on demand, to what was used


def test_the_table_grows_to_what_is_used_with_the_same_numbers():
    rope = RotaryEmbedding(8, max_len=20_000)
    assert rope.cos_sin.shape[0] == 4096
    x = torch.randn(1, 1, 2, 8)
    with torch.no_grad():
        rope(x, x, torch.tensor([5000, 6000]))
    assert rope.cos_sin.shape[0] == 8192  # doubled, not max_len
    full = posenc.rope_frequencies(8)[0]
    angles = np.arange(8192)[:, None] * full  # (8192, 4), float64
    want = np.stack([np.cos(angles), np.sin(angles)], -1).astype(np.float32)
    np.testing.assert_allclose(rope.cos_sin.numpy(), want, rtol=0, atol=6e-8)


def test_a_table_grown_or_built_under_inference_mode_still_trains():
    rope = RotaryEmbedding(8, max_len=10_000)
    with torch.device("meta"):
        alibi = ALiBi(4)
    x = torch.randn(1, 1, 2, 8)
    with torch.inference_mode():
        rope(x, x, torch.tensor([0, 9000]))  # grows the table
        alibi(range(3))  # builds the meta tables
    q = torch.randn(1, 1, 2, 8, requires_grad=True)
    rope(q, q, torch.tensor([1, 9000]))[0].sum().backward()  # no growth: the same table
    assert q.grad is not None and not rope.cos_sin.is_inference()
    assert not alibi.slopes.is_inference()


# -- 8. errors that say what went wrong ----------------------------------------------------------


def test_a_cache_from_another_model_or_dtype_is_refused_clearly():
    lm = TransformerLM(11, 16, 2, 4, encoding=RotaryEmbedding(4, max_len=32))
    deeper = TransformerLM(11, 16, 3, 4, encoding=RotaryEmbedding(4, max_len=32))
    idx = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="cache has 2 layers, the model has 3"):
        deeper(idx, cache=lm.new_cache(1, 8))
    cache = lm.new_cache(1, 8)
    lm.to(torch.bfloat16)
    with pytest.raises(ValueError, match="cache holds torch.float32, the model computes in"):
        lm(idx, cache=cache)
    assert len(cache) == 0
    attn = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"cache has \(kv_heads, key_dim, value_dim\)"):
        attn(torch.randn(1, 3, 16), cache=MultiHeadAttention(16, 2).new_cache(1, 8))


def test_an_encoding_for_another_number_of_heads_is_refused():
    q = torch.randn(1, 4, 3, 8)
    for enc in (ALiBi(1), T5RelativeBias(2), KERPLE(8), FIRE(1)):
        with pytest.raises(ValueError, match=f"was built for heads={enc.heads}, attention has"):
            attend(q, q, q, enc)
        with pytest.raises(ValueError, match="attention has heads=4"):
            MultiHeadAttention(32, 4, encoding=enc)
    with pytest.raises(ValueError, match="attention has heads=4"):
        TransformerLM(11, 16, 1, 4, encoding=ALiBi(1))


def test_vmap_of_apply_rope_over_batched_positions_matches_a_loop():
    x = torch.randn(3, 1, 2, 4, 8)
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8], [9, 3, 0, 1]])
    got = torch.func.vmap(lambda xi, p: apply_rope(xi, p))(x, pos)
    want = torch.stack([apply_rope(x[i], pos[i]) for i in range(3)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    rope = RotaryEmbedding(8, max_len=16)
    got = torch.func.vmap(lambda xi, p: rope(xi, xi, p)[0])(x, pos)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    xpos = XPos(8, max_len=16)
    got = torch.func.vmap(lambda xi, p: xpos(xi, xi, p)[1])(x, pos)
    want = torch.stack([xpos(x[i], x[i], pos[i])[1] for i in range(3)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["t5", "kerple", "fire", "alibi"])
def test_func_grad_through_attend_with_a_learned_bias_matches_autograd(name):
    torch.manual_seed(0)
    enc = ENCODINGS[name]()
    q, k, v = (torch.randn(1, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    enc = enc.double()
    got = torch.func.grad(lambda q: attend(q, k, v, enc).square().sum())(q)
    q1 = q.clone().requires_grad_()
    attend(q1, k, v, enc).square().sum().backward()
    torch.testing.assert_close(got, q1.grad, rtol=1e-10, atol=1e-12)
