"""Per-layer position schedules: sliding and chunked attention, NoPE layers with a query
temperature, partial and decoupled (MLA) RoPE, per-layer bases.

Each model is checked three ways: its full forward against the NumPy reference
(``tests/reference.py``: masks written from the definitions, RoPE from ``posenc.rope``,
the temperature from ``posenc.query_temperature``), cached decoding token by token against
the full forward (float64, both caches), and a property (what a window or chunk hides).
"""

import math

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import (
    ALiBi,
    ChannelSlice,
    Layer,
    NoPE,
    PoPE,
    QueryTemperature,
    RotaryEmbedding,
    Schedule,
    SinusoidalEncoding,
    SoftmaxFactor,
    TransformerLM,
    attend,
)
from tests import reference

HD, DIM, HEADS, VOCAB, N = 16, 32, 2, 17, 11
SLOPES = posenc.alibi_slopes(HEADS)


def _rope_qk(**kw):  # reference rotation of q and k, positions (b, 1, n)
    return lambda q, k, p: (posenc.rope(q, p, **kw), posenc.rope(k, p, **kw))


def _temperature_qk(scale, floor, shift, inner=None):
    def f(q, k, p):
        if inner is not None:
            q, k = inner(q, k, p)
        tau = posenc.query_temperature(p[0, 0], scale=scale, floor=floor, shift=shift)
        return q * tau[None, None, :, None], k

    return f


def _slice_qk(start, **kw):
    def f(q, k, p):
        q, k = q.copy(), k.copy()
        q[..., start:] = posenc.rope(q[..., start:], p, **kw)
        k[..., start:] = posenc.rope(k[..., start:], p, **kw)
        return q, k

    return f


def _cases():
    """name -> (schedule factory, reference per-layer kwargs)."""
    local, far = dict(base=10.0), dict(base=1e4)
    return {
        "sliding": (
            lambda: Schedule([Layer(RotaryEmbedding(HD), window=3), Layer(RotaryEmbedding(HD))]),
            [dict(encode_qk=_rope_qk(), window=3), dict(encode_qk=_rope_qk())],
        ),
        "chunked": (
            lambda: Schedule([Layer(RotaryEmbedding(HD), chunk=4), Layer(None)]),
            [dict(encode_qk=_rope_qk(), chunk=4), {}],
        ),
        "nope_with_temperature": (
            lambda: Schedule(
                [
                    Layer(RotaryEmbedding(HD), chunk=4),
                    Layer(QueryTemperature(scale=0.5, floor=3, shift=1)),
                ]  # fmt: skip
            ),
            [dict(encode_qk=_rope_qk(), chunk=4), dict(encode_qk=_temperature_qk(0.5, 3, 1))],
        ),
        "interleaved_partial": (
            lambda: Schedule([Layer(RotaryEmbedding(HD, pairing="interleaved", rotary_dim=4))] * 2),
            [dict(encode_qk=_rope_qk(pairing="interleaved", rotary_dim=4))] * 2,
        ),
        "mla_decoupled": (
            lambda: Schedule(
                [
                    Layer(
                        SoftmaxFactor(
                            ChannelSlice(RotaryEmbedding(6, pairing="interleaved"), start=HD - 6),
                            factor=1.7,
                        )
                    )
                ]
                * 2  # fmt: skip
            ),
            [dict(encode_qk=_slice_qk(HD - 6, pairing="interleaved"), softmax_factor=1.7)] * 2,
        ),
        "per_layer_bases": (
            lambda: Schedule(
                [
                    Layer(RotaryEmbedding(HD, base=10.0), window=2),
                    Layer(RotaryEmbedding(HD, base=1e4)),
                ]  # fmt: skip
            ),
            [dict(encode_qk=_rope_qk(**local), window=2), dict(encode_qk=_rope_qk(**far))],
        ),
        "temperature_on_rope": (  # Ministral 3: every layer
            lambda: Schedule(
                [Layer(QueryTemperature(RotaryEmbedding(HD), scale=0.3, floor=4))] * 2
            ),
            [dict(encode_qk=_temperature_qk(0.3, 4, 0, _rope_qk()))] * 2,
        ),
        "alibi_window_and_sinusoidal_input": (
            lambda: Schedule([Layer(ALiBi(HEADS), window=4)] * 2, input=SinusoidalEncoding(DIM)),
            [dict(window=4, bias=lambda qp, kp: posenc.alibi_bias(SLOPES, qp, kp))] * 2,
        ),
    }


CASES = _cases()


def _model(name, **kw):
    torch.manual_seed(0)
    with torch.device("cpu"):
        lm = TransformerLM(VOCAB, DIM, 2, HEADS, schedule=CASES[name][0](), **kw)
    return lm.double().eval()


@pytest.mark.parametrize("name", sorted(CASES))
def test_full_forward_matches_the_numpy_reference(name):
    lm = _model(name)
    idx = torch.randint(0, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))
    table = None
    if lm.schedule.input is not None:
        table = posenc.sinusoidal(N, DIM)
    want = reference.lm(lm, idx.numpy(), table=table, layers=CASES[name][1])
    with torch.no_grad():
        got = lm(idx).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cached_decoding_equals_the_full_forward(name, static):
    lm = _model(name)
    idx = torch.randint(0, VOCAB, (2, N), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = lm(idx)
        cache = lm.new_cache(2, N, static=static)
        steps = [lm(idx[:, :5], cache=cache)]  # a prefill longer than a window and a chunk
        steps += [lm(idx[:, i : i + 1], cache=cache) for i in range(5, N)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-12)


def test_one_layer_window_hides_exactly_the_tokens_before_it():
    lm = TransformerLM(VOCAB, DIM, 1, HEADS, schedule=Schedule([Layer(NoPE(), window=3)]))
    idx = torch.randint(0, VOCAB, (1, N), generator=torch.Generator().manual_seed(3))
    other = idx.clone()
    other[0, 4] = (idx[0, 4] + 1) % VOCAB
    with torch.no_grad():
        changed = (lm(idx) - lm(other)).abs().amax(-1)[0] > 0
    assert changed.nonzero().flatten().tolist() == [4, 5, 6]  # i - 3 < 4 <= i


def test_one_layer_chunk_hides_every_other_chunk():
    lm = TransformerLM(VOCAB, DIM, 1, HEADS, schedule=Schedule([Layer(NoPE(), chunk=4)]))
    idx = torch.randint(0, VOCAB, (1, N), generator=torch.Generator().manual_seed(4))
    other = idx.clone()
    other[0, 5] = (idx[0, 5] + 1) % VOCAB
    with torch.no_grad():
        changed = (lm(idx) - lm(other)).abs().amax(-1)[0] > 0
    assert changed.nonzero().flatten().tolist() == [5, 6, 7]  # chunk 4..7, from 5 on


@pytest.mark.parametrize("limits", [dict(window=3), dict(chunk=4), dict(window=2, chunk=4)])
def test_attend_flex_equals_sdpa_with_limits(limits):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g) for _ in range(3))
    enc = ALiBi(2)
    want = attend(q, k, v, encoding=enc, backend="sdpa", **limits)
    got = attend(q, k, v, encoding=enc, backend="flex", **limits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_temperature_is_llama_4s_golden_values():
    # transformers' Llama4TextAttention: log1p(floor((p + 1) / floor_scale)) * attn_scale + 1
    # with the class defaults attn_scale=0.1, floor_scale=8192
    tau = posenc.query_temperature([0, 8190, 8191, 16382, 16383], scale=0.1, floor=8192, shift=1)
    want = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3)]
    np.testing.assert_allclose(tau, want, rtol=0, atol=1e-15)
    enc = QueryTemperature(scale=0.1, floor=8192, shift=1).double()
    q = k = torch.ones(1, 1, 5, 2, dtype=torch.float64)
    pos = torch.tensor([[0, 8190, 8191, 16382, 16383]])
    got = enc.encode_qk(q, k, pos, pos)[0][0, 0, :, 0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_channel_slice_scores_depend_only_on_the_offset():
    enc = ChannelSlice(RotaryEmbedding(6, pairing="interleaved"), start=4).double()
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(1, 1, 1, 10, generator=g, dtype=torch.float64), None
    k = torch.randn(1, 1, 1, 10, generator=g, dtype=torch.float64)

    def score(m, n):
        qm, _ = enc.encode_qk(q, q, torch.tensor([[m]]), torch.tensor([[m]]))
        kn, _ = enc.encode_qk(k, k, torch.tensor([[n]]), torch.tensor([[n]]))
        return float((qm * kn).sum())

    assert score(7, 3) == pytest.approx(score(24, 20), abs=1e-12)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-6)
    assert enc.softmax_scale(10) == 10**-0.5  # the whole head's width


def test_refusals_name_what_is_wrong():
    rope = RotaryEmbedding(HD)
    with pytest.raises(ValueError, match="window must be None or an int >= 1, got 0"):
        Layer(rope, window=0)
    with pytest.raises(ValueError, match="chunk must be None or an int >= 1, got '4'"):
        Layer(rope, chunk="4")
    with pytest.raises(ValueError, match="acts on the input embeddings: pass it as input="):
        Schedule([Layer(SinusoidalEncoding(DIM))])
    with pytest.raises(ValueError, match="input must act on the input embeddings only"):
        Schedule([Layer(rope)], input=rope)
    with pytest.raises(ValueError, match="give one of encoding= and schedule=, got both"):
        TransformerLM(VOCAB, DIM, 1, HEADS, encoding=rope, schedule=Schedule([Layer(rope)]))
    with pytest.raises(ValueError, match="schedule must have depth=2 layers, got 1"):
        TransformerLM(VOCAB, DIM, 2, HEADS, schedule=Schedule([Layer(rope)]))
    why = (r"^every layer must cache keys of one width and positions of one number of axes, "
           r"got \(key width, axes\) \[\(16, 1\), \(32, 1\)\]$")  # fmt: skip
    with pytest.raises(ValueError, match=why):  # PoPE caches wider keys
        mixed = Schedule([Layer(PoPE(HD, HEADS)), Layer(None)])
        TransformerLM(VOCAB, DIM, 2, HEADS, schedule=mixed)
    with pytest.raises(ValueError, match="a query/key encoding with a head_dim"):
        ChannelSlice(ALiBi(2), start=0)
    with pytest.raises(ValueError, match="q and k must have at least start \\+ width = 12"):
        ChannelSlice(RotaryEmbedding(6), start=6).encode_qk(
            torch.ones(1, 1, 2, 8), torch.ones(1, 1, 2, 8), range(2), range(2)
        )
    with pytest.raises(ValueError, match="factor must be a positive finite number, got 0"):
        SoftmaxFactor(rope, factor=0)
    with pytest.raises(ValueError, match="floor must be a positive"):
        QueryTemperature(scale=0.1, floor=0)


def test_schedule_refusals_name_the_offending_object():
    rope = RotaryEmbedding(HD)
    with pytest.raises(ValueError, match=r"^layers\[1\] must be a Layer, got RotaryEmbedding$"):
        Schedule([Layer(rope), rope])
    sinus = SinusoidalEncoding(DIM)
    with pytest.raises(ValueError, match=r"^layers\[0\]\.encoding SinusoidalEncoding acts on"):
        Schedule([Layer(sinus)])
    with pytest.raises(ValueError, match=r"only, RotaryEmbedding acts at \('qk',\)$"):
        Schedule([Layer(rope)], input=rope)
    # RoPE reads one position axis, M-RoPE three: one schedule cannot feed both.
    mrope = posenc.torch.MRoPE(HD, sections=(2, 3, 3))
    with pytest.raises(ValueError, match=r"same number of position axes, got \[1, 3\]$"):
        Schedule([Layer(rope), Layer(mrope)])
    assert Schedule([Layer(mrope), Layer(None)]).layers[1].encoding is None
    # a layer without attention (Qwen3-Next's linear attention) is not a NoPE attention layer
    hybrid = Schedule([Layer(rope), Layer(attention=False)])
    with pytest.raises(ValueError, match=r"^schedule layer 1 has no attention \(a recurrent"):
        TransformerLM(VOCAB, DIM, 2, HEADS, schedule=hybrid)


def test_schedule_state_dict_round_trip_and_one_entry_per_shared_encoding():
    rope = RotaryEmbedding(HD)
    sched = Schedule([Layer(rope, window=4), Layer(rope), Layer(ALiBi(HEADS))])
    lm = TransformerLM(VOCAB, DIM, 3, HEADS, schedule=sched)
    assert len(lm.encodings) == 2 and lm.blocks[0].attn.encoding is lm.blocks[1].attn.encoding
    assert not [k for k in lm.state_dict() if "encoding" in k]  # RoPE and ALiBi: derived only
    lm2 = TransformerLM(VOCAB, DIM, 3, HEADS, schedule=Schedule(
        [Layer(RotaryEmbedding(HD), window=4), Layer(RotaryEmbedding(HD)), Layer(ALiBi(HEADS))]
    ))  # fmt: skip
    lm2.load_state_dict(lm.state_dict())
    idx = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(lm2(idx), lm(idx), rtol=0, atol=0)


def test_repr_names_each_layer_and_the_input_encoding():
    rope = RotaryEmbedding(HD)
    schedule = Schedule(
        [Layer(rope, window=3), Layer(None), Layer(rope, chunk=4), Layer(ALiBi(HEADS))],
        input=SinusoidalEncoding(DIM),
    )
    assert repr(schedule) == (
        "Schedule([RotaryEmbedding(window=3), NoPE, RotaryEmbedding(chunk=4), ALiBi], "
        "input=SinusoidalEncoding)"
    )
    assert repr(Schedule([Layer(rope)])) == "Schedule([RotaryEmbedding])"


def test_a_wrapper_passes_the_input_hook_through():
    inner = SinusoidalEncoding(DIM, max_len=N)
    x = torch.randn(2, N, DIM)  # (batch, seq, dim)
    pos = torch.arange(N).flip(0)
    want = inner.encode_input(x, pos)
    torch.testing.assert_close(SoftmaxFactor(inner, factor=2.0).encode_input(x, pos), want)
