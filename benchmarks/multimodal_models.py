"""The two vision-language shapes `multimodal.py` measures, each with what differs between
them: how its random checkpoint is built, the placeholder a prompt writes, and how
transformers' inputs are prepared.

- `llava`: CLIP ViT-B/16 at 224 px (12 layers, width 768; second-to-last layer, CLS dropped:
  196 image tokens) + a SmolLM2-135M-shaped Llama; transformers' LlavaProcessor.
- `qwen2_vl`: Qwen2-VL-2B's vision tower (32 blocks, width 1280, 16 heads, 14 px patches of
  2 frames, 2 x 2 merger; ~630M parameters) + a SmolLM2-135M-shaped Qwen2 text model (q/k/v
  biases, M-RoPE over 8 + 12 + 12 frequencies); images keep their own size (dynamic
  resolution: 224-288 px is 64-100 tokens). Qwen2VLProcessor needs torchvision, which does
  not load with this torch, so transformers' inputs come from its image processor and the
  tokenizer with the processor's expansion (each `<|image_pad|>` once per merged patch),
  as tests/multimodal/tiny_vlm.py does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMAGE_SIZE = 224
LLAVA_PATCH = 16
QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def smollm2_text(tokenizer: Any) -> dict[str, Any]:
    """The text model's shape: SmolLM2-135M's."""
    return dict(
        vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_llava(folder: Path, tokenizer: Any) -> tuple[Any, Any, int]:
    """The random LLaVA and its LlavaProcessor (saved by the caller); its image tokens."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        image_size=IMAGE_SIZE, patch_size=LLAVA_PATCH, projection_dim=512,
    )
    tokens = (IMAGE_SIZE // LLAVA_PATCH) ** 2
    config = LlavaConfig(
        vision_config=vision,
        text_config=LlamaConfig(rope_theta=100000.0, **smollm2_text(tokenizer)),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default", vision_feature_layer=-2,
        image_seq_length=tokens, tie_word_embeddings=True,
    )
    model = LlavaForConditionalGeneration(config)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=LLAVA_PATCH,
        vision_feature_select_strategy="default", image_token="<image>",
        num_additional_image_tokens=1,
    )
    return model, processor, tokens


def build_qwen2_vl(folder: Path, tokenizer: Any) -> tuple[Any, Any, int]:
    """The random Qwen2-VL-shaped model and its image processor + tokenizer (saved by the
    caller); the most tokens one 288 px image makes."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"))}
    text = {**smollm2_text(tokenizer), "rope_parameters": {
        "rope_type": "default", "rope_theta": 100000.0, "mrope_section": [8, 12, 12]}}
    vision = dict(depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, hidden_size=576)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
    model = Qwen2VLForConditionalGeneration(config)
    processor = QwenInputs(Qwen2VLImageProcessorPil(), tokenizer)
    return model, processor, (288 // 28) ** 2


class QwenInputs:
    """Qwen2VLProcessor's outputs from its image processor and the tokenizer (the processor
    class needs torchvision): each `<|image_pad|>` once per 2 x 2 merged patches."""

    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer

    def save_pretrained(self, folder: Path) -> None:
        """Both halves, where the engine and `load` find them."""
        self.image_processor.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    @classmethod
    def load(cls, folder: Path) -> QwenInputs:
        """From a saved checkpoint folder."""
        from transformers import AutoImageProcessor, AutoTokenizer

        return cls(AutoImageProcessor.from_pretrained(folder),
                   AutoTokenizer.from_pretrained(folder))

    def __call__(self, text: list[str], images: list[Any], padding: bool = False,
                 return_tensors: str = "pt") -> dict[str, Any]:
        """input_ids (left padded), attention_mask, mm_token_type_ids and the pixels."""
        outputs = dict(self.image_processor(images=images, return_tensors="pt"))
        counts = iter((outputs["image_grid_thw"].prod(-1) // 4).tolist())
        expanded = []
        for prompt in text:
            pieces = prompt.split("<|image_pad|>")
            expanded.append(pieces[0] + "".join(
                "<|image_pad|>" * next(counts) + piece for piece in pieces[1:]))
        outputs.update(self.tokenizer(expanded, padding=padding, return_tensors="pt"))
        pad_id = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        outputs["mm_token_type_ids"] = (outputs["input_ids"] == pad_id).int()
        return outputs


@dataclass(frozen=True)
class BenchModel:
    """One vision-language shape."""

    name: str
    description: str
    placeholder: str
    build: Any  # (folder, tokenizer) -> (model, processor, image tokens)

    def load_processor(self, folder: Path) -> Any:
        """What prepares transformers' inputs, from the saved folder."""
        if self.name == "qwen2_vl":
            return QwenInputs.load(folder)
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)


MODELS = {
    "llava": BenchModel(
        "llava", f"LLaVA: CLIP ViT-B/16 {IMAGE_SIZE} px + SmolLM2-135M-shaped Llama", "<image>",
        build_llava),
    "qwen2_vl": BenchModel(
        "qwen2_vl", "Qwen2-VL: Qwen2-VL-2B's vision tower (dynamic resolution) + "
        "SmolLM2-135M-shaped Qwen2", "<|vision_start|><|image_pad|><|vision_end|>",
        build_qwen2_vl),
}
