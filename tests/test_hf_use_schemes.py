"""posenc.hf.use with schemes HF does not have, on a Llama: exact, cached, padded, packed, trained.

Oracle: the Llama decoder computed here from its own modules with posenc's ``attend`` on each
layer's q, k, v (``hf_use_models.llama_by_hand``), and greedy decoding by a full forward per
token (no cache). Plus saving and reloading, and the refusals.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from hf_use_models import V, build, greedy_without_cache, llama_by_hand, llama_config, rel

from posenc.hf import from_pretrained, use
from posenc.torch import FIRE, KERPLE, ALiBi, Layer, PoPE, RotaryEmbedding, Schedule, XPos
from posenc.torch import T5RelativeBias as T5

H, D, L = 4, 8, 4
SCHEMES = {
    "alibi": lambda: ALiBi(H),
    "t5": lambda: T5(H),
    "kerple": lambda: KERPLE(H),
    "fire": lambda: FIRE(H),
    "xpos": lambda: XPos(D),
    "pope": lambda: PoPE(D, H),
    "nope_every_4th": lambda: Schedule(
        [Layer(None) if (i + 1) % 4 == 0 else Layer(RotaryEmbedding(D)) for i in range(L)]
    ),
}


def _schedule(name):
    s = SCHEMES[name]()
    s = s if isinstance(s, Schedule) else Schedule.uniform(s, L)
    for enc in s.encodings:
        enc.to(torch.float64)
        for p in enc.parameters():  # learned encodings away from their zero start
            torch.nn.init.normal_(p, std=0.5, generator=torch.Generator().manual_seed(7))
    return s


def _ids(b, n, seed):
    return torch.randint(1, V, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_logits_equal_posenc_attend_on_hfs_own_q_k_v_in_every_layer(name):
    s = _schedule(name)
    model = use(build(llama_config()), s)
    assert model.posenc_path == "attention"
    ids = _ids(2, 24, 1)
    with torch.no_grad():
        assert rel(model(ids).logits, llama_by_hand(model, s, ids)) < 1e-6


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_cached_generate_equals_a_full_forward_per_token(name):
    model = use(build(llama_config()), _schedule(name))
    ids = _ids(2, 10, 2)
    kw = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, **kw), greedy_without_cache(model, ids, 10))
        full = model(torch.cat([ids, ids], 1), use_cache=False).logits[:, -1]
        first = model(ids, use_cache=True)
        out = model(ids, past_key_values=first.past_key_values, use_cache=True).logits[:, -1]
        assert rel(out, full) < 1e-6  # the cached step's logits, not only its argmax


@pytest.mark.parametrize("name", ["alibi", "fire", "xpos", "nope_every_4th"])
def test_left_padded_generate_equals_each_row_alone(name):
    model = use(build(llama_config()), _schedule(name))
    a, b = _ids(1, 9, 3), _ids(1, 6, 4)
    ids = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        both = model.generate(ids, attention_mask=mask, **kw)
        assert torch.equal(both[0, 9:], model.generate(a, **kw)[0, 9:])
        assert torch.equal(both[1, 9:], model.generate(b, **kw)[0, 6:])


@pytest.mark.parametrize("name", ["alibi", "t5", "nope_every_4th"])
def test_packed_position_ids_keep_documents_apart(name):
    # DataCollatorWithFlattening's convention: one row, position_ids restarting at 0
    model = use(build(llama_config()), _schedule(name))
    a, b = _ids(1, 7, 5), _ids(1, 5, 6)
    pos = torch.cat([torch.arange(7), torch.arange(5)])[None]
    with torch.no_grad():
        packed = model(torch.cat([a, b], 1), position_ids=pos).logits
        assert rel(packed[:, :7], model(a).logits) < 1e-6
        assert rel(packed[:, 7:], model(b).logits) < 1e-6


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_training_runs_and_the_loss_falls_over_50_steps(name):
    from posenc.experiments.text_data import corpus, train_batch

    cfg = llama_config(vocab_size=256)
    torch.manual_seed(0)
    model = use(transformers.LlamaForCausalLM(copy.deepcopy(cfg)), SCHEMES[name]()).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data, gen = corpus("train"), torch.Generator().manual_seed(0)
    losses = []
    for _ in range(50):
        x, _ = train_batch(data, 32, 8, gen, passkeys=0)  # (8, 32) bytes
        loss = model(x, labels=x).loss  # HF shifts the labels itself
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses[::10]


@pytest.mark.parametrize("name", ["t5", "fire", "nope_every_4th"])
def test_save_and_reload_give_the_same_logits_and_hf_alone_refuses(name, tmp_path):
    model = use(build(llama_config()), _schedule(name))
    model.save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="posenc"):  # HF alone would build a RoPE Llama
        transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    again = from_pretrained(transformers.LlamaForCausalLM, tmp_path, SCHEMES[name](),
                            dtype=torch.float64)  # fmt: skip
    ids = _ids(2, 12, 8)
    with torch.no_grad():
        assert rel(again(ids).logits, model(ids).logits) < 1e-12


def test_a_rope_scheme_saves_as_hfs_own_config():
    from posenc.scaling import YaRN

    rope = RotaryEmbedding(D, scaling=YaRN(4.0, 16), max_len=256)
    model = use(build(llama_config()), rope)
    assert model.posenc_path == "rotary"
    assert model.config.rope_parameters["rope_type"] == "yarn"


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="3 layers, the model num_hidden_layers=4"):
        use(build(llama_config()), Schedule([Layer(ALiBi(H))] * 3))
    with pytest.raises(ValueError, match="head_dim=16"):
        use(build(llama_config()), XPos(16))
    with pytest.raises(ValueError, match="heads=3"):
        use(build(llama_config()), ALiBi(3))
    with pytest.raises(ValueError, match="scheme must be"):
        use(build(llama_config()), "alibi")
    from posenc.torch import SinusoidalEncoding

    with pytest.raises(ValueError, match="input embeddings"):
        use(build(llama_config()), SinusoidalEncoding(32))
    model = use(build(llama_config()), ALiBi(H))
    with pytest.raises(ValueError, match="before"):
        use(model, ALiBi(H))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2))
    with pytest.raises(ValueError, match="rotary_emb"):
        use(gpt2, ALiBi(2))
    dropout = use(build(llama_config(attention_dropout=0.1)), ALiBi(H)).train()
    with pytest.raises(ValueError, match="dropout"):
        dropout(_ids(1, 4, 0))


def test_path_asks_for_a_way_in_or_refuses_it():
    rope = RotaryEmbedding(D)
    assert use(build(llama_config()), rope, path="attention").posenc_path == "attention"
    assert use(build(llama_config()), rope).posenc_path == "rotary"
    with pytest.raises(ValueError, match="path='rotary'"):
        use(build(llama_config()), ALiBi(H), path="rotary")
    with pytest.raises(ValueError, match="path must be"):
        use(build(llama_config()), rope, path="fast")


def test_position_ids_written_in_place_are_read_again():
    # the positions are read once per tensor: a buffer rewritten in place is a new reading
    model = use(build(llama_config()), ALiBi(H))
    ids, pos = _ids(1, 8, 9), torch.arange(8)[None]
    with torch.no_grad():
        model(ids, position_ids=pos)
        pos.copy_(torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]]))  # two packed documents now
        assert torch.equal(model(ids, position_ids=pos).logits,
                           model(ids, position_ids=pos.clone()).logits)  # fmt: skip
