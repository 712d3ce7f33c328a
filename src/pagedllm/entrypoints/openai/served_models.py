"""The names a client may pass as `model`: the base model's and the LoRA adapters'.

`ServedModels` is the server's one registry of them. The base model answers to its served
names; each LoRA adapter (from `--lora-modules`, or loaded at run time through
`/v1/load_lora_adapter`) answers to its own name and runs as a `LoRARequest` with an id
given here, never reused. Unloading takes the name away at once (new requests get 404);
the engine core keeps the adapter until the requests already running on it finish.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import ModelCard, ModelList
from pagedllm.lora.request import LoRARequest

if TYPE_CHECKING:
    from pagedllm.engine.async_llm import AsyncLLM


@dataclass(frozen=True)
class LoRAModulePath:
    """One `--lora-modules` entry (vLLM's name): the adapter's served name and folder.

    Attributes:
        base_model_name: the `parent` reported in /v1/models (default: the base model's
            first served name).
    """

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: list[str] | None) -> list[LoRAModulePath]:
    """`name=path` or JSON `{"name", "path", "base_model_name"}` entries, as vLLM takes them.

    Raises:
        ValueError: naming the malformed entry.
    """
    modules = []
    for value in values or []:
        if value.lstrip().startswith("{"):
            try:
                entry: Any = json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"--lora-modules {value!r} is not valid JSON: {error}") from None
            unknown = sorted(set(entry) - {"name", "path", "base_model_name"})
            if unknown or not entry.get("name") or not entry.get("path"):
                raise ValueError(
                    f"--lora-modules {value!r}: a JSON entry takes \"name\", \"path\" and "
                    f"optionally \"base_model_name\"{f'; unknown: {unknown}' if unknown else ''}."
                )
            modules.append(LoRAModulePath(entry["name"], entry["path"],
                                          entry.get("base_model_name")))
            continue
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules {value!r}: expected name=path or a JSON object.")
        modules.append(LoRAModulePath(name, path))
    names = [m.name for m in modules]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"--lora-modules names {duplicates} more than once.")
    return modules


class ServedModels:
    """Served names → what runs them (None: the base model; a LoRARequest: an adapter).

    Args:
        engine: the engine the adapters are loaded into.
        base_names: the base model's served names (the first is reported by default).
    """

    def __init__(self, engine: AsyncLLM, base_names: tuple[str, ...]) -> None:
        self.engine = engine
        self.base_names = base_names
        self.adapters: dict[str, LoRARequest] = {}
        self.parents: dict[str, str] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @property
    def lora_enabled(self) -> bool:
        """True when the engine was started with enable_lora."""
        return self.engine.engine_config.lora_config is not None

    def load_static(self, modules: list[LoRAModulePath]) -> None:
        """Load the `--lora-modules` adapters at start-up (ValueError stops the server)."""
        if modules and not self.lora_enabled:
            raise ValueError("--lora-modules needs --enable-lora.")
        for module in modules:
            if module.name in self.base_names or module.name in self.adapters:
                raise ValueError(f"--lora-modules: {module.name!r} is already a served name.")
            request = self._new_request(module.name, module.path)
            self.engine.engine.add_lora(request)  # the core runs elsewhere: this waits
            self._register(request, module.base_model_name)

    def resolve(self, model: str | None) -> LoRARequest | None:
        """What `model` runs: None for the base model, else its adapter.

        Raises:
            APIError: 404 naming a model that is not served.
        """
        if model is None or model in self.base_names:
            return None
        adapter = self.adapters.get(model)
        if adapter is None:
            raise APIError(
                f"The model `{model}` does not exist.", HTTPStatus.NOT_FOUND, param="model"
            )
        return adapter

    async def load(self, name: str | None, path: str | None, inplace: bool = False) -> str:
        """Load an adapter at run time; the success message. `inplace` replaces one served
        under `name` (its running requests finish on the old weights).

        Raises:
            APIError: 400 for a missing field, a name already served or an adapter the
                engine refuses (rank, unsupported feature, another model's shapes); 404
                for a path with no adapter.
        """
        if not name or not path:
            raise APIError("Both 'lora_name' and 'lora_path' must be provided.",
                           param="lora_name" if not name else "lora_path")
        if not self.lora_enabled:
            raise APIError("LoRA is off: start the server with --enable-lora.",
                           param="lora_name")
        async with self._lock:
            if name in self.base_names or (name in self.adapters and not inplace):
                raise APIError(f"The lora adapter '{name}' has already been loaded.",
                               param="lora_name")
            if not os.path.isdir(path):
                raise APIError(f"No adapter found at lora_path {path!r}.",
                               HTTPStatus.NOT_FOUND, param="lora_path")
            request = self._new_request(name, path)
            try:
                await self.engine.add_lora(request)
            except ValueError as error:
                raise APIError(str(error), param="lora_path") from None
            replaced = self.adapters.get(name)
            self._register(request, None)
            if replaced is not None:
                await self.engine.remove_lora(replaced.lora_int_id)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload(self, name: str | None) -> str:
        """Stop serving an adapter; its running requests finish first. The success message.

        Raises:
            APIError: 400 without a name, 404 for a name that is not an adapter.
        """
        if not name:
            raise APIError("'lora_name' must be provided.", param="lora_name")
        async with self._lock:
            request = self.adapters.pop(name, None)
            if request is None:
                raise APIError(f"The lora adapter '{name}' cannot be found.",
                               HTTPStatus.NOT_FOUND, param="lora_name")
            self.parents.pop(name, None)
            await self.engine.remove_lora(request.lora_int_id)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def model_list(self, root: str, max_model_len: int) -> ModelList:
        """/v1/models: a card per base name, then one per adapter (`parent`: its base)."""
        cards = [
            ModelCard(id=name, root=root, max_model_len=max_model_len,
                      permission=[_permission(name)])
            for name in self.base_names
        ]
        cards += [
            ModelCard(id=name, root=request.lora_path, parent=self.parents[name],
                      max_model_len=max_model_len, permission=[_permission(name)])
            for name, request in self.adapters.items()
        ]
        return ModelList(data=cards)

    def _new_request(self, name: str, path: str) -> LoRARequest:
        return LoRARequest(name, next(self._ids), path)

    def _register(self, request: LoRARequest, parent: str | None) -> None:
        self.adapters[request.lora_name] = request
        self.parents[request.lora_name] = parent or self.base_names[0]


def _permission(name: str) -> dict[str, Any]:
    return {"id": f"modelperm-{name}", "object": "model_permission",
            "allow_sampling": True, "allow_logprobs": True}
