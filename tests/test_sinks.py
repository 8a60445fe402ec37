"""Attention sinks (GPT-OSS's learned logit per head) against transformers' own attention.

The oracle is ``eager_attention_forward`` of ``transformers.models.gpt_oss`` in float64 (the
sink concatenated to the scores, the softmax taken, its column dropped); the caches are
checked against a full forward of the same model.
"""

from __future__ import annotations

import types

import pytest
import torch

from posenc.torch import Layer, MultiHeadAttention, RotaryEmbedding, Schedule, TransformerLM, attend

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward  # noqa: E402

B, H, KVH, N, D = 2, 4, 2, 11, 8


def _hf(q, k, v, sinks, mask):
    """HF's GPT-OSS attention: ``(b, h, sq, d)`` from SDPA-order tensors and an additive mask."""
    module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=q.shape[1] // k.shape[1],
                                   training=False)  # fmt: skip
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2)  # (b, h, sq, d)


def _additive(allowed, dtype=torch.float64):
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))


def _qkv(dtype=torch.float64, sq=N, sk=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, sq, D, generator=g, dtype=dtype)
    k, v = (torch.randn(B, KVH, sk, D, generator=g, dtype=dtype) for _ in range(2))
    sinks = 2 * torch.randn(H, generator=g, dtype=dtype)  # weights of the order of the scores
    return q, k, v, sinks


def _causal(sq, sk, window=None):
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None]
    ok = j <= i
    return ok if window is None else ok & (j > i - window)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("sq", [N, 1, 3])
def test_sinks_equal_gpt_oss_attention_in_float64(sq, window):
    q, k, v, sinks = _qkv(sq=sq)
    want = _hf(q, k, v, sinks, _additive(_causal(sq, N, window))[None, None])
    got = attend(q, k, v, sinks=sinks, window=window, backend="sdpa")
    assert (got - want).abs().max() < 1e-12
    plain = attend(q, k, v, window=window, backend="sdpa")
    assert (plain - want).abs().max() > 1e-2  # the sinks take weight here


def test_sinks_with_rope_padding_and_bidirectional():
    q, k, v, sinks = _qkv()
    rope = RotaryEmbedding(D, max_len=32)
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[0, :3] = False  # three left-padded keys in the first row
    qe, ke = rope.encode_qk(q, k, range(N), range(N))
    allowed = _causal(N, N)[None, None] & pad[:, None, None, :]
    allowed = allowed | torch.eye(N, dtype=torch.bool)  # a padded query sees itself
    want = _hf(qe, ke, v, sinks, _additive(allowed))
    got = attend(q, k, v, rope, sinks=sinks, padding_mask=pad, k_positions=range(N))
    assert (got - want).abs().max() < 1e-12
    want = _hf(q, k, v, sinks, None)  # every key visible
    assert (attend(q, k, v, sinks=sinks, causal=False) - want).abs().max() < 1e-12


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("sq", [N, 1])
def test_flex_sinks_equal_gpt_oss_attention(sq, window):
    """FlexAttention (float32: its kernels take no float64) against HF's float64."""
    q, k, v, sinks = _qkv(sq=sq)
    want = _hf(q, k, v, sinks, _additive(_causal(sq, N, window))[None, None])
    with torch.no_grad():
        got = attend(q.float(), k.float(), v.float(), sinks=sinks.float(), window=window,
                     backend="flex")  # fmt: skip
    assert ((got.double() - want).abs().max() / want.abs().max()) < 1e-6


def test_sink_gradients_equal_hf():
    q, k, v, sinks = _qkv()
    mask = _additive(_causal(N, N))[None, None]
    grads = []
    for run in (lambda *t: _hf(*t, mask), lambda q, k, v, s: attend(q, k, v, sinks=s)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        (run(*leaves) * torch.linspace(-1, 1, D, dtype=torch.float64)).sum().backward()
        grads.append([t.grad for t in leaves])
    for want, got in zip(*grads, strict=True):
        assert (got - want).abs().max() < 1e-12


def test_bad_sinks_are_refused_by_name():
    q, k, v, _ = _qkv()
    with pytest.raises(ValueError, match=r"sinks must have shape \(4,\)"):
        attend(q, k, v, sinks=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="sinks must be a floating tensor"):
        attend(q, k, v, sinks=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="sinks must be True or False"):
        MultiHeadAttention(16, 4, sinks="yes")
    with pytest.raises(ValueError, match="sinks must be True or False"):
        Layer(sinks=1)
    with pytest.raises(ValueError, match="no encoding, window, chunk or sinks"):
        Layer(attention=False, sinks=True)


def _lm(backend="sdpa", dtype=torch.float64):
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, max_len=64)
    sched = Schedule([Layer(rope, sinks=True, window=6), Layer(rope, sinks=True)])
    lm = TransformerLM(50, 32, 2, 4, kv_heads=2, schedule=sched, backend=backend).to(dtype)
    with torch.no_grad():
        for block in lm.blocks:
            block.attn.sinks.normal_(0, 2)
    return lm.eval()


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_cached_decoding_with_sinks_equals_a_full_forward(backend, static):
    dtype = torch.float64 if backend == "sdpa" else torch.float32
    lm = _lm(backend, dtype)
    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = lm(ids)  # (2, 20, vocab)
        cache = lm.new_cache(2, 20, static=static)
        steps = [lm(ids[:, :8], cache=cache)] + [lm(ids[:, i : i + 1], cache=cache)
                                                 for i in range(8, 20)]  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert (torch.cat(steps, 1) - full).abs().max() < tol


def test_sinks_are_parameters_that_train_and_survive_meta_init():
    lm = _lm()
    names = [n for n, _ in lm.named_parameters() if n.endswith("sinks")]
    assert names == ["blocks.0.attn.sinks", "blocks.1.attn.sinks"]
    ids = torch.randint(0, 50, (2, 9))
    torch.nn.functional.cross_entropy(lm(ids).flatten(0, 1), ids.flatten()).backward()
    assert all(b.attn.sinks.grad.abs().sum() > 0 for b in lm.blocks)
    with torch.device("meta"):
        attn = MultiHeadAttention(16, 4, sinks=True)
    attn = attn.to_empty(device="cpu")
    attn.load_state_dict(MultiHeadAttention(16, 4, sinks=True).state_dict())
    assert attn.sinks.shape == (4,) and "sinks=True" in repr(attn)


def test_schedule_from_hf_gives_gpt_oss_its_sinks():
    cfg = transformers.GptOssConfig(num_hidden_layers=2, hidden_size=32, head_dim=8,
                                    num_attention_heads=4, num_key_value_heads=2).to_dict()
    s = Schedule.from_hf(cfg)
    assert [layer.sinks for layer in s] == [True, True]
    assert [layer.window for layer in s] == [128, None]  # alternating 128-token windows
    llama = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
                                     num_attention_heads=4).to_dict()  # fmt: skip
    assert [layer.sinks for layer in Schedule.from_hf(llama)] == [False, False]


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


def test_use_refuses_sinks_a_model_does_not_have():
    from posenc.hf import use

    rope = RotaryEmbedding(8, max_len=64)
    with pytest.raises(ValueError, match="gives it learned sinks, which LlamaAttention does not"):
        use(_tiny_llama(), Schedule([Layer(rope, sinks=True)] * 2))


def test_a_second_use_is_refused_as_such_after_the_rotary_way():
    from posenc.hf import use

    model = use(_tiny_llama(), RotaryEmbedding(8, base=5e5, max_len=64))
    assert model.posenc_path == "rotary"
    with pytest.raises(ValueError, match="was called on this model before"):
        use(model, RotaryEmbedding(8, max_len=64))


def test_every_model_type_with_learned_sinks_is_known():
    """transformers' attention classes that hold ``self.sinks = nn.Parameter(...)`` are
    the model types ``Schedule.from_hf`` gives sinks (a new one would otherwise be built
    without them, silently)."""
    import pathlib
    import re

    from posenc.hf.schedule import SINKS

    models = pathlib.Path(transformers.__file__).parent / "models"
    found = {f.parent.name for f in models.glob("*/modeling_*.py")
             if re.search(r"self\.sinks\s*=\s*nn\.Parameter", f.read_text())}  # fmt: skip
    assert found == set(SINKS)
