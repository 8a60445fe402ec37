"""What transformers assumes where a config is silent: the defaults of its config classes.

Data only, checked against every config class of the pinned transformers in
``tests/test_from_hf.py`` (a table entry that stops matching fails there).
"""

from __future__ import annotations

HF_VERSION = "5.23.0"
#: ``"default"`` plus the keys of ``ROPE_INIT_FUNCTIONS`` in transformers 5.23.0.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
NO_EQUIVALENT = {  # named in transformers 5.23.0 but not a 1-D RoPE posenc can express
    "axial": "'axial' is the multi-axis RoPE of vision models (2-D/3-D positions)",
}
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
# ... and those that derive it from other keys: a dict without it cannot be read alone
DERIVED_PARTIAL = {
    "mistral4": "qk_rope_head_dim / head_dim",
    "minimax_m2": "rotary_dim / head_dim",
    "deepseek_v4": "qk_rope_head_dim / head_dim",
}
# Config classes whose head_dim default is a number, not hidden_size // num_attention_heads
# (Gemma: 256, Qwen3: 128, ...): a dict without head_dim gets the class default, as HF's
# class does; tests/test_from_hf.py checks this against every class of transformers 5.23.0
CLASS_HEAD_DIM = {
    **dict.fromkeys(("axk2", "minicpm3"), 32),
    **dict.fromkeys(("axk1", "bailing_hybrid", "deepseek_v2", "deepseek_v3", "deepseek_v32",
        "gemma4_vision", "glm_moe_dsa", "gpt_oss", "hy_v4", "kimi_linear",
        "kosmos_2_5_vision_model", "longcat_flash", "mistral_large4_text", "muse_spark_text",
        "neomme", "neucodec", "openai_privacy_filter", "qwen2_5_omni_dit",
        "voxtral_realtime_encoder", "xcodec2", "youtu"), 64),
    **dict.fromkeys(("molmo2_adapter", "molmo2_vision"), 72),
    **dict.fromkeys(("timesfm", "timesfm2_5"), 80),
    **dict.fromkeys(("afmoe", "canary_decoder", "cohere2_moe", "cosmos3_edge_text", "cwm",
        "dia_decoder", "dia_encoder", "ernie4_5", "flint", "glm", "glm4", "helium",
        "higgs_audio_v2", "hrm_text", "hy_v3", "inkling2_text", "inkling_text", "internlm3",
        "iquestcoder", "kolibri1", "laguna", "lfm3", "llama4_text", "mellum", "minimax_m2",
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
WITH_ORIGINAL = ("llama3", "yarn", "longrope")
# M-RoPE as the model's rotary class fixes it, whatever the config says: model type ->
# (interleaved sections, the class's default mrope_section); tests/test_from_hf_mrope.py
# checks each against transformers' own rotary class and apply function
_QWEN2_VL, _QWEN3_VL = (False, (16, 24, 24)), (True, (24, 20, 20))
MROPE_CLASS = {
    **dict.fromkeys(("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"), _QWEN2_VL),
    **dict.fromkeys(("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"), _QWEN3_VL),
}
