"""POST /tokenize and /detokenize: the model's tokenizer over HTTP (vLLM's shapes)."""

from __future__ import annotations

from typing import Any

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat


class OpenAIServingTokenization(OpenAIServingChat):
    """Handlers of /tokenize (a prompt, or chat messages through the template) and /detokenize."""

    async def tokenize_request(self, request: TokenizeRequest) -> dict[str, Any]:
        """`{count, max_model_len, tokens[, token_strs]}`; a chat's images count as the
        feature tokens they expand to."""
        self.check_model(request.model)
        if request.messages is not None:
            tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
            prompt = await self.chat_prompt(
                request.messages, request.chat_template, request.add_generation_prompt,
                request.continue_final_message, request.chat_template_kwargs, tools or None,
                bool(request.add_special_tokens),  # chat: the template wrote them
            )
            tokens = prompt.token_ids
        else:
            text = request.prompt or ""
            tokens = self.tokenize(text, request.add_special_tokens is not False)
        result: dict[str, Any] = {
            "count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens,
        }
        if request.return_token_strs:
            result["token_strs"] = self.tokenizer.convert_ids_to_tokens(tokens)
        return result

    def tokenizer_info(self) -> dict[str, Any]:
        """What a client needs to tokenize as the server does (vLLM's /tokenizer_info)."""
        tokenizer = self.tokenizer
        info: dict[str, Any] = {
            "tokenizer_class": type(tokenizer).__name__,
            "vocab_size": len(tokenizer),
            "model_max_length": self.max_model_len,
            "chat_template": getattr(tokenizer, "chat_template", None),
        }
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            info[name] = getattr(tokenizer, name, None)
        info["added_tokens_decoder"] = {
            str(token_id): str(token)
            for token_id, token in getattr(tokenizer, "added_tokens_decoder", {}).items()
        }
        return info

    def detokenize_request(self, request: DetokenizeRequest) -> dict[str, Any]:
        """`{prompt}`; token ids outside the vocabulary are a 400."""
        self.check_model(request.model)
        vocab_size = self.engine.get_model_config().text_config.vocab_size
        bad = [t for t in request.tokens if not 0 <= t < vocab_size]
        if bad:
            raise APIError(
                f"tokens {bad[:8]} are out of vocabulary (vocabulary size: {vocab_size}).",
                param="tokens",
            )
        return {"prompt": self.tokenizer.decode(request.tokens)}
