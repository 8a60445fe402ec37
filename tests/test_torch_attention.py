"""MultiHeadAttention and TransformerLM against the NumPy reference (float64)."""

import numpy as np
import pytest
import torch

import posenc
from posenc.torch import (
    LearnedEncoding,
    MultiHeadAttention,
    NoPE,
    PositionalEncoding,
    SinusoidalEncoding,
    TransformerLM,
    position_tensor,
)

DIM, HEADS, MAX_LEN = 16, 4, 32


def reference_mha(mha, x, causal, padding_mask, bias=None):
    """Plain NumPy multi-head attention with the module's weights."""
    W = mha.qkv.weight.detach().double().numpy()  # (3 dim, dim)
    Wo = mha.out.weight.detach().double().numpy()  # (dim, dim)
    b, n, d = x.shape
    h, hd = mha.heads, d // mha.heads
    q, k, v = (x @ W[i * d : (i + 1) * d].T for i in range(3))  # (b, n, dim) each
    q, k, v = (t.reshape(b, n, h, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
    allowed = posenc.causal_mask(n) if causal else np.ones((n, n), bool)
    allowed = np.broadcast_to(allowed, (b, 1, n, n))
    if padding_mask is not None:
        allowed = (allowed & padding_mask[:, None, None, :]) | np.eye(n, dtype=bool)
    out, _ = posenc.attention(q, k, v, mask=allowed, bias=bias)  # (b, h, n, hd)
    return out.transpose(0, 2, 1, 3).reshape(b, n, d) @ Wo.T


def table_of(encoding):
    if isinstance(encoding, SinusoidalEncoding):
        return posenc.sinusoidal(MAX_LEN, DIM)
    if isinstance(encoding, LearnedEncoding):
        return encoding.weight.detach().double().numpy()
    return np.zeros((MAX_LEN, DIM))


ENCODINGS = {
    "nope": lambda: NoPE(),
    "sinusoidal": lambda: SinusoidalEncoding(DIM, max_len=MAX_LEN),
    "learned": lambda: LearnedEncoding(MAX_LEN, DIM),
}


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_mha_matches_numpy_reference(name, causal, padded):
    torch.manual_seed(0)
    enc = ENCODINGS[name]().double()
    mha = MultiHeadAttention(DIM, HEADS, encoding=enc, causal=causal).double()
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    if padded:  # row 1 is left-padded by 3; its real tokens start at position 0
        padding_mask = torch.tensor([[True] * 7, [False] * 3 + [True] * 4])
        positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 2, 3]])
    else:
        padding_mask, positions = None, None
    with torch.no_grad():
        h = enc.encode_input(x, positions) if enc.places else x
        out = mha(h, positions, padding_mask).numpy()
    pos = np.arange(7)[None].repeat(2, 0) if positions is None else positions.numpy()
    h_ref = x.numpy() + table_of(enc)[pos]
    pm = None if padding_mask is None else padding_mask.numpy()
    np.testing.assert_allclose(out, reference_mha(mha, h_ref, causal, pm), rtol=1e-10, atol=1e-12)
    if padded:  # the real tokens of row 1 equal an unpadded run of them alone
        with torch.no_grad():
            alone = mha(enc.encode_input(x[1:, 3:], None) if enc.places else x[1:, 3:])
        np.testing.assert_allclose(out[1, 3:], alone[0].numpy(), rtol=1e-10, atol=1e-12)


class DistancePenalty(PositionalEncoding):
    """A score-bias encoding defined outside the library: -|m - n| / 4 per head."""

    def score_bias(self, q_positions, k_positions):
        q_positions = position_tensor(q_positions)  # a range or a tensor -> (b|1, n)
        k_positions = position_tensor(k_positions)
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs()  # (b, n, n)
        return -dist[:, None].double() / 4  # (b, 1, n, n)


def test_new_encoding_plugs_in_without_touching_attention():
    torch.manual_seed(1)
    enc = DistancePenalty()
    assert enc.places == ("scores",)
    mha = MultiHeadAttention(DIM, HEADS, encoding=enc, causal=True).double()
    x = torch.randn(1, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        out = mha(x).numpy()
    i = np.arange(6)
    bias = -np.abs(i[:, None] - i[None, :]) / 4
    np.testing.assert_allclose(out, reference_mha(mha, x.numpy(), True, None, bias), atol=1e-12)


def test_places_of_each_encoding():
    assert NoPE().places == ()
    assert SinusoidalEncoding(8).places == ("input",)
    assert LearnedEncoding(4, 8).places == ("input",)


def _perm_check(encoding, causal):
    torch.manual_seed(0)
    mha = MultiHeadAttention(DIM, HEADS, encoding=NoPE(), causal=causal).double()
    x = torch.randn(1, 8, DIM, dtype=torch.float64)
    order = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    with torch.no_grad():
        y = mha(encoding.encode_input(x, None))
        y_p = mha(encoding.encode_input(x[:, order], None))
    return torch.allclose(y_p, y[:, order], atol=1e-12)


def test_permutation_equivariance_only_without_position_and_mask():
    assert _perm_check(NoPE(), causal=False)
    assert not _perm_check(NoPE(), causal=True)  # the causal mask leaks order
    assert not _perm_check(SinusoidalEncoding(DIM, max_len=8).double(), causal=False)
    assert not _perm_check(LearnedEncoding(8, DIM).double(), causal=False)


def test_transformer_lm_shapes_generate_and_max_len():
    torch.manual_seed(0)
    lm = TransformerLM(11, DIM, 2, HEADS, encoding=LearnedEncoding(8, DIM), max_len=8).eval()
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    logits = lm(idx)
    assert logits.shape == (2, 3, 11)
    out = lm.generate(idx, 3)
    assert out.shape == (2, 6) and torch.equal(out[:, :3], idx)
    # greedy: each appended token is the argmax of the logits of its prefix
    assert torch.equal(out[:, 3], lm(idx)[:, -1].argmax(-1))
    with pytest.raises(ValueError, match="sequence length must be <= max_len=8, got 9"):
        lm(torch.zeros(1, 9, dtype=torch.long))


def test_learned_encoding_past_max_len_raises():
    enc = LearnedEncoding(8, DIM)
    with pytest.raises(ValueError, match="positions must be < max_len=8, got 8"):
        enc(torch.zeros(1, 9, DIM))
    lm = TransformerLM(5, DIM, 1, HEADS, encoding=enc)
    with pytest.raises(ValueError, match="positions must be < max_len=8, got 9"):
        lm(torch.zeros(1, 2, dtype=torch.long), positions=torch.tensor([0, 9]))


def test_bad_input():
    with pytest.raises(ValueError, match="dim must be divisible by heads=3, got dim=16"):
        MultiHeadAttention(16, 3)
    with pytest.raises(ValueError, match="encoding must be a PositionalEncoding, got Linear"):
        MultiHeadAttention(16, 4, encoding=torch.nn.Linear(2, 2))
    mha = MultiHeadAttention(16, 4)
    with pytest.raises(
        ValueError, match=r"x must have shape \(batch, seq, dim=16\), got \(2, 5, 12\)"
    ):
        mha(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"positions must have shape \(seq,\) or \(batch, seq\)"):
        mha(torch.randn(2, 5, 16), positions=torch.arange(4))
    with pytest.raises(ValueError, match=r"positions must have shape"):
        mha(torch.randn(2, 5, 16), positions=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="padding_mask must be a bool tensor of shape"):
        mha(torch.randn(2, 5, 16), padding_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq, dim=16\)"):
        SinusoidalEncoding(16)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"idx must have shape \(batch, seq\)"):
        TransformerLM(5, 16, 1, 4, encoding=NoPE())(torch.zeros(5, dtype=torch.long))


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_mha_with_rope_matches_numpy_reference(pairing):
    from posenc.torch import RotaryEmbedding

    torch.manual_seed(3)
    rot = RotaryEmbedding(DIM // HEADS, pairing=pairing, max_len=MAX_LEN)
    mha = MultiHeadAttention(DIM, HEADS, encoding=rot, causal=True).double()
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 2, 3]])
    padding_mask = torch.tensor([[True] * 7, [False] * 3 + [True] * 4])
    with torch.no_grad():
        out = mha(x, positions, padding_mask).numpy()
    # reference: project, rotate q and k with the NumPy RoPE, attend with posenc.attention
    W = mha.qkv.weight.detach().numpy()
    q, k, v = (x.numpy() @ W[i * DIM : (i + 1) * DIM].T for i in range(3))
    q, k, v = (t.reshape(2, 7, HEADS, -1).transpose(0, 2, 1, 3) for t in (q, k, v))
    pos = positions.numpy()[:, None, :]  # (batch, 1, seq) broadcast over heads
    q, k = (posenc.rope(t, pos, pairing=pairing) for t in (q, k))
    allowed = (posenc.causal_mask(7) & padding_mask.numpy()[:, None, None, :]) | np.eye(
        7, dtype=bool
    )
    ref, _ = posenc.attention(q, k, v, mask=allowed)
    ref = ref.transpose(0, 2, 1, 3).reshape(2, 7, DIM) @ mha.out.weight.detach().numpy().T
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)  # float32 cos/sin tables
