"""GET /v1/models, and loading / unloading LoRA adapters at run time.

The names themselves live in `ServedModels` (served_models.py), shared by every handler.
"""

from __future__ import annotations

from pagedllm.entrypoints.openai.protocol import (
    LoadLoRAAdapterRequest,
    ModelList,
    UnloadLoRAAdapterRequest,
)
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingModels(OpenAIServing):
    """Handler of /v1/models, /v1/load_lora_adapter and /v1/unload_lora_adapter."""

    def list_models(self) -> ModelList:
        """One card per served base name (`root`: the model loaded), then one per LoRA
        adapter (`root`: its folder, `parent`: its base model)."""
        root = self.engine.get_model_config().model
        return self.config.models.model_list(root, self.max_model_len)

    async def load_lora_adapter(self, request: LoadLoRAAdapterRequest) -> str:
        """Serve a new adapter under `lora_name` (APIError naming what is wrong)."""
        return await self.config.models.load(
            request.lora_name, request.lora_path, request.load_inplace
        )

    async def unload_lora_adapter(self, request: UnloadLoRAAdapterRequest) -> str:
        """Stop serving an adapter; requests already running on it finish first."""
        return await self.config.models.unload(request.lora_name)
