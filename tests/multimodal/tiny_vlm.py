"""Tiny random vision-language checkpoints of real architectures, with transformers' own
processors saved beside them (the engine loads both from the folder, as from a hub one)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

IMAGE_TOKEN = "<image>"


def random_image(seed: int, size: tuple[int, int] = (40, 52)) -> Image.Image:
    """A random RGB image (width, height)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _randomize(model: Any, skip: str = "multi_modal_projector") -> None:
    """Biases and norm weights random too (not their 0 / 1 defaults, which would hide a
    missing bias or a (1 + w) norm, and leave a tiny model's outputs degenerate); the
    projector's are left alone (its biases would drown the image features)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if skip in name:
                continue
            if name.endswith(".bias"):
                param.normal_(0.0, 0.3)
            elif "norm" in name:
                param.normal_(0.5, 0.3)


def _tokenizer_with(tokenizer_dir: Path, tokens: list[str]) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    return tokenizer


def _text_config(tokenizer: Any, text: str) -> Any:
    from transformers import LlamaConfig, MistralConfig

    common = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.2, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    if text == "mistral":
        return MistralConfig(sliding_window=None, **common)
    return LlamaConfig(**common)


def _vision_config(tower: str) -> Any:
    from transformers import CLIPVisionConfig, SiglipVisionConfig

    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, image_size=32, patch_size=8)
    if tower == "siglip":
        return SiglipVisionConfig(**common)
    return CLIPVisionConfig(projection_dim=16, **common)


def make_tiny_llava(
    out_dir: Path, tokenizer_dir: Path, tower: str = "clip", text: str = "llama",
    strategy: str = "default", feature_layer: int | list[int] = -2,
) -> Path:
    """A tiny random LLaVA (CLIP or SigLIP tower; Llama or Mistral text) with its
    LlavaProcessor; images become 16 (CLIP, default), 15 (SigLIP, default) or 17 / 16
    tokens ("full")."""
    from transformers import (
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        SiglipImageProcessor,
    )

    tokenizer = _tokenizer_with(tokenizer_dir, [IMAGE_TOKEN])
    config = LlavaConfig(
        vision_config=_vision_config(tower), text_config=_text_config(tokenizer, text),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy=strategy, vision_feature_layer=feature_layer,
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).to(torch.float32).eval()
    _randomize(model)
    with torch.no_grad():  # a wide projector: image features move the logits visibly
        for param in model.model.multi_modal_projector.parameters():
            param.mul_(8.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    if tower == "siglip":
        image_processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    else:
        image_processor = CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=8,
        vision_feature_select_strategy=strategy, image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1 if tower == "clip" else 0,
    )
    processor.save_pretrained(out_dir)
    return out_dir


def hf_vlm_greedy(
    model_dir: Path, prompts: list[dict[str, Any]], max_tokens: int
) -> list[list[int]]:
    """transformers' greedy tokens for each `{"prompt", "multi_modal_data"}`, one at a
    time, its own processor preparing the inputs."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    is_qwen2_vl = model.config.model_type in ("qwen2_vl", "qwen2_5_vl")
    processor = None if is_qwen2_vl else AutoProcessor.from_pretrained(model_dir)
    results = []
    for prompt in prompts:
        data = prompt.get("multi_modal_data") or {}
        images = data.get("image")
        if images is not None and not isinstance(images, list):
            images = [images]
        videos = data.get("video")
        if videos is not None and not isinstance(videos[0], list):
            videos = [videos]  # one video: a list of frames
        if processor is None:
            inputs = _qwen2_vl_inputs(model_dir, prompt["prompt"], images, videos,
                                      prompt.get("mm_processor_kwargs"))
            if model.config.model_type == "qwen2_vl":  # its positions step by one
                inputs.pop("second_per_grid_ts", None)
        else:
            inputs = processor(text=[prompt["prompt"]], images=images or None,
                               return_tensors="pt")
        if hasattr(model.model, "rope_deltas"):
            model.model.rope_deltas = None  # M-RoPE: not the previous prompt's
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
        results.append(out[0, inputs["input_ids"].shape[1]:].tolist())
    return results


def copy_dir(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint folder."""
    shutil.copytree(src, dst)
    return dst


GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                 "image_token": "<image_soft_token>"}


def make_tiny_gemma3(out_dir: Path, tokenizer_dir: Path, sliding_window: int = 6) -> Path:
    """A tiny random Gemma 3 with images (SigLIP 32 px, 16 patches pooled to 4 soft tokens;
    a sliding layer with a window shorter than a prompt, then a global one) and its
    Gemma3Processor."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )
    from transformers.models.gemma3.image_processing_pil_gemma3 import (
        Gemma3ImageProcessorPil,
    )

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, extra_special_tokens=GEMMA3_TOKENS)
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        sliding_window=sliding_window,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        initializer_range=0.2, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        query_pre_attn_scalar=20,
    )
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, image_size=32, patch_size=8)
    config = Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        boi_token_index=tokenizer.boi_token_id, eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id, initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    _randomize(model, skip="mm_input_projection_weight")
    with torch.no_grad():  # pixels, not biases, drive the patches; a non-zero projection
        model.model.vision_tower.embeddings.patch_embedding.weight.normal_(0.0, 1.0)
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.3)
    model.save_pretrained(out_dir, safe_serialization=True)
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": 32, "width": 32}),
        tokenizer=tokenizer, image_seq_length=4,
    )
    processor.save_pretrained(out_dir)
    return out_dir


QWEN2VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2VL_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def make_tiny_qwen2_vl(out_dir: Path, tokenizer_dir: Path, version: str = "2") -> Path:
    """A tiny random Qwen2-VL or Qwen2.5-VL (`version` "2.5": windows of 2 x 2 merged
    units, one full-attention block of three) with 4 px patches, 2 x 2 merged (a 40 x 52
    image is 30 tokens), M-RoPE over 2 + 3 + 3 frequencies, and its image processor and
    tokenizer."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = _tokenizer_with(tokenizer_dir, QWEN2VL_TOKENS)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"))}
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.2, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
    )
    if version == "2.5":
        vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                      window_size=16, fullatt_block_indexes=[1])
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    else:
        vision = dict(depth=2, embed_dim=32, num_heads=4, mlp_ratio=2, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, hidden_size=64)
        config_class, model_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    config = config_class(text_config=text, vision_config=vision, initializer_range=0.2, **ids)
    torch.manual_seed(0)
    model = model_class(config).to(torch.float32).eval()
    _randomize(model, skip="merger.mlp")
    with torch.no_grad():  # pixels drive the patches; a wide merger: images move logits
        model.model.visual.patch_embed.proj.weight.normal_(0.0, 1.0)
        model.model.visual.merger.mlp[2].weight.mul_(4.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16,
        max_pixels=64 * 64,
    )
    # Qwen2VLProcessor cannot be built without torchvision (its video half): the image
    # processor and the tokenizer are saved; the engine and hf_vlm_greedy expand the
    # image tokens as the processor does.
    image_processor.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _qwen2_vl_inputs(model_dir: Path, prompt: str, images: list | None,
                     videos: list | None = None, options: dict | None = None) -> dict:
    """Qwen2VLProcessor's outputs, made from its image processor and tokenizer: each
    `<|image_pad|>` (`<|video_pad|>`) repeated once per 2 x 2 merged patches of its item.
    Videos are cut by pagedllm's QwenVideoProcessor (transformers' video processor needs
    torchvision, which cannot load here; test_video.py checks the cut against
    transformers' image processor and its video layout)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    from pagedllm.multimodal.video import QwenVideoProcessor

    image_processor = AutoImageProcessor.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    inputs: dict = {}
    for token, grid_key, items, process in (
        ("<|image_pad|>", "image_grid_thw", images,
         lambda values: dict(image_processor(images=values, return_tensors="pt"))),
        ("<|video_pad|>", "video_grid_thw", videos,
         lambda values: QwenVideoProcessor(image_processor)(values, **(options or {}))),
    ):
        if not items:
            continue
        outputs = process(items)
        inputs.update(outputs)
        counts = (outputs[grid_key].prod(-1) // 4).tolist()
        pieces = prompt.split(token)
        prompt = pieces[0] + "".join(
            token * n + piece for n, piece in zip(counts, pieces[1:], strict=True)
        )
    inputs["input_ids"] = torch.tensor([tokenizer(prompt)["input_ids"]])
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    ids = inputs["input_ids"]
    inputs["mm_token_type_ids"] = (
        (ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).int()
        + 2 * (ids == tokenizer.convert_tokens_to_ids("<|video_pad|>")).int()
    )
    return inputs


IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>"]


def make_tiny_idefics3(out_dir: Path, tokenizer_dir: Path, splitting: bool = True) -> Path:
    """A tiny random Idefics3 (SmolVLM's architecture): 32 px crops of 8 px patches, pixel
    shuffle by 2 (4 tokens a crop), images split into up to 2 x 2 tiles plus the global
    view; Llama text; its Idefics3Processor."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        Idefics3VisionConfig,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    tokenizer = _tokenizer_with(tokenizer_dir, IDEFICS3_TOKENS)
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, image_size=32, patch_size=8)
    config = Idefics3Config(
        vision_config=vision, text_config=_text_config(tokenizer, "llama"), scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
    _randomize(model, skip="modality_projection")
    with torch.no_grad():  # pixels drive the patches; a wide projection: images move logits
        model.model.vision_model.embeddings.patch_embedding.weight.normal_(0.0, 1.0)
        model.model.connector.modality_projection.proj.weight.mul_(8.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
        do_image_splitting=splitting,
    )
    Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                      image_seq_len=4).save_pretrained(out_dir)
    return out_dir


def image_prompts(placeholder: str) -> list[dict]:
    """One image; three (two sizes, one repeated from the first prompt); text only; the
    first prompt's text with another image; the first prompt again (a prefix-cache hit)."""
    one = {"prompt": f"Describe {placeholder} please",
           "multi_modal_data": {"image": random_image(1)}}
    three = {
        "prompt": f"{placeholder} and {placeholder} then {placeholder} end",
        "multi_modal_data": {"image": [random_image(2), random_image(3, (64, 30)),
                                       random_image(1)]},
    }
    other_image = {"prompt": one["prompt"], "multi_modal_data": {"image": random_image(4)}}
    return [one, three, {"prompt": "The quick brown fox"}, other_image, dict(one)]


def random_video(seed: int, num_frames: int, size: tuple[int, int] = (40, 52)) -> list:
    """`num_frames` distinct random frames of one size."""
    return [random_image(seed * 100 + i, size) for i in range(num_frames)]


def video_prompts() -> list[dict]:
    """Qwen2-VL prompts with video: one video of 4 frames; an image then a video of 3
    frames (an odd count: the last frame repeated) of another size; text only; the first
    prompt's text with another video; the first prompt again (a prefix-cache hit). The
    first is at 1 frame a second (Qwen2.5-VL: temporal positions 8 apart), the others at
    the default 24."""
    video = "<|vision_start|><|video_pad|><|vision_end|>"
    one = {"prompt": f"Watch {video} now", "multi_modal_data": {"video": random_video(1, 4)},
           "mm_processor_kwargs": {"fps": 1.0}}
    mixed = {
        "prompt": f"{QWEN2VL_IMAGE} then {video} end",
        "multi_modal_data": {"image": random_image(2), "video": random_video(3, 3, (64, 30))},
    }
    other_video = {"prompt": one["prompt"], "multi_modal_data": {"video": random_video(4, 4)}}
    return [one, mixed, {"prompt": "The quick brown fox"}, other_video, dict(one)]


def check_engine_matches_transformers(
    model_dir: Path, placeholder: str, max_tokens: int = 8,
    prompts: list[dict] | None = None, **llm_args: Any,
) -> Any:
    """`prompts` (default: `image_prompts`) through the engine (float32, 4-token blocks,
    prefix caching on, the caller's `llm_args`) give transformers' greedy tokens, the
    items decide the outputs, the repeated prompt hits the prefix cache, and nothing stays
    held; returns the LLM."""
    from pagedllm import LLM, SamplingParams

    prompts = prompts or image_prompts(placeholder)
    expected = hf_vlm_greedy(model_dir, prompts, max_tokens)
    assert expected[0] != expected[3]  # the image decides the output
    llm = LLM(str(model_dir), dtype="float32", block_size=4, enable_prefix_caching=True,
              **llm_args)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                           use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.make_stats().prefix_cache_hits > 0
    assert not scheduler.encoder.cache.users
    manager = scheduler.kv_cache_manager
    assert manager.get_num_free_blocks() == manager.num_usable_blocks
    return llm
