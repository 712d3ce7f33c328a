"""AsyncLLM's LoRA calls reach the core as utility calls, in a thread and in a process:
add_lora checks and loads (a ValueError for a bad adapter, the core goes on), generate
runs the adapter, remove_lora drops it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.lora.request import LoRARequest
from tests.lora.adapters import make_adapter, misfit_adapter

PROMPT = [7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def adapter(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("async_lora")
    return str(make_adapter(tiny_llama_dir, folder / "a", 8, 16, ["q_proj", "down_proj"],
                            False, seed=5))


@pytest.mark.parametrize("multiprocessing", [False, True], ids=["thread", "process"])
def test_add_generate_remove(tiny_llama_dir, adapter, tmp_path, multiprocessing):
    args = dict(model=str(tiny_llama_dir), dtype="float32", max_model_len=256,
                enable_lora=True, max_loras=2)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    lora = LoRARequest("a", 1, adapter)
    offline = LLM(**args)
    want = offline.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False,
                            lora_request=lora)[0].outputs[0].token_ids
    engine = AsyncLLM.from_engine_args(EngineArgs(**args), multiprocessing=multiprocessing)

    async def scenario() -> list[int]:
        with pytest.raises(ValueError, match="adapter_config.json"):
            await engine.add_lora(LoRARequest("missing", 2, str(tmp_path)))
        # Refused in the core (the weights do not fit the model): a ValueError here too.
        misfit = str(misfit_adapter(adapter, tmp_path / "misfit"))
        with pytest.raises(ValueError, match="q_proj maps"):
            await engine.add_lora(LoRARequest("misfit", 3, misfit))
        assert await engine.add_lora(lora)
        assert await engine.list_loras() == {1}
        final = None
        async for output in engine.generate({"prompt_token_ids": PROMPT}, params, "r0",
                                            lora_request=lora):
            final = output
        assert await engine.remove_lora(1)
        assert await engine.list_loras() == set()
        assert final is not None
        return list(final.outputs[0].token_ids)

    try:
        assert asyncio.run(scenario()) == want
    finally:
        engine.shutdown()
