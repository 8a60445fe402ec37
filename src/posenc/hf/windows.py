"""Which model types' attention a ``sliding_window`` reaches at all: one table, its sources.

Every config class of transformers 5.23.0 accepts a ``sliding_window`` (and ``layer_types``)
keyword and keeps it, but only some modeling code builds a sliding mask from it: a
``LlamaConfig(sliding_window=3, layer_types=[..., "sliding_attention"])`` runs a ``LlamaModel``
whose every layer attends to every earlier token (``create_causal_mask``, never
``sliding_window``). :func:`posenc.hf.layers.prepare` drops the window of a model type HF knows
(:data:`posenc.hf.model_types.MODEL_TYPES`) that is not in :data:`WINDOWED`; a model type HF
does not know (a custom model) keeps its window as given. ``tests/test_window_readers.py``
checks the table against the masks of HF's tiny models and a scan of HF's modeling code.
Pure Python: transformers is not imported.
"""

from __future__ import annotations

from posenc.hf.model_types import MODEL_TYPES

# The model types whose modeling code applies config.sliding_window to the attention mask:
# model type -> how. The source rule: models/<dir>/modeling_<dir>.py builds the mask of the
# model class of that config with create_sliding_window_causal_mask (the look-back window
# q - k < sliding_window), create_bidirectional_sliding_window_mask or an overlay of its own;
# a model whose forward builds only create_causal_mask ignores the window: Llama, Gemma,
# Qwen3-VL-MoE's and Qwen3-Omni-MoE's text models, ...; Moshi and Kyutai STT too (only their
# DynamicCache keeps the last sliding_window - 1 keys while decoding), and OLMoE, PaddleOCR-VL's
# text model and DeepSeek-OCR 2's encoder, whose attention passes ``sliding_window=`` on to
# flash attention only (eager and SDPA attend to every earlier token): posenc follows eager.
# "type": the layers of layer_types "sliding_attention" (or the config class's rule for them,
# posenc.hf.layers.layer_types) -- a {"full_attention": create_causal_mask, "sliding_attention":
# create_sliding_window_causal_mask} mapping in the model's forward;
# "every": every attention layer (posenc.hf.settled.SLIDE_EVERY_LAYER);
# "both": windows that look both ways (refused: BIDIRECTIONAL below, NO_SCHEDULE,
# or for their RoPE -- except T5Gemma's module config and T5Gemma 2's text config, whose
# decoder's windows look back and encoder's both ways: posenc reads them looking back);
# "own": a rule of its own (its mask reads the window; posenc reads those types as before).
WINDOWED = {
    **dict.fromkeys((
        "afmoe", "beam", "cohere2", "cohere2_moe", "cohere_compass_text", "cwm", "deepseek_v4",
        "diffusion_gemma_text", "dots1", "dots3_note_text", "exaone4", "exaone_moe", "flint",
        "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text",
        "gpt_oss", "granite_swa", "granitemoe_swa", "kolibri1", "laguna", "lfm3", "mellum",
        "mimo_v2_flash", "ministral", "modernbert-decoder", "muse_glimmer_text",
        "muse_spark_text", "olmo3", "qwen2", "qwen2_5_omni_text", "qwen2_5_omni_talker",
        "qwen2_5_vl_text", "qwen2_moe", "qwen2_vl_text", "qwen3", "recurrent_gemma", "smollm3",
        "step3p5", "t5gemma2_decoder", "vaultgemma", "zaya",
    ), "type"),
    **dict.fromkeys((
        "mistral", "mixtral", "minimax", "ministral3", "phi3", "phi4_multimodal", "phimoe",
        "qwen3_moe", "starcoder2", "doge", "blt_patcher", "voxtral_realtime_text",
        "voxtral_realtime_encoder", "mimi", "mimi_encoder", "mimi_decoder",
        "pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_encoder",
        "pocket_tts_audio_tokenizer_decoder",
    ), "every"),
    # ModernBertModel, UltraBertModel, MuseGlimmerAssistantModel, EmbeddingGemma2TextModel,
    # NeoMMEModel, OpenAIPrivacyFilterModel, DiffusionGemmaDecoderModel, the Gemma 4
    # assistants, T5Gemma's and T5Gemma 2's encoders (create_bidirectional_sliding_window_mask);
    # EsmFold2's atom encoder and MoonshineStreamingEncoder (bidirectional overlays)
    **dict.fromkeys((
        "modernbert", "ultrabert", "muse_glimmer_assistant", "embedding_gemma2_text", "neomme",
        "openai_privacy_filter", "diffusion_gemma", "gemma4_assistant",
        "gemma4_unified_assistant", "t5_gemma_module", "t5gemma2_text", "esmfold2",
        "moonshine_streaming_encoder",
    ), "both"),
    # InklingTextModel, Inkling2TextModel: "hybrid_sliding" layers, sliding_window_size (refused:
    # posenc.hf.defaults.UNSUPPORTED); UnlimitedOcrTextModel: "reference_sliding_attention"
    # (the prefill and a window over generated keys: refused, posenc.hf.settled.MASK_OF_TYPE);
    # BltModel: local_attention_window_len for its local encoder and decoder (refused:
    # posenc.hf.schedule.NO_SCHEDULE); NemotronAsrStreamingEncoder: a left context of
    # sliding_window - 1; Gemma4AudioModel: sliding_window_mask_function
    **dict.fromkeys((
        "inkling_text", "inkling2_text", "unlimited_ocr_text", "blt", "blt_local_encoder",
        "blt_local_decoder", "nemotron_asr_streaming_encoder", "gemma4_audio",
    ), "own"),
    # multimodal configs whose text model is one of the above (posenc reads their
    # text_config; a flat one is read as before)
    **dict.fromkeys((
        "gemma3", "gemma3n", "gemma4", "gemma4_unified", "paligemma", "qwen2_vl", "qwen2_5_vl",
        "qwen2_5_omni", "qwen2_5_omni_thinker", "inkling_mm_model", "inkling2", "muse_glimmer",
        "muse_spark", "cohere_compass", "dots3_note", "step3p7", "t5gemma", "t5gemma2",
        "unlimited_ocr", "voxtral_realtime", "embedding_gemma2", "exaone4_5",
    ), "text model"),
}  # fmt: skip

# Windows that look both ways (|i - j| <= w), which posenc's look-back windows cannot build:
# model types whose windows always do, and why (OpenAI's privacy filter, whose every layer
# does, is refused whole: posenc.hf.schedule.NO_SCHEDULE); posenc.hf.layers.refuse_bidirectional
# refuses them
BIDIRECTIONAL = {
    "modernbert": "ModernBertModel's local attention is create_bidirectional_sliding_window_mask "
                  "(|i - j| <= local_attention // 2)",
    "ultrabert": "UltraBertModel's sliding layers use create_bidirectional_sliding_window_mask",
    "muse_glimmer_assistant": "MuseGlimmerAssistantModel's sliding layers use "
                              "create_bidirectional_sliding_window_mask",
    "embedding_gemma2_text": "EmbeddingGemma2TextModel's sliding layers use "
                             "create_bidirectional_sliding_window_mask",
    "neomme": "NeoMMEModel's sliding layers use create_bidirectional_sliding_window_mask",
}  # fmt: skip
# ... and those whose windows do where a config flag is set: model type -> (flag, why)
BIDIRECTIONAL_FLAG = {
    # Gemma3TextModel (EmbeddingGemma): or_mask_function=_bidirectional_window_overlay
    "gemma3_text": "Gemma3TextModel ORs its sliding masks with |i - j| < sliding_window",
    # Step3p7's text model (a step3p5 config): the same overlay
    "step3p5": "its text model ORs its sliding masks with |i - j| < sliding_window",
}


def applies_window(model_type):
    """Whether HF's model of ``model_type`` applies a config's ``sliding_window`` to its
    attention (``True`` for a model type transformers 5.23.0 does not know).

    Examples
    --------
    >>> from posenc.hf.windows import applies_window
    >>> applies_window("gemma2"), applies_window("llama"), applies_window("my_custom_model")
    (True, False, True)
    """
    return model_type in WINDOWED or model_type not in MODEL_TYPES
