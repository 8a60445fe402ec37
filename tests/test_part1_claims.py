"""Every number printed in series part 1, as a test (source seed in each docstring)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc


def test_flat_lines_seed_000():
    """seeds/000: seq_len 15, d_model 8: all pairs at distance k share one dot product."""
    pe = posenc.sinusoidal(15, 8)
    gram = pe @ pe.T
    for k in range(1, 15, 2):
        dots = np.diagonal(gram, offset=k)
        np.testing.assert_allclose(dots, posenc.sinusoidal_dot(k, 8), rtol=0, atol=1e-14)
    # golden: sum_i cos(omega_i) for d = 8, omega = (1, 0.1, 0.01, 0.001)
    assert f"{posenc.sinusoidal_dot(1, 8):.4f}" == "3.5353"


def test_mha_permutation_seed_001():
    """seeds/001: nn.MultiheadAttention(32, 4), 6 tokens, permutation [2, 0, 4, 1, 5, 3]."""
    torch.manual_seed(42)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(1, 6, 32)
    order = torch.tensor([2, 0, 4, 1, 5, 3])
    with torch.no_grad():
        out, _ = mha(x, x, x)
        out_p, _ = mha(x[:, order], x[:, order], x[:, order])
    diff = (out - out_p[:, torch.argsort(order)]).abs()
    assert diff.mean().item() < 1e-6 and diff.max().item() < 1e-5


def test_norm_is_sqrt_half_dim_seed_001():
    """seeds/001 magnitude analysis: PE norm 8.0000 for d = 128, at every position."""
    norms = np.linalg.norm(posenc.sinusoidal(10_000, 128), axis=1)
    np.testing.assert_allclose(norms, 8.0, rtol=0, atol=1e-12)


def test_unique_positions_and_dot_with_zero_seed_001():
    """seeds/001 properties: 1000 unique rows (d = 64); dot with position 0 falls."""
    pe = posenc.sinusoidal(1000, 64)
    assert len(np.unique(pe, axis=0)) == 1000
    dots = [pe[0] @ pe[k] for k in (1, 2, 5, 10, 20, 50)]
    assert all(a > b for a, b in zip(dots, dots[1:], strict=False))
    np.testing.assert_allclose(dots, posenc.sinusoidal_dot([1, 2, 5, 10, 20, 50], 64))


def test_shift_k5_predicts_pe10_seed_001():
    """seeds/001: predict PE[10] from PE[5] with k = 5; error ~1e-16 (seed: 5.14e-16)."""
    pe = posenc.sinusoidal(11, 64)
    assert np.linalg.norm(posenc.shift_operator(5, 64) @ pe[5] - pe[10]) < 1e-14


def test_shift_k7_from_42_seed_003():
    """seeds/003: T_7 from position 42, and max error over positions 0-99."""
    pe = posenc.sinusoidal(107, 64)
    T7 = posenc.shift_operator(7, 64)
    assert np.abs(T7 @ pe[42] - pe[49]).max() < 1e-13
    assert np.abs(pe[7:107] - pe[:100] @ T7.T).max() < 1e-13


def test_min_pairwise_distance_seed_003():
    """seeds/003: minimum distance among 1000 positions (d = 64) and where it occurs."""
    pe = posenc.sinusoidal(1000, 64)
    sq = (pe**2).sum(1)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * pe @ pe.T, 0))
    np.fill_diagonal(dist, np.inf)
    # every neighbour pair is at the same distance sqrt(d - 2 sum cos omega_i)
    expected = np.sqrt(64 - 2 * posenc.sinusoidal_dot(1, 64))
    assert f"{dist.min():.4f}" == f"{expected:.4f}" == "1.4718"
    a, b = np.unravel_index(dist.argmin(), dist.shape)
    assert abs(int(a) - int(b)) == 1


def test_numpy_attention_equivariance_seed_003():
    """seeds/003: 7 x 4 input, rows 2 and 5 swapped: Attention(PX) == P Attention(X)."""
    rng = np.random.default_rng(42)
    X = rng.random((7, 4))
    W = [rng.random((4, 4)) for _ in range(3)]
    P = posenc.permutation_matrix([0, 4, 2, 3, 1, 5, 6])

    def attn(X):
        return posenc.attention(X @ W[0], X @ W[1], X @ W[2])[0]

    np.testing.assert_allclose(attn(P @ X), P @ attn(X), atol=1e-12)
    pe = posenc.sinusoidal(7, 4)
    assert np.abs(attn(P @ X + pe) - P @ attn(X + pe)).max() > 1e-2


def test_gap4_similarity_grows_seed_003():
    """seeds/003: naive PE (pos added to every dim): gap-4 similarity grows with position."""
    rng = np.random.default_rng(42)
    emb = rng.random((100, 512)) + np.arange(100)[:, None]
    sims = np.einsum("id,id->i", emb[:-4], emb[4:])
    assert np.all(np.diff(sims) > 0)
    assert sims[-1] / sims[0] > 1000


def test_wavelength_limits_seed_003():
    """seeds/003: wavelengths 2*pi ~ 6.3 up to 2*pi*10000 ~ 62,832 (the limit as d grows)."""
    for d in (4, 64, 512, 4096):
        wl = posenc.wavelengths(d)
        assert f"{wl[0]:.1f}" == "6.3"
        assert wl[-1] < 2 * np.pi * 1e4
    assert f"{2 * np.pi * 1e4:,.0f}" == "62,832"
    assert posenc.wavelengths(4096)[-1] / (2 * np.pi * 1e4) > 0.995


def test_dog_bites_man_scores_permute_without_pe_seed_002():
    """seeds/002: without PE the score matrices are permutations of each other."""
    emb = np.eye(3, 4)
    a, b = emb[[0, 1, 2]], emb[[2, 1, 0]]
    swap = [2, 1, 0]
    np.testing.assert_array_equal(a @ a.T, (b @ b.T)[np.ix_(swap, swap)])
    pe = posenc.sinusoidal(3, 4)
    sa, sb = (a + pe) @ (a + pe).T, (b + pe) @ (b + pe).T
    assert not np.allclose(sa, sb[np.ix_(swap, swap)])
    assert abs(sa[1, 0] - sb[1, 0]) > 0.5  # "bites" scores the first word differently


def test_cat_sat_sum_seed_002():
    """seeds/002: X_final = token_embedding + PE for "The cat sat" (d_model = 4)."""
    tokens = np.array([[0.2, 0.5, -0.1, 0.8], [0.7, -0.3, 0.6, 0.1], [-0.4, 0.9, 0.2, -0.5]])
    seed = [
        [0.200, 1.500, -0.100, 1.800],
        [1.541, 0.240, 0.610, 1.099],
        [0.509, 0.484, 0.220, 0.499],
    ]
    np.testing.assert_allclose(tokens + posenc.sinusoidal(3, 4), seed, atol=1.1e-3)


def test_rope_preview_depends_on_offset_only():
    """Part 1 teaser: (T_m q).(T_n k) depends only on n - m."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal(64), rng.standard_normal(64)

    def score(m, n):
        return (posenc.shift_operator(m, 64) @ q) @ (posenc.shift_operator(n, 64) @ k)

    np.testing.assert_allclose([score(m, m + 3) for m in (0, 10, 500)], score(0, 3), rtol=1e-9)


# -- property tests over random positions, offsets, dims and bases -----------------------
dims = st.integers(1, 64).map(lambda h: 2 * h)
bases = st.floats(2.0, 1e6)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(0, 10_000), k=st.integers(0, 5_000), dim=dims, base=bases)
def test_dot_closed_form_property(p, k, dim, base):
    pe = posenc.sinusoidal([p, p + k], dim, base=base)
    dot = pe[0] @ pe[1]
    # depends on the gap only, and is even in it
    assert np.isclose(dot, posenc.sinusoidal_dot(k, dim, base=base), rtol=0, atol=1e-9 * dim)
    assert np.isclose(dot, posenc.sinusoidal_dot(-k, dim, base=base), rtol=0, atol=1e-9 * dim)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(0, 10_000), k=st.integers(0, 5_000), dim=dims, base=bases)
def test_shift_operator_property(p, k, dim, base):
    T = posenc.shift_operator(k, dim, base=base)
    pe = posenc.sinusoidal([p, p + k], dim, base=base)
    np.testing.assert_allclose(T @ pe[0], pe[1], rtol=0, atol=1e-8)
    np.testing.assert_allclose(T @ T.T, np.eye(dim), rtol=0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(a=st.floats(-1e3, 1e3), b=st.floats(-1e3, 1e3), dim=dims)
def test_shift_operators_compose(a, b, dim):
    np.testing.assert_allclose(
        posenc.shift_operator(a, dim) @ posenc.shift_operator(b, dim),
        posenc.shift_operator(a + b, dim),
        rtol=0,
        atol=1e-9,
    )


# -- attention and permutation matrices: values and bad input ------------------------------
def test_attention_golden_and_rows_sum_to_one():
    out, w = posenc.attention(np.eye(2), np.eye(2), np.array([[1.0], [3.0]]))
    e = np.exp(1 / np.sqrt(2))  # score 1/sqrt(2) on the diagonal, 0 off it
    np.testing.assert_allclose(w, [[e / (e + 1), 1 / (e + 1)], [1 / (e + 1), e / (e + 1)]])
    np.testing.assert_allclose(out[:, 0], w @ [1.0, 3.0])


def test_attention_mask_bias_and_stability():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 2, 5, 4))
    out, w = posenc.attention(q, k, v, mask=posenc.causal_mask(5))
    assert np.allclose(np.triu(w, 1), 0) and np.allclose(w.sum(-1), 1)
    np.testing.assert_allclose(out[:, 0], v[:, 0])  # first query sees only the first key
    bias = np.zeros((5, 5))
    bias[:, 2] = 1e4  # a huge bias must not overflow: all weight on key 2
    _, w = posenc.attention(q, k, v, bias=bias)
    np.testing.assert_allclose(w[..., 2], 1.0)
    _, w_big = posenc.attention(1e3 * q, k, v)
    assert np.isfinite(w_big).all()


def test_attention_bad_input():
    with pytest.raises(ValueError, match="q and k must share head_dim"):
        posenc.attention(np.ones((3, 4)), np.ones((3, 5)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="k and v must share seq_k"):
        posenc.attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="mask leaves a query with no key"):
        posenc.attention(
            np.ones((2, 4)),
            np.ones((2, 4)),
            np.ones((2, 1)),
            mask=np.array([[True, False], [False, False]]),
        )


def test_causal_mask_values():
    np.testing.assert_array_equal(posenc.causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="seq_k must be >= 3, got 2"):
        posenc.causal_mask(3, 2)


def test_permutation_matrix():
    P = posenc.permutation_matrix([2, 0, 1])
    X = np.arange(6).reshape(3, 2)
    np.testing.assert_array_equal(P @ X, X[[2, 0, 1]])
    np.testing.assert_array_equal(P.T @ P, np.eye(3))
    for bad in ([0, 0, 1], [1, 2, 3], [[0, 1]], [0.0, 1.0]):
        with pytest.raises(ValueError, match="perm must be a permutation of 0..n-1"):
            posenc.permutation_matrix(bad)


def test_shift_and_dot_bad_input():
    with pytest.raises(ValueError, match="k must be finite, got inf"):
        posenc.shift_operator(np.inf, 4)
    with pytest.raises(ValueError, match="k must be a real number"):
        posenc.shift_operator("a", 4)
    with pytest.raises(ValueError, match="dim must be even, got 5"):
        posenc.shift_operator(1, 5)
    with pytest.raises(ValueError, match="offset must be finite"):
        posenc.sinusoidal_dot([1, np.nan], 4)
    with pytest.raises(ValueError, match="base must be a positive finite number, got 0.0"):
        posenc.sinusoidal_dot(1, 4, base=0)
