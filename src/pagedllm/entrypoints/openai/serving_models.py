"""GET /v1/models: the served model names as OpenAI model cards."""

from __future__ import annotations

from pagedllm.entrypoints.openai.protocol import ModelCard, ModelList
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingModels(OpenAIServing):
    """Handler of /v1/models."""

    def list_models(self) -> ModelList:
        """One card per served name; `root` is the model that was loaded."""
        root = self.engine.get_model_config().model
        cards = [
            ModelCard(id=name, root=root, max_model_len=self.max_model_len,
                      permission=[{"id": f"modelperm-{name}", "object": "model_permission",
                                   "allow_sampling": True, "allow_logprobs": True}])
            for name in self.config.served_model_names
        ]
        return ModelList(data=cards)
