"""What transformers assumes where a config is silent: the defaults of its config classes.

Data only, checked against every config class of the pinned transformers in
``tests/test_from_hf.py`` (a table entry that stops matching fails there).
"""

from __future__ import annotations

HF_VERSION = "5.23.0"
#: ``configuration_utils.ALLOWED_LAYER_TYPES`` of transformers 5.23.0 (its config classes
#: refuse any other entry of ``layer_types``)
LAYER_TYPES = (
    "full_attention", "sliding_attention", "chunked_attention", "window_attention",
    "indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention",
    "minimax_m3_sparse", "conv", "moe", "hybrid", "hybrid_sliding",
    "reference_sliding_attention", "linear_attention", "sparse", "dense",
)  # fmt: skip
#: ``"default"`` plus the keys of ``ROPE_INIT_FUNCTIONS`` in transformers 5.23.0.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
NO_EQUIVALENT = {  # named in transformers 5.23.0 but not a 1-D RoPE posenc can express
    "axial": "'axial' is the multi-axis RoPE of vision models (2-D/3-D positions)",
    # what posenc.hf.use writes into a model's config where the scheme runs in posenc's
    # attention (posenc.hf.saved): HF then refuses to build the model without posenc
    "posenc": "the config of a model that posenc.hf.use changed (its scheme runs in "
              "posenc's attention): load it with posenc.hf.from_pretrained(model_class, "
              "path, scheme)",
}
# Model types whose rotation posenc cannot express, and why (from_hf refuses them by name)
UNSUPPORTED = {
    "nanochat": "its rotate_half returns (x2, -x1): the rotation turns the other way "
                "(sin negated), which posenc's RoPE does not offer",
    **dict.fromkeys(("inkling_text", "inkling2_text"),
        "it has no RoPE: its positions are a relative bias mixed per token from the hidden "
        "states (d_rel, rel_extent; sliding_window_size on 'hybrid_sliding' layers), short "
        "convolutions of keys and values, and a log-scaled query temperature "
        "(log_scaling_n_floor), which posenc does not build from a config"),
    # DiTAttention and DiTDecoderLayer (modeling_qwen2_5_omni.py)
    "qwen2_5_omni_dit": "its DiTAttention rotates the first head only (as interleaved pairs: "
                        "deinterleave_head_dim, then the half-split rotation), and its "
                        "attention is bidirectional within blocks of block_size "
                        "(look_ahead_layers, look_backward_layers), which posenc does not "
                        "build from a config",
    "deepseek_v4": "its RoPE rotates the trailing channels of each head inside its own apply "
                   "function with per-layer 'main' and 'compress' rates (compressed sparse "
                   "attention), which posenc does not build from a config",
}  # fmt: skip
# GPTNeoXConfig / GPTNeoXJapaneseConfig: `rotary_emb_base` and `rotary_pct` (default below)
NEOX_PCT = {"gpt_neox": 0.25, "gpt_neox_japanese": 1.0}
# Phi3Config declares a top-level original_max_position_embeddings (default 4096), which
# standardize_rope_params copies over the one in rope_scaling
CLASS_ORIGINAL = {"phi3": 4096}
# Config classes whose partial_rotary_factor is not 1.0 by default (their __post_init__
# sets it); tests/test_from_hf.py checks this against every class of transformers 5.23.0
CLASS_PARTIAL = {
    "bamba": 0.5, "dots3_note_audio_encoder": 0.5, "glm": 0.5, "glm4": 0.5, "glm4_moe": 0.5,
    "glm4v_moe_text": 0.5, "glmasr_encoder": 0.5, "moonshine": 0.9, "moonshine_streaming": 0.8,
    "musicflamingo": 0.2, "nemotron": 0.5, "nemotron3_5_transcribe_asr_audio": 0.5,
    "nemotron3_5_transcribe_word_timestamp": 0.5, "persimmon": 0.5, "phi": 0.5,
    "qwen3_5_moe_text": 0.25, "qwen3_5_text": 0.25, "qwen3_next": 0.25, "recurrent_gemma": 0.5,
    "stablelm": 0.25, "efficientloftr": 4.0,
}  # fmt: skip
# The only model types whose rotary class reads partial_rotary_factor for rope_type "default"
# (its own compute_default_rope_parameters takes int(head_dim * factor), and its attention
# rotates that slice): every other class's default init ignores the factor and rotates the
# whole head (Llama, Qwen2, Mistral, Gemma 3, OLMo 3, ...). The scaled types' inits
# (modeling_rope_utils.ROPE_INIT_FUNCTIONS) read it for every model type. Source:
# models/*/modeling_*.py of transformers 5.23.0, checked in tests/test_from_hf_probe_fixes.py
PARTIAL_DEFAULT = frozenset(
    """
    bamba deepseek_v4 diffusion_gemma diffusion_gemma_text dots3_note dots3_note_text
    dots3_note_audio_encoder efficientloftr glm glm4 glm4_moe glm4_moe_lite glm4v glm4v_text
    glm4v_moe glm4v_moe_text glm_image glm_image_text glm_ocr glm_ocr_text glmasr
    glmasr_encoder gpt_neox gpt_neox_japanese laguna mellum mimo_v2_flash minimax_m2
    minimax_m3_vl minimax_m3_vl_text moonshine moonshine_streaming moonshine_streaming_encoder
    musicflamingo nemotron nemo_speechlm nemotron3_5_transcribe_asr_audio
    nemotron3_5_transcribe_audio nemotron3_5_transcribe_word_timestamp nemotron3_diarization
    nemotron3_diarization_audio neomme persimmon phi phi3 phi4_multimodal qwen3_5 qwen3_5_text
    qwen3_5_moe qwen3_5_moe_text qwen3_next qwen4_exp qwen4_exp_text recurrent_gemma
    solar_open stablelm step3p5 step3p7 zaya
    """.split()
)
# ... and those that derive it from other keys: a dict without it cannot be read alone
DERIVED_PARTIAL = {
    "mistral4": "qk_rope_head_dim / head_dim",
    "minimax_m2": "rotary_dim / head_dim",
    "deepseek_v4": "qk_rope_head_dim / head_dim",
}
# ... of which these derive it only from a legacy key, if present (else the whole head)
LEGACY_PARTIAL = ("minimax_m2",)
# Config classes whose head_dim default is a number, not hidden_size // num_attention_heads
# (Gemma: 256, Qwen3: 128, ...): a dict without head_dim gets the class default, as HF's
# class does; tests/test_from_hf.py checks this against every class of transformers 5.23.0
CLASS_HEAD_DIM = {
    **dict.fromkeys(("axk2", "minicpm3"), 32),
    **dict.fromkeys(("axk1", "bailing_hybrid", "deepseek_v2", "deepseek_v3", "deepseek_v32",
        "gemma4_vision", "glm4_moe_lite", "glm_moe_dsa", "gpt_oss", "hy_v4", "kimi_linear",
        "kosmos_2_5_vision_model", "longcat_flash", "mistral_large4_text", "muse_spark_text",
        "neomme", "neucodec", "openai_privacy_filter", "qwen2_5_omni_dit",
        "voxtral_realtime_encoder", "xcodec2", "youtu"), 64),
    **dict.fromkeys(("molmo2_adapter", "molmo2_vision"), 72),
    **dict.fromkeys(("timesfm", "timesfm2_5"), 80),
    **dict.fromkeys(("afmoe", "canary_decoder", "cohere2_moe", "cosmos3_edge_text", "cwm",
        "dia_decoder", "dia_encoder", "ernie4_5", "flint", "glm", "glm4", "helium",
        "higgs_audio_v2", "hrm_text", "hy_v3", "inkling2_text", "inkling_text", "internlm3",
        "iquestcoder", "jetmoe", "kolibri1", "laguna", "lfm3", "llama4_text", "mellum",
        "minimax_m2",
        "minimax_m3_vl_text", "ministral3", "mistral4", "molmo2_text", "muse_glimmer_assistant",
        "muse_glimmer_text", "nemotron_h", "paddleocr_vl_text", "pe_audio_encoder",
        "pe_audio_video_encoder", "pe_video_encoder", "qwen2_5_omni_talker", "qwen3",
        "qwen3_omni_moe_talker_code_predictor", "qwen3_vl_text", "seed_oss", "solar_open",
        "step3p5", "zaya"), 128),
    **dict.fromkeys(("mimo_v2_flash",), 192),
    **dict.fromkeys(("diffusion_gemma_text", "embedding_gemma2_text", "gemma", "gemma2",
        "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "qwen3_5_moe_text",
        "qwen3_5_text", "qwen3_next", "qwen4_exp_text", "t5_gemma_module", "t5gemma2_decoder",
        "t5gemma2_text", "vaultgemma"), 256),
    **dict.fromkeys(("deepseek_v4",), 512),
    **dict.fromkeys(("musicflamingo",), 1280),
}  # fmt: skip
# Config classes whose sliding_window default is a number (their dataclass field): a dict
# without the key gets it, as HF's class does (its __post_init__ rules then apply: Qwen2's
# use_sliding_window, ...); tests/test_from_hf_probe_fixes.py checks every class
CLASS_WINDOW = {
    **dict.fromkeys(("moshi_depth",), 8),
    **dict.fromkeys(("nemotron_asr_streaming_encoder",), 71),
    **dict.fromkeys(("deepseek_v4", "esmfold2", "gpt_oss", "granite_swa", "granitemoe_swa",
        "openai_privacy_filter", "ultrabert", "unlimited_ocr_text"), 128),
    **dict.fromkeys(("mimo_v2_flash",), 129),
    **dict.fromkeys(("mimi", "mimi_decoder", "mimi_encoder", "pocket_tts_audio_tokenizer",
        "pocket_tts_audio_tokenizer_decoder", "pocket_tts_audio_tokenizer_encoder"), 250),
    **dict.fromkeys(("lfm3", "neomme"), 256),
    **dict.fromkeys(("kyutai_speech_to_text",), 375),
    **dict.fromkeys(("beam", "blt_patcher", "diffusion_gemma_text", "embedding_gemma2_text",
        "gemma3n_text", "gemma4_text", "laguna"), 512),
    **dict.fromkeys(("flint", "kolibri1"), 513),
    **dict.fromkeys(("voxtral_realtime_encoder",), 750),
    **dict.fromkeys(("afmoe", "gemma4_unified_text", "mellum"), 1024),
    **dict.fromkeys(("muse_glimmer_assistant", "muse_glimmer_text", "muse_spark_text"), 2048),
    **dict.fromkeys(("moshi",), 3000),
    **dict.fromkeys(("cohere2", "cohere2_moe", "cohere_compass_text", "deepseek_ocr2_encoder",
        "dots1", "exaone4", "exaone_moe", "gemma2", "gemma3_text", "ministral", "mistral",
        "olmo3", "qwen2", "qwen2_5_vl_text", "qwen2_moe", "qwen2_vl_text", "qwen3", "qwen3_moe",
        "t5_gemma_module", "t5gemma2_decoder", "t5gemma2_text", "vaultgemma",
        "voxtral_realtime_text"), 4096),
    **dict.fromkeys(("cwm",), 8192),
    **dict.fromkeys(("qwen2_5_omni_talker", "qwen2_5_omni_text"), 32768),
}  # fmt: skip
# Multi-head latent attention (DeepSeek-V2 and its kin): the class sets head_dim to the RoPE
# part of a head, qk_rope_head_dim (its default: CLASS_HEAD_DIM), overriding a given head_dim
# (ROPE_PART_HEAD_DIM) or only where the config gives none (ROPE_PART_HEAD_DIM_DEFAULT);
# Mistral 4's default is the whole query-key head, qk_nope_head_dim + qk_rope_head_dim (class
# defaults 64 + 64). tests/test_from_hf.py checks each against its transformers class
ROPE_PART_HEAD_DIM = frozenset(("axk2", "bailing_hybrid", "deepseek_v2", "deepseek_v32",
    "glm_moe_dsa", "hy_v4", "minicpm3", "mistral_large4_text"))  # fmt: skip
ROPE_PART_HEAD_DIM_DEFAULT = frozenset(("axk1", "deepseek_v3", "glm4_moe_lite", "kimi_linear",
    "youtu"))  # fmt: skip
QK_HEAD_DIM_DEFAULT = {"mistral4": (64, 64)}
WITH_ORIGINAL = ("llama3", "yarn", "longrope")
# Config classes with no maximum length at all (RecurrentGemma attends through a local
# window and rotates any position): the size of posenc's table (pass max_len= for more)
CLASS_MAX_LEN = {"recurrent_gemma": 65536}
# Pairing: the modeling code of these model types rotates adjacent pairs (x[2i], x[2i + 1])
# whatever the config says (``rotate_half`` over ``x[..., ::2]`` and ``x[..., 1::2]``, or a
# complex multiply); tools/atlas.py checks every entry against transformers' own code
INTERLEAVED = frozenset(
    """
    axk2 bailing_hybrid blt blt_patcher cohere cohere2 cohere2_moe deepseek_v2 deepseek_v32
    dots3_note_text ernie4_5 ernie4_5_moe ernie4_5_vl_moe_text glm glm4 glm_moe_dsa
    glm_ocr_text helium llama4 llama4_text longcat_flash mistral_large4 mistral_large4_text
    moonshine moonshine_streaming openai_privacy_filter pe_audio_encoder
    pe_audio_video_encoder pe_video_encoder
    """.split()
)
# ... and these choose by a config key: model type -> (key, its class default); a true value
# means adjacent pairs (DeepSeek-V3 permutes them into halves before HF's rotate_half)
PAIRING_KEYS = {
    **dict.fromkeys(("axk1", "deepseek_v3", "glm4_moe_lite", "mistral4", "youtu"),
                    ("rope_interleave", True)),
}  # fmt: skip
# ... and these rotate halves (HF's rotate_half), checked by tools/atlas.py (a multimodal
# model's top-level type included; internlm2, a remote-code model, by its own code): a
# model type in none of the three tables is refused (its pairing is unknown to posenc)
HALF = frozenset(
    """
    afmoe apertus arcee aria aria_text bamba bitnet chameleon cosmos3_edge cosmos3_edge_text
    csm cwm dbrx deepseek_ocr2 deepseek_ocr2_encoder deepseek_ocr2_text dia dia_decoder
    diffllama diffusion_gemma diffusion_gemma_text doge dots1 dots3_note_audio_encoder
    embedding_gemma2 embedding_gemma2_text emu3 emu3_text_model esm esmc eurobert evolla
    exaone4 exaone_moe falcon falcon_h1 flex_olmo flint gemma gemma2 gemma3 gemma3_text
    gemma3n gemma3n_text gemma4 gemma4_text gemma4_unified gemma4_unified_text glmasr
    gpt_neox gpt_neox_japanese gpt_oss gradium_phonon_tts granite granite4_vision
    granite4_vision_text granite_docling granite_docling_text granite_swa granitemoe
    granitemoe_swa granitemoehybrid granitemoeshared gte higgs_audio_v2 hrm_text
    hunyuan_v1_dense hunyuan_v1_moe hy_v3 hy_v4 hyperclovax idefics internlm2 jais2 jetmoe
    jina_embeddings_v3 kolibri1 kyutai_speech_to_text laguna lasr lasr_encoder lfm2 lfm2_moe
    lfm3 llama mellum mimi mimo_v2_flash minicpm3 minimax minimax_m2 minimax_m3_vl
    minimax_m3_vl_text ministral ministral3 mistral mixtral mllama mllama_text_model
    modernbert modernbert-decoder modernbert_decoder molmo2 molmo2_text moshi muse_glimmer
    muse_glimmer_assistant muse_glimmer_text muse_spark muse_spark_text nemotron
    nemotron3_5_transcribe nemotron3_5_transcribe_asr_audio nemotron3_diarization
    nemotron3_diarization_audio neomme neucodec nomic_bert olmo olmo2 olmo3 olmo_hybrid
    olmoe paddleocr_vl paddleocr_vl_text persimmon phi phi3 phi4_multimodal phimoe
    pocket_tts pocket_tts_audio_tokenizer qwen2 qwen2_5_omni qwen2_5_omni_dit
    qwen2_5_omni_text qwen2_5_vl qwen2_5_vl_text qwen2_moe qwen2_vl qwen2_vl_text qwen3
    qwen3_5 qwen3_5_moe qwen3_5_moe_text qwen3_5_text qwen3_moe qwen3_next qwen3_vl
    qwen3_vl_moe qwen3_vl_moe_text qwen3_vl_text qwen4_exp qwen4_exp_text recurrent_gemma
    seed_oss smollm3 solar_open stablelm starcoder2 step3p5 step3p7 t5_gemma_module t5gemma
    t5gemma2 t5gemma2_decoder t5gemma2_text timesfm2_5 ultrabert unlimited_ocr
    unlimited_ocr_text vaultgemma voxtral_realtime voxtral_realtime_text xcodec2 zamba2 zaya
    """.split()
)
