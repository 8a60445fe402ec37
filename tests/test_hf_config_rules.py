"""Per-layer rules of particular model types, read from the ``config.json`` people download,
against transformers' own config classes (the oracle: ``Config.from_dict`` of the same file).

Each case varies what a saved file may or may not hold (a key left out so the class default
applies, a depth where the pattern shows, a ``layer_types`` unlike the default pattern, the
smallest accepted value) and asks posenc's schedule for what HF's config object says; a
refusal must name the key as a word (not inside another name).
"""

from __future__ import annotations

import re

import pytest

from posenc.hf import schedule_from_hf

transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 64, "vocab_size": 64, "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2}  # fmt: skip


def _names(key):
    """A ``match=`` pattern for an error that names ``key`` as a whole word."""
    return rf"(?<![\w.]){re.escape(key)}(?!\w)"


def _windows(config):
    """Per layer, the window HF's attention gets from a config object (None: full)."""
    return [config.sliding_window if t == "sliding_attention" else None
            for t in config.layer_types]  # fmt: skip


def _modernbert(**given):
    """A saved ModernBERT-decoder config.json without its layer keys, plus ``given``."""
    from transformers import ModernBertDecoderConfig

    saved = ModernBertDecoderConfig(**TINY, cls_token_id=1, sep_token_id=2).to_dict()
    for key in ("layer_types", "sliding_window", "global_attn_every_n_layers", "local_attention"):
        saved.pop(key, None)  # what a file may leave out: the class default then
    return saved | given


@pytest.mark.parametrize(
    "given",
    [
        {"num_hidden_layers": 7},  # every 3rd layer full (the class default), window 128 // 2
        {"num_hidden_layers": 7, "global_attn_every_n_layers": 2, "local_attention": 9},
        {"num_hidden_layers": 4, "global_attn_every_n_layers": 1, "local_attention": 2},
        {"num_hidden_layers": 4, "local_attention": 6,
         "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"]},  # unlike the default pattern
    ],
    ids=["defaults", "every-2", "every-1", "layer-types"],
)  # fmt: skip
def test_modernbert_decoder_layers_are_those_of_its_config_class(given):
    from transformers import ModernBertDecoderConfig

    saved = _modernbert(**given)
    want = _windows(ModernBertDecoderConfig.from_dict(dict(saved)))
    assert [layer["window"] for layer in schedule_from_hf(saved)["layers"]] == want


@pytest.mark.parametrize(
    "given, key",
    [
        ({"local_attention": 1}, "local_attention"),  # window 1 // 2 = 0: no key at all
        ({"local_attention": 0}, "local_attention"),  # HF: sliding_window = -1
        ({"global_attn_every_n_layers": 0}, "global_attn_every_n_layers"),
    ],
)  # fmt: skip
def test_modernbert_decoder_values_hf_cannot_use_are_refused_by_name(given, key):
    saved = _modernbert(num_hidden_layers=3, **given)
    with pytest.raises(ValueError, match=_names(key)):
        schedule_from_hf(saved)


@pytest.mark.parametrize(
    "given",
    [
        {"first_k_dense_replace": 2},  # layer 2, full attention, is the first sparse one
        {},  # no dense prefix: no layer is forced to rotate
        {"first_k_dense_replace": 2, "prefix_dense_sliding_window_pattern": 2},  # none forced
    ],
    ids=["dense-2", "no-prefix", "pattern-2"],
)  # fmt: skip
def test_cohere2_moe_rotates_where_its_attention_does(given):
    # Cohere2MoeAttention rotates ``if self.sliding_window is not None or self.force_rope``;
    # force_rope on the dense prefix (mlp_layer_types, which the class derives from
    # first_k_dense_replace when a file leaves it out) when the prefix pattern is 1
    from test_schedule_from_hf import _attention_layers, _has_rope
    from transformers import Cohere2MoeConfig

    from posenc.torch import Schedule

    kinds = ["full_attention"] * 3 + ["sliding_attention"]
    saved = Cohere2MoeConfig(**TINY, num_hidden_layers=4, sliding_window=4).to_dict()
    saved = {
        k: v for k, v in saved.items() if k not in ("mlp_layer_types", "first_k_dense_replace")
    }
    saved |= {"layer_types": kinds} | given
    attentions = _attention_layers("cohere2_moe", "Cohere2MoeAttention",
                                   Cohere2MoeConfig.from_dict(dict(saved)))  # fmt: skip
    want = [a.sliding_window is not None or a.force_rope for a in attentions]
    schedule = Schedule.from_hf(saved)
    assert [_has_rope(schedule.encoding_of(i)) for i in range(4)] == want


@pytest.mark.parametrize("keep", [0, -3])
def test_doge_keep_window_size_below_one_is_refused_by_name(keep):
    # DogeAttention keeps the top keep_window_size keys per query: none kept is no attention
    saved = transformers.AutoConfig.for_model("doge", **TINY, num_hidden_layers=1).to_dict()
    saved |= {"sliding_window": 3, "keep_window_size": keep}
    with pytest.raises(ValueError, match=rf"^keep_window_size must be >= 1, got {keep}$"):
        schedule_from_hf(saved)


@pytest.mark.parametrize("given", [{"keep_window_size": 1, "sliding_window": 1}, {}],
                         ids=["keep-1", "class-default"])  # fmt: skip
def test_doge_reads_keep_window_size_as_its_class_does(given):
    # a file without keep_window_size keeps the class default: a query seeing exactly that
    # many keys (its RoPE's max_len) is read, one more is refused
    cls = transformers.CONFIG_MAPPING["doge"]
    keep = given.get("keep_window_size", cls().keep_window_size)
    saved = cls(**TINY, num_hidden_layers=1).to_dict()
    del saved["keep_window_size"]
    saved |= given
    for seen, ok in ((keep, True), (keep + 1, False)):
        if "sliding_window" not in given:
            saved["max_position_embeddings"] = seen
        elif not ok:
            saved["sliding_window"] = seen
        if ok:
            (layer,) = schedule_from_hf(saved)["layers"]
            assert min(n for n in (layer["window"], layer["rope"]["max_len"]) if n) == keep
        else:
            with pytest.raises(ValueError, match=rf"keep_window_size={keep}: layer 0 lets"):
                schedule_from_hf(saved)


def test_doge_refusal_names_what_a_query_sees():
    cls = transformers.CONFIG_MAPPING["doge"]
    saved = cls(**TINY, num_hidden_layers=1).to_dict() | {"keep_window_size": 2,
                                                          "sliding_window": 3}  # fmt: skip
    with pytest.raises(ValueError) as err:
        schedule_from_hf(saved)
    assert str(err.value) == (
        "Schedule.from_hf cannot reproduce doge with keep_window_size=2: layer 0 lets a query "
        "see 3 keys (sliding_window=3, max_position_embeddings=64), and where they outnumber "
        "keep_window_size HF keeps the top ones by a content score (a dynamic mask), which no "
        "position scheme expresses: set sliding_window or max_position_embeddings <= "
        "keep_window_size"
    )


@pytest.mark.parametrize("given", [{}, {"global_head_dim": 384}], ids=["default", "384"])
def test_gemma4_full_layer_width_of_a_file_without_per_layer_config(given):
    # Gemma4TextConfig derives per_layer_config: head_dim = global_head_dim (default 512) on
    # the full-attention layers; the oracle is HF's attention built from the same file
    from test_schedule_from_hf import _attention_layers
    from test_schedule_from_hf_rows import _rope

    from posenc.torch import Schedule

    saved = transformers.Gemma4TextConfig(num_hidden_layers=6).to_dict()
    for key in ("per_layer_config", "global_head_dim"):
        saved.pop(key, None)
    saved |= given
    back = transformers.Gemma4TextConfig.from_dict(dict(saved))
    want = [a.head_dim for a in _attention_layers("gemma4", "Gemma4TextAttention", back)]
    assert len(set(want)) == 2  # the full layers' width differs from the sliding ones'
    s = Schedule.from_hf(saved)
    assert [_rope(s.encoding_of(i)).head_dim for i in range(6)] == want


def _dots3_without_sliding_widths():
    """A Dots 3 config.json as saved, less what gives its sliding layers their widths."""
    saved = transformers.Dots3NoteTextConfig(num_hidden_layers=3).to_dict()
    for key in ("per_layer_config", "swa_head_dim", "swa_qk_nope_head_dim",
                "swa_qk_rope_head_dim"):  # fmt: skip
        saved.pop(key, None)
    return saved


@pytest.mark.parametrize("given", [{}, {"swa_head_dim": 224, "swa_qk_nope_head_dim": 128}],
                         ids=["default", "given"])  # fmt: skip
def test_dots3_sliding_slice_of_a_file_without_per_layer_config(given):
    # Dots3NoteTextConfig gives its sliding layers swa_head_dim (256), swa_qk_nope_head_dim
    # (192) and swa_qk_rope_head_dim (their difference) where a file gives no per_layer_config
    from test_schedule_from_hf import _attention_layers

    from posenc.torch import ChannelSlice, Schedule

    saved = _dots3_without_sliding_widths() | given
    back = transformers.Dots3NoteTextConfig.from_dict(dict(saved))
    attentions = _attention_layers("dots3_note", "Dots3NoteTextAttention", back)
    s = Schedule.from_hf(saved)
    for i, attn in enumerate(attentions):
        sliced = next(m for m in s.encoding_of(i).modules() if isinstance(m, ChannelSlice))
        assert (sliced.start, sliced.width) == (attn.qk_nope_head_dim, attn.qk_rope_head_dim), i


@pytest.mark.parametrize(
    "given",
    [{"swa_qk_rope_head_dim": 32}, {"per_layer_config": {"2": {"head_dim": 256,
     "qk_nope_head_dim": 192, "qk_rope_head_dim": 32}}}],
    ids=["swa", "per_layer_config"],
)  # fmt: skip
def test_dots3_sliding_widths_that_do_not_add_up_are_refused_as_hf_does(given):
    # Dots3NoteTextConfig: "SWA head_dim must equal qk_nope_head_dim + qk_rope_head_dim"; posenc
    # read the given rotated width and built a 32-wide slice of a 256-wide head HF never builds
    from posenc.torch import Schedule

    saved = _dots3_without_sliding_widths() | given
    with pytest.raises(Exception, match="SWA head_dim must equal"):  # a validation error
        transformers.Dots3NoteTextConfig.from_dict(dict(saved))
    with pytest.raises(ValueError, match=r"layer 2 \(sliding_attention\): head_dim=256 must be "
                       r"qk_nope_head_dim \+ qk_rope_head_dim, got 192 \+ 32"):  # fmt: skip
        Schedule.from_hf(saved)


def test_falcon_without_an_alibi_key_rotates_as_its_class_default():
    # FalconConfig's alibi defaults to False: a config.json without the key rotates (RoPE in
    # FalconAttention), as one with "alibi": false does; with "alibi": true posenc refuses
    from test_schedule_from_hf import _has_rope

    from posenc.torch import Schedule

    saved = transformers.FalconConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2
    ).to_dict()
    saved.pop("alibi")
    assert transformers.FalconConfig.from_dict(dict(saved)).alibi is False
    s = Schedule.from_hf(saved)
    assert [_has_rope(s.encoding_of(i)) for i in range(2)] == [True, True]
    with pytest.raises(ValueError, match="ALiBi"):
        Schedule.from_hf(saved | {"alibi": True})


def test_a_file_without_num_hidden_layers_is_refused_as_hf_refuses_it():
    # a Gemma 3 config.json without num_hidden_layers: the class default (26) disagrees with
    # its 4 layer_types and HF refuses it; posenc does too, naming the key (only NemotronH
    # counts its layers from its layer types: a property of its class)
    from posenc.torch import Schedule

    saved = transformers.Gemma3TextConfig(
        num_hidden_layers=4, hidden_size=64, num_attention_heads=2, head_dim=32
    ).to_dict()
    saved.pop("num_hidden_layers")
    with pytest.raises(Exception, match=r"`num_hidden_layers` \(26\) must be equal"):
        transformers.Gemma3TextConfig.from_dict(dict(saved))
    with pytest.raises(ValueError, match="num_hidden_layers >= 1, got None"):
        Schedule.from_hf(saved)
