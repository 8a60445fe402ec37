"""Grid encodings in torch: axial RoPE, M-RoPE and the 2-D sin-cos input, against the NumPy
reference, through the attention core with ``(batch, seq, n_axes)`` positions, with a KV cache
(cached decode == full forward in float64 to 1e-10), GQA, derived state and compile.
"""

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import (
    AxialRotaryEmbedding,
    KVCache,
    MRoPE,
    MultiHeadAttention,
    RotaryEmbedding,
    SinusoidalEncoding2D,
    StaticKVCache,
    TransformerLM,
)

V, DIM, HEADS, KV = 13, 48, 4, 2
HD = DIM // HEADS  # 12: two axes of 3 pairs, or M-RoPE sections (2, 2, 2)
SECTIONS = (2, 2, 2)
# text, an image of 4x6 patches (merge 2: 2x3 tokens), text -- then decoding
SEGMENTS = [3, (1, 4, 6), 4]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _mrope_pos(batch=2):
    pos = torch.from_numpy(posenc.mrope_positions(SEGMENTS, spatial_merge=2))  # (13, 3)
    return pos[None].expand(batch, -1, -1)  # (batch, seq, 3)


def _grid_pos(h, w, batch=2):
    return torch.from_numpy(posenc.grid_positions(h, w))[None].expand(batch, -1, -1)


ENCODINGS = {
    "axial_half": lambda: AxialRotaryEmbedding(HD, max_len=32),
    "axial_interleaved": lambda: AxialRotaryEmbedding(HD, pairing="interleaved", max_len=32),
    "mrope": lambda: MRoPE(HD, sections=SECTIONS, base=1e6, max_len=32),
    "mrope_interleaved": lambda: MRoPE(HD, sections=SECTIONS, interleaved=True, max_len=32),
}


def _reference(enc):
    if isinstance(enc, MRoPE):
        return posenc.mrope_frequencies(
            enc.head_dim, enc.sections, base=enc.base, interleaved=enc.interleaved
        )
    return posenc.axial_frequencies(enc.head_dim, enc.n_axes, base=enc.base)


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rotation_matches_numpy_reference(name, dtype):
    enc = ENCODINGS[name]()
    pos = _mrope_pos() if name.startswith("mrope") else _grid_pos(3, 4)
    pos = pos.clone()
    pos[1] += torch.tensor([5, 1, 2][: pos.shape[-1]])  # the rows differ
    seq = pos.shape[1]
    q = torch.randn(2, HEADS, seq, HD, generator=_gen(0), dtype=torch.float64)
    k = torch.randn(2, KV, seq, HD, generator=_gen(1), dtype=torch.float64)
    qr, kr = enc(q.to(dtype), k.to(dtype), pos)
    inv, axis = _reference(enc)
    p = pos.numpy()[:, None]  # (batch, 1, seq, n_axes): broadcast over heads
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for got, x in ((qr, q), (kr, k)):
        want = posenc.rope_nd(x.numpy(), p, inv, axis, pairing=enc.pairing)
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=tol)


def test_mrope_on_1d_positions_is_rotary_embedding():
    mrope = MRoPE(HD, sections=SECTIONS, base=1e6, max_len=32)
    rope = RotaryEmbedding(HD, base=1e6, max_len=32)
    q = torch.randn(2, HEADS, 7, HD, generator=_gen(2), dtype=torch.float64)
    k = torch.randn(2, KV, 7, HD, generator=_gen(3), dtype=torch.float64)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [0, 2, 4, 6, 8, 10, 12]])
    for a, b in zip(mrope(q, k, pos), rope(q, k, pos), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    diag = pos[..., None].expand(-1, -1, 3)  # the same positions as (p, p, p)
    for a, b in zip(mrope(q, k, diag), rope(q, k, pos), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    for a, b in zip(mrope(q, k, range(2, 9)), rope(q, k, range(2, 9)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_sinusoidal_2d_encoding_matches_reference():
    pe = SinusoidalEncoding2D(16, max_len=8).double()
    x = torch.randn(2, 12, 16, generator=_gen(4), dtype=torch.float64)
    pos = _grid_pos(3, 4)
    want = x.numpy() + posenc.sinusoidal_2d(3, 4, 16)
    np.testing.assert_allclose(pe(x, pos).numpy(), want, rtol=0, atol=1e-15)
    # 1-D positions p are the point (p, p): the diagonal of the grid
    diag = posenc.sinusoidal_2d(4, 4, 16)[[0, 5, 10, 15]]
    np.testing.assert_allclose(pe(torch.zeros(1, 4, 16, dtype=torch.float64)).numpy()[0], diag)


# -- through the attention core, with a KV cache -----------------------------------------------


def _mha(enc):
    torch.manual_seed(0)
    return MultiHeadAttention(DIM, HEADS, kv_heads=KV, encoding=enc).double()


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("name", ["mrope", "mrope_interleaved"])
def test_mrope_cached_decode_continues_text_after_the_image(name, static):
    # prefill text + image + 1 text token with Qwen2-VL's positions, then decode the rest
    # WITHOUT positions: the cache must continue from the largest coordinate + 1, which is
    # where mrope_positions puts the text after the image (not at the token count)
    attn = _mha(ENCODINGS[name]())
    pos = _mrope_pos()  # (2, 13, 3)
    x = torch.randn(2, 13, DIM, generator=_gen(5), dtype=torch.float64)
    full = attn(x, pos)
    cache = attn.new_cache(2, 16, static=static)
    outs = [attn(x[:, :10], pos[:, :10], cache=cache)]
    assert cache.positions.shape == (2, 16, 3)
    for i in range(10, 13):
        outs.append(attn(x[:, i : i + 1], cache=cache))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(cache.positions[0, 9:13].numpy(), pos[0, 9:13].numpy())
    # the token count would have put the first text token after the image at 9, not 6
    assert int(pos[0, 9, 0]) == 6


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("name", ["axial_half", "axial_interleaved"])
def test_axial_cached_decode_equals_full_forward(name, static):
    attn = _mha(ENCODINGS[name]())
    pos = _grid_pos(4, 5)  # (2, 20, 2)
    x = torch.randn(2, 20, DIM, generator=_gen(6), dtype=torch.float64)
    full = attn(x, pos)
    cache = attn.new_cache(2, 20, static=static)
    outs = [attn(x[:, :7], pos[:, :7], cache=cache)]
    for i in range(7, 20, 4):  # chunks of up to 4 patches, positions given
        outs.append(attn(x[:, i : i + 4], pos[:, i : i + 4], cache=cache))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("name", ["sincos_2d", "axial_half", "mrope"])
def test_model_cached_decode_equals_full_forward(name, static):
    enc = SinusoidalEncoding2D(DIM, max_len=32) if name == "sincos_2d" else ENCODINGS[name]()
    torch.manual_seed(1)
    lm = TransformerLM(V, DIM, 2, HEADS, kv_heads=KV, encoding=enc).double()
    pos = _mrope_pos() if name == "mrope" else _grid_pos(3, 4)
    seq = pos.shape[1]
    idx = torch.randint(0, V, (2, seq), generator=_gen(7))
    full = lm(idx, pos)
    cache = lm.new_cache(2, seq, static=static)
    first = lm(idx[:, :5], pos[:, :5], cache=cache)
    rest = [lm(idx[:, i : i + 1], pos[:, i : i + 1], cache=cache) for i in range(5, seq)]
    torch.testing.assert_close(torch.cat([first, *rest], 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cls", [KVCache, StaticKVCache])
def test_cache_widens_1d_positions_to_grid_points(cls):
    # text first (1-D positions), then an image: the cached text positions become (p, p, p)
    # in a cache built without position_axes (new_cache allocates the grid from the start)
    attn = _mha(MRoPE(HD, sections=SECTIONS, max_len=32))
    pos = _mrope_pos()
    x = torch.randn(2, 13, DIM, generator=_gen(8), dtype=torch.float64)
    full = attn(x, pos)
    cache = cls(layers=1, batch=2, max_len=13, kv_heads=KV, key_dim=HD, value_dim=HD,
                dtype=torch.float64)  # fmt: skip
    assert cache.positions.shape == (2, 13)
    outs = [attn(x[:, :3], cache=cache), attn(x[:, 3:9], pos[:, 3:9], cache=cache)]
    outs.append(attn(x[:, 9:], cache=cache))  # text again, continuing at 6
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="n_axes"):
        attn(x[:, :1], torch.zeros(2, 1, 2, dtype=torch.long), cache=attn.new_cache(2, 4))


def test_bad_positions_raise():
    enc = MRoPE(HD, sections=SECTIONS, max_len=8)
    q = torch.zeros(1, 1, 3, HD)
    with pytest.raises(ValueError, match="n_axes=3"):
        enc(q, q, torch.zeros(1, 3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len=8"):
        enc(q, q, torch.full((1, 3, 3), 8))
    with pytest.raises(ValueError, match="non-negative"):
        enc(q, q, torch.full((1, 3, 3), -1))
    # an encoding that reads a line refuses grid coordinates (no silent broadcasting)
    rope_attn = _mha(RotaryEmbedding(HD, max_len=8))
    x = torch.zeros(2, 3, DIM, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"positions must have shape \(seq,\) or \(batch"):
        rope_attn(x, torch.zeros(2, 3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must have shape"):
        RotaryEmbedding(HD, max_len=8)(q, q, torch.zeros(1, 3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="sections"):
        MRoPE(HD, sections=(2, 2, 3))
    with pytest.raises(ValueError, match="head_dim"):
        AxialRotaryEmbedding(10)
    with pytest.raises(ValueError, match="dim"):
        SinusoidalEncoding2D(10)


# -- derived state -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*ENCODINGS, "sincos_2d"])
def test_derived_state_not_saved_and_rebuilt(name):
    make = (
        (lambda: SinusoidalEncoding2D(DIM, max_len=32)) if name == "sincos_2d" else ENCODINGS[name]
    )
    enc = make()
    assert enc.state_dict() == {}
    ref = {n: b.clone() for n, b in enc.named_buffers()}
    enc.half()
    for n, b in enc.named_buffers():
        torch.testing.assert_close(b, ref[n], rtol=0, atol=0)  # rebuilt exactly, own dtype
    with torch.device("meta"):
        meta = make()
    assert all(b.is_meta for b in meta.buffers())
    meta.to_empty(device="cpu")
    for n, b in meta.named_buffers():
        torch.testing.assert_close(b, ref[n], rtol=0, atol=0)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["axial_half", "mrope_interleaved"])
def test_compile_fullgraph(name):
    enc = ENCODINGS[name]()
    pos = _mrope_pos() if name.startswith("mrope") else _grid_pos(3, 4)
    q = torch.randn(2, HEADS, pos.shape[1], HD, generator=_gen(9))
    k = torch.randn(2, KV, pos.shape[1], HD, generator=_gen(10))
    torch._dynamo.reset()
    compiled = torch.compile(enc, fullgraph=True)
    want = enc(q, k, pos)
    with torch.no_grad():
        got = compiled(q, k, pos)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["axial_interleaved", "mrope"])
def test_attend_with_fewer_queries_than_keys(name):
    # queries and keys at different coordinates: the last 3 queries over all keys equal
    # the last 3 rows of the full attention
    from posenc.torch import attend

    enc = ENCODINGS[name]()
    pos = _mrope_pos() if name == "mrope" else _grid_pos(3, 4)
    seq = pos.shape[1]
    q = torch.randn(2, HEADS, seq, HD, generator=_gen(11), dtype=torch.float64)
    k, v = torch.randn(2, 2, KV, seq, HD, generator=_gen(12), dtype=torch.float64)
    full = attend(q, k, v, enc, k_positions=pos)
    last = attend(q[:, :, -3:], k, v, enc, k_positions=pos)
    torch.testing.assert_close(last, full[:, :, -3:], rtol=1e-12, atol=1e-12)


def test_mrope_from_hf_matches_qwen2vl_rotary_embedding():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    text = dict(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
    )  # fmt: skip
    cfg = transformers.Qwen2VLConfig(text_config=text, bos_token_id=None, eos_token_id=None)
    enc = MRoPE.from_hf(cfg)
    assert (enc.head_dim, enc.sections, enc.base, enc.max_len) == (32, (4, 6, 6), 1e6, 256)
    assert MRoPE.from_hf(cfg.to_dict()).extra_repr() == enc.extra_repr()
    pos = _mrope_pos(1)  # (1, 13, 3)
    q = torch.randn(1, 2, 13, 32, generator=_gen(13))
    cos, sin = Qwen2VLRotaryEmbedding(cfg.text_config)(q, pos.permute(2, 0, 1))  # (3, b, seq)
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)
    torch.testing.assert_close(enc(q, q, pos)[0], want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="mrope_section"):
        MRoPE.from_hf({"hidden_size": 64, "num_attention_heads": 2})


@pytest.mark.compile
def test_flex_backend_cached_decode_with_grid_positions():
    # FlexAttention attends over the whole cache buffer (static shapes): the grid
    # coordinates of the cache pass through it like 1-D positions do
    torch.manual_seed(0)
    enc = MRoPE(HD, sections=SECTIONS, max_len=32)
    flex = MultiHeadAttention(DIM, HEADS, kv_heads=KV, encoding=enc, backend="flex")
    sdpa = MultiHeadAttention(DIM, HEADS, kv_heads=KV, encoding=enc)
    sdpa.load_state_dict(flex.state_dict())
    pos = _mrope_pos()
    x = torch.randn(2, 13, DIM, generator=_gen(14))
    with torch.no_grad():
        full = sdpa(x, pos)
        cache = flex.new_cache(2, 16)
        outs = [flex(x[:, :10], pos[:, :10], cache=cache)]
        outs += [flex(x[:, i : i + 1], cache=cache) for i in range(10, 13)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["axial_half", "mrope"])
def test_integer_queries_and_keys_are_refused(name):
    # rotated in integer arithmetic they would be silently wrong, as for 1-D RoPE
    enc = ENCODINGS[name]()
    pos = _grid_pos(2, 3, batch=1) if name.startswith("axial") else _mrope_pos(batch=1)
    q = torch.ones(1, 2, pos.shape[1], HD, dtype=torch.int64)
    with pytest.raises(ValueError, match="q must be a floating-point tensor, got dtype"):
        enc.encode_qk(q, q, pos, pos)


@pytest.mark.parametrize("cls", [KVCache, StaticKVCache])
@pytest.mark.parametrize("axes", [2, 3])
def test_a_cache_with_position_axes_holds_the_grid_from_the_start(cls, axes):
    # allocated once, (batch, max_len, axes): grid steps and 1-D steps (widened to (p, p, p))
    # write into the same buffer, never a new one (a static cache's addresses stay put)
    cache = cls(layers=1, batch=2, max_len=13, kv_heads=KV, key_dim=HD, value_dim=HD,
                dtype=torch.float64, position_axes=axes)  # fmt: skip
    assert cache.positions.shape == (2, 13, axes) and cache.positions.dtype == torch.long
    if axes != 3:
        return
    buffer = cache.positions.data_ptr()
    attn = _mha(MRoPE(HD, sections=SECTIONS, max_len=32))
    pos = _mrope_pos()
    x = torch.randn(2, 13, DIM, generator=_gen(9), dtype=torch.float64)
    outs = [attn(x[:, :3], cache=cache), attn(x[:, 3:9], pos[:, 3:9], cache=cache)]
    outs.append(attn(x[:, 9:], cache=cache))  # text again, continuing at 6
    torch.testing.assert_close(torch.cat(outs, 1), attn(x, pos), rtol=1e-10, atol=1e-10)
    assert cache.positions.data_ptr() == buffer
    torch.testing.assert_close(
        cache.positions[:, :3], torch.arange(3)[None, :, None].expand(2, 3, 3)
    )
