"""The import-layering contract of ARCHITECTURE.md, checked on the source's import statements.

core is pure Python (no torch, no worker/engine/tokenizer); the worker never reaches the
scheduler; model code never reaches the engine or core; the tokenizer stays out of core and
worker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "pagedllm"

FORBIDDEN = {
    "core": ["torch", "numpy", "transformers", "pagedllm.worker", "pagedllm.engine",
             "pagedllm.tokenizer", "pagedllm.models", "pagedllm.layers", "pagedllm.attention",
             "pagedllm.entrypoints", "pagedllm.structured_output", "xgrammar", "llguidance"],
    "worker": ["pagedllm.core.scheduler", "pagedllm.core.kv_cache_manager",
               "pagedllm.core.block_pool", "pagedllm.engine", "pagedllm.entrypoints",
               "pagedllm.tokenizer"],
    "models": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints"],
    "layers": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints"],
    "attention": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints"],
    "engine": ["pagedllm.entrypoints"],
    # Structured outputs: called by the engine core (manager), the input processor (parse)
    # and the model runner (bitmask); it calls none of them.
    "structured_output": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                          "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                          "pagedllm.attention"],
    # Tool calling: parsers and forced-choice grammars for the server's chat endpoint; it
    # only knows SamplingParams and hands constraints over as plain data.
    "tool_calling": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                     "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                     "pagedllm.attention", "pagedllm.structured_output", "torch"],
    # Pooling (embeddings, scores): config and pooling functions the runner and the
    # frontends call; it calls none of them.
    "pooling": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints",
                "pagedllm.models", "pagedllm.structured_output"],
    # Speculative decoding: proposers and the rejection sampler, called by the model runner
    # (and its config by the engine args); it never reaches the scheduler or the engine.
    "spec_decode": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                    "pagedllm.entrypoints", "pagedllm.structured_output", "pagedllm.tokenizer"],
    # LoRA: adapter loading and slot weights, called by the worker (manager), the linear
    # layers (duck-typed slots) and the frontend (request, config checks).
    "lora": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints",
             "pagedllm.models", "pagedllm.spec_decode", "pagedllm.structured_output"],
    # Distributed: process groups, collectives and shard arithmetic, called by layers and
    # workers; it calls none of them.
    "distributed": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                    "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                    "pagedllm.attention"],
    # Executors: between the engine core and the workers (one in-process, or one per rank
    # over ZMQ channels and torch.distributed); they never reach the scheduler or frontends.
    "executor": ["pagedllm.core.scheduler", "pagedllm.core.kv_cache_manager",
                 "pagedllm.core.block_pool", "pagedllm.engine", "pagedllm.entrypoints",
                 "pagedllm.tokenizer"],
    # Benchmarks: a frontend like the CLI; they drive the engine through LLM or a server's
    # HTTP API, never its insides.
    "bench": ["pagedllm.core", "pagedllm.worker", "pagedllm.executor", "pagedllm.models",
              "pagedllm.layers", "pagedllm.attention", "pagedllm.kernels",
              "pagedllm.entrypoints.openai"],
    # The C kernels are a leaf: the platform loads them, layers, attention and the worker
    # call them, never the reverse.
    "kernels": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints",
                "pagedllm.models", "pagedllm.layers", "pagedllm.attention",
                "pagedllm.model_loader", "pagedllm.tokenizer", "pagedllm.platform"],
    # The platform: facts about the device read once, and the choices made from them. It
    # loads the C kernels; everything else asks it.
    "platform": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints",
                 "pagedllm.models", "pagedllm.layers", "pagedllm.attention",
                 "pagedllm.model_loader", "pagedllm.tokenizer", "pagedllm.lora",
                 "pagedllm.spec_decode", "pagedllm.structured_output", "pagedllm.pooling",
                 "pagedllm.distributed", "pagedllm.executor", "pagedllm.triton_kernels"],
    # The Triton kernels (GPU; CPU in Triton's interpreter) are a leaf as well.
    "triton_kernels": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                       "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                       "pagedllm.attention", "pagedllm.model_loader", "pagedllm.tokenizer",
                       "pagedllm.kernels"],
}


def _runtime_imports(path: Path) -> list[str]:
    """Modules imported by a file, ignoring imports under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    type_checking_nodes = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    names = []
    for node in ast.walk(tree):
        if id(node) in type_checking_nodes:
            continue
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_layering(package: str):
    violations = []
    for path in sorted((SRC / package).rglob("*.py")):
        for name in _runtime_imports(path):
            for banned in FORBIDDEN[package]:
                if name == banned or name.startswith(banned + "."):
                    violations.append(f"{path.relative_to(SRC)} imports {name}")
    assert not violations, "\n".join(violations)
