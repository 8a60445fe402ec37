"""Every model type transformers 5.23.0 knows: its config classes' ``model_type``.

:mod:`posenc.hf.windows` reads a sliding window only where HF's modeling code applies one; a
model type outside this list is none of HF's (a custom model's), and its window is read as
given. ``tests/test_window_readers.py`` checks the list against ``CONFIG_MAPPING`` and the
``model_type`` of every configuration file. Pure Python: transformers is not imported.
"""

from __future__ import annotations

# CONFIG_MAPPING_NAMES' keys and every ``model_type = "..."`` of models/*/configuration_*.py
MODEL_TYPES = frozenset("""
    EvollaModel afmoe aimv2 aimv2_text_model aimv2_vision_model albert align align_text_model
    align_vision_model altclip altclip_text_model altclip_vision_model apertus arcee aria
    aria_text audio-spectrogram-transformer audioflamingo3 audioflamingo3_encoder autoformer
    axk1 axk2 aya_vision bailing_hybrid bamba bark bart beam beit bert bert-generation big_bird
    bigbird_pegasus biogpt bit bitnet blenderbot blenderbot-small blip blip-2 blip_2_qformer
    blip_2_vision_model blip_text_model blip_vision_model bloom blt blt_global_transformer
    blt_local_decoder blt_local_encoder blt_patcher bridgetower bridgetower_text_model
    bridgetower_vision_model bros camembert canary canary_decoder canine chameleon
    chameleon_vqgan chinese_clip chinese_clip_text_model chinese_clip_vision_model chmv2 clap
    clap_audio_model clap_text_model clip clip_text_model clip_vision_model clipseg
    clipseg_text_model clipseg_vision_model clvp clvp_decoder clvp_encoder coarse_acoustics
    codegen cohere cohere2 cohere2_moe cohere2_vision cohere_asr cohere_compass
    cohere_compass_text cohere_compass_vision colmodernvbert colpali colqwen2 conditional_detr
    convbert convnext convnextv2 cosmos3_edge cosmos3_edge_text cosmos3_edge_vision cosmos3_omni
    cpmant csm csm_depth_decoder_model ctrl cvt cwm d_fine dab-detr dac data2vec-audio
    data2vec-text data2vec-vision dbrx deberta deberta-v2 decision_transformer deepseek_ocr2
    deepseek_ocr2_encoder deepseek_ocr2_sam_vision_model deepseek_ocr2_text deepseek_ocr2_vision
    deepseek_v2 deepseek_v3 deepseek_v32 deepseek_v4 deepseek_vl deepseek_vl_hybrid
    deformable_detr deimv2 deit depth_anything depth_pro detr dia dia_decoder dia_encoder
    diffllama diffusion_gemma diffusion_gemma_text dinat dinov2 dinov2_with_registers
    dinov3_convnext dinov3_vit distilbert doge donut-swin dots1 dots3_note
    dots3_note_audio_encoder dots3_note_text dots3_note_vision_encoder dpr dpt edgetam
    edgetam_mask_decoder edgetam_prompt_encoder edgetam_video edgetam_video_mask_decoder
    edgetam_video_prompt_encoder edgetam_vision_model efficientloftr efficientnet electra
    embedding_gemma2 embedding_gemma2_text emu3 emu3_text_model emu3_vqgan encodec
    encoder-decoder eomt eomt_dinov3 ernie ernie4_5 ernie4_5_moe ernie4_5_vl_moe
    ernie4_5_vl_moe_text ernie4_5_vl_moe_vision esm esmc esmfold2 eurobert evolla exaone4
    exaone4_5 exaone4_5_vision exaone_moe falcon falcon_h1 falcon_mamba fast_vlm
    fastspeech2_conformer fastspeech2_conformer_hifigan fastspeech2_conformer_with_hifigan
    fine_acoustics flaubert flava flava_image_codebook flava_image_model flava_multimodal_model
    flava_text_model flex_olmo flint florence2 florence_vision fnet focalnet fsmt fun_asr_nano
    fun_asr_nano_encoder funnel fuyu gemma gemma2 gemma3 gemma3_text gemma3n gemma3n_audio
    gemma3n_text gemma3n_vision gemma4 gemma4_assistant gemma4_audio gemma4_text gemma4_unified
    gemma4_unified_assistant gemma4_unified_audio gemma4_unified_text gemma4_unified_vision
    gemma4_vision git git_vision_model glm glm4 glm46v glm4_moe glm4_moe_lite glm4v glm4v_moe
    glm4v_moe_text glm4v_moe_vision glm4v_text glm4v_vision glm5_next glm5_next_text
    glm5_next_vision glm_image glm_image_text glm_image_vision glm_image_vqmodel glm_moe_dsa
    glm_ocr glm_ocr_text glm_ocr_vision glmasr glmasr_encoder glmga glpn got_ocr2
    got_ocr2_vision gpt-sw3 gpt2 gpt_bigcode gpt_neo gpt_neox gpt_neox_japanese gpt_oss gptj
    gradium_phonon_tts granite granite4_vision granite4_vision_text granite_docling
    granite_docling_text granite_docling_vision granite_speech granite_speech5_ctc
    granite_speech5_encoder granite_speech_encoder granite_speech_plus
    granite_speech_plus_encoder granite_swa granitemoe granitemoe_swa granitemoehybrid
    granitemoeshared grounding-dino groupvit groupvit_text_model groupvit_vision_model gte
    helium hgnet_v2 hiera higgs_audio_v2 higgs_audio_v2_tokenizer hrm_text hubert
    hunyuan_v1_dense hunyuan_v1_moe hunyuan_vl hunyuan_vl_text hunyuan_vl_vision hy_v3 hy_v4
    hyperclovax hyperclovax_vision_v2 ibert idefics idefics2 idefics2_perceiver idefics2_vision
    idefics3 idefics3_vision idefics_perciever idefics_vision ijepa imagegpt informer inkling2
    inkling2_text inkling2_vision inkling_audio inkling_mm_model inkling_text inkling_vision
    instructblip instructblip_qformer instructblip_vision_model instructblipvideo
    instructblipvideo_qformer instructblipvideo_vision_model internlm3 internvl internvl_vision
    iquestcoder jais2 jamba janus janus_vision_model janus_vqgan jetmoe jev jina_embeddings_v3
    kimi_k25 kimi_k25_vision kimi_linear kolibri1 kosmos-2 kosmos-2.5 kosmos_2_5_text_model
    kosmos_2_5_vision_model kosmos_2_text_model kosmos_2_vision_model kyutai_speech_to_text
    laguna lasr_ctc lasr_encoder layoutlm layoutlmv2 layoutlmv3 layoutxlm led levit lfm2
    lfm2_moe lfm2_vl lfm3 lfm3_vl lfm3_vl_vision lightglue lighton_ocr lilt llama llama4
    llama4_text llama4_vision_model llava llava_next llava_next_video llava_onevision
    longcat_flash longformer longt5 luke lw_detr lw_detr_vit lxmert m2m_100 mamba mamba2 marian
    markuplm mask2former maskformer maskformer-swin mbart megatron-bert mellum metaclip_2
    metaclip_2_text_model metaclip_2_vision_model mgp-str mimi mimi_decoder mimi_encoder
    mimo_v2_flash minicpm3 minicpm_ocr minicpm_ocr_vision minicpmv4_6 minicpmv4_6_vision
    minicpmv4_7 minicpmv4_7_vision minimax minimax_m2 minimax_m3_vl minimax_m3_vl_text
    minimax_m3_vl_vision ministral ministral3 mistral mistral3 mistral4 mistral_large4
    mistral_large4_text mixtral mlcd mlcd_vision_model mllama mllama_text_model
    mllama_vision_model mm-grounding-dino mobilebert mobilenet_v1 mobilenet_v2 mobilevit
    mobilevitv2 modernbert modernbert-decoder modernvbert molmo2 molmo2_adapter molmo2_text
    molmo2_vision moonshine moonshine_streaming moonshine_streaming_encoder moshi moshi_depth
    moss_transcribe_diarize moss_transcribe_diarize_audio mpnet mpt mra mt5 muse_glimmer
    muse_glimmer_assistant muse_glimmer_text muse_glimmer_vision muse_spark muse_spark_audio
    muse_spark_text muse_spark_vision musicflamingo musicgen musicgen_decoder musicgen_melody
    musicgen_melody_decoder mvp nanochat nemo_speechlm nemotron nemotron3_5_asr
    nemotron3_5_transcribe_asr_audio nemotron3_5_transcribe_audio
    nemotron3_5_transcribe_word_timestamp nemotron3_diarization nemotron3_diarization_audio
    nemotron_asr_streaming nemotron_asr_streaming_encoder nemotron_h nemotron_h_omni neomme
    neucodec nllb-moe nomic_bert nougat nystromformer olmo olmo2 olmo3 olmo_hybrid olmoe
    omdet-turbo oneformer openai-gpt openai_privacy_filter opt ovis2 ovis2_vision owlv2
    owlv2_text_model owlv2_vision_model owlvit owlvit_text_model owlvit_vision_model
    paddleocr_vl paddleocr_vl_text paddleocr_vl_vision paligemma parakeet_ctc parakeet_encoder
    parakeet_rnnt parakeet_tdt patchtsmixer patchtst pe_audio pe_audio_encoder pe_audio_video
    pe_audio_video_encoder pe_video pe_video_encoder pegasus pegasus_x perceiver perception_lm
    persimmon phi phi3 phi4_multimodal phi4_multimodal_audio phi4_multimodal_vision phimoe pi0
    pix2struct pix2struct_text_model pix2struct_vision_model pixio pixtral plbart pocket_tts
    pocket_tts_audio_tokenizer pocket_tts_audio_tokenizer_decoder
    pocket_tts_audio_tokenizer_encoder poolformer pop2piano pp_chart2table pp_chart2table_vision
    pp_doclayout_v2 pp_doclayout_v3 pp_doclayout_v4 pp_formulanet pp_formulanet_text
    pp_formulanet_vision pp_lcnet pp_lcnet_v3 pp_lcnet_v4 pp_ocrv5_mobile_det
    pp_ocrv5_mobile_rec pp_ocrv5_server_det pp_ocrv5_server_rec pp_ocrv6_medium_det
    pp_ocrv6_small_det pp_ocrv6_small_rec pp_ocrv6_tiny_rec prompt_depth_anything prophetnet pvt
    pvt_v2 qianfan_ocr qianfan_ocr_vision qwen2 qwen2_5_omni qwen2_5_omni_audio_encoder
    qwen2_5_omni_bigvgan qwen2_5_omni_dit qwen2_5_omni_talker qwen2_5_omni_text
    qwen2_5_omni_thinker qwen2_5_omni_token2wav qwen2_5_omni_vision_encoder qwen2_5_vl
    qwen2_5_vl_text qwen2_5_vl_vision qwen2_audio qwen2_audio_encoder qwen2_moe qwen2_vl
    qwen2_vl_text qwen2_vl_vision qwen3 qwen3_5 qwen3_5_moe qwen3_5_moe_text qwen3_5_moe_vision
    qwen3_5_text qwen3_5_vision qwen3_asr qwen3_asr_encoder qwen3_moe qwen3_next qwen3_omni_moe
    qwen3_omni_moe_audio_encoder qwen3_omni_moe_talker_code_predictor qwen3_omni_moe_talker_text
    qwen3_omni_moe_text qwen3_omni_moe_thinker qwen3_omni_moe_vision_encoder qwen3_vl
    qwen3_vl_moe qwen3_vl_moe_text qwen3_vl_moe_vision qwen3_vl_text qwen3_vl_vision qwen4_exp
    qwen4_exp_text qwen4_exp_vision radio rag recurrent_gemma reformer regnet rembert resnet
    rf_detr rf_detr_dinov2 roberta roberta-prelayernorm roc_bert roformer rt_detr rt_detr_resnet
    rt_detr_v2 rwkv sam sam2 sam2_hiera_det_model sam2_mask_decoder sam2_prompt_encoder
    sam2_video sam2_video_mask_decoder sam2_video_prompt_encoder sam2_vision_model sam3
    sam3_detr_decoder sam3_detr_encoder sam3_geometry_encoder sam3_lite_text
    sam3_lite_text_detr_decoder sam3_lite_text_detr_encoder sam3_lite_text_geometry_encoder
    sam3_lite_text_mask_decoder sam3_lite_text_text_model sam3_mask_decoder sam3_tracker
    sam3_tracker_mask_decoder sam3_tracker_prompt_encoder sam3_tracker_video
    sam3_tracker_video_mask_decoder sam3_tracker_video_prompt_encoder sam3_video
    sam3_vision_model sam3_vit_model sam_hq sam_hq_mask_decoder sam_hq_prompt_encoder
    sam_hq_vision_model sam_mask_decoder sam_prompt_encoder sam_vision_model sapiens2
    sapiens2_head seamless_m4t seamless_m4t_v2 seed_oss segformer seggpt semantic sew sew-d
    shieldgemma2 siglip siglip2 siglip2_text_model siglip2_vision_model siglip_text_model
    siglip_vision_model slanet slanext slanext_vision smollm3 smolvlm smolvlm_vision solar_open
    speech-encoder-decoder speech_to_text speecht5 speecht5_hifigan splinter squeezebert
    stablelm starcoder2 step3p5 step3p5_vision step3p7 superglue superpoint swiftformer swin
    swin2sr swinv2 switch_transformers t5 t5_gemma_module t5gemma t5gemma2 t5gemma2_decoder
    t5gemma2_encoder t5gemma2_text table-transformer tapas textnet time_series_transformer
    timesfm timesfm2_5 timesformer timm_backbone timm_wrapper tipsv2 tipsv2_dpt
    tipsv2_text_model tipsv2_vision_model trocr tvp udop ultrabert ultravbert umt5 unispeech
    unispeech-sat univnet unlimited_ocr unlimited_ocr_sam_vision_model unlimited_ocr_text
    unlimited_ocr_vision unlimited_ocr_vision_encoder upernet uvdoc uvdoc_backbone vaultgemma
    vibevoice vibevoice_acoustic_tokenizer vibevoice_acoustic_tokenizer_decoder
    vibevoice_acoustic_tokenizer_encoder vibevoice_asr vibevoice_diffusion video_llama_3
    video_llama_3_vision video_llava videomae videomt videoprism videoprism_text_model
    videoprism_vision_model vilt vipllava vision-encoder-decoder vision-text-dual-encoder
    visual_bert vit vit_mae vit_msn vitdet vitmatte vitpose vitpose_backbone vits vivit vjepa2
    voxtral voxtral_encoder voxtral_realtime voxtral_realtime_encoder voxtral_realtime_text
    wav2vec2 wav2vec2-bert wav2vec2-conformer wavlm whisper xclip xclip_text_model
    xclip_vision_model xcodec xcodec2 xglm xlm xlm-roberta xlm-roberta-xl xlnet xlstm xmod yolos
    yoso youtu zamba zamba2 zaya zoedepth
""".split())
