"""The import-layering contract of ARCHITECTURE.md, checked on the source's import statements.

Every package and every top-level module has a rule (test_every_package_has_a_rule). core is
pure Python (no torch, no worker/engine/tokenizer); the worker never reaches the scheduler;
model code never reaches the engine or core, nor attention's internals (models attend
through layers/attention.py); the platform and the kernel packages are leaves; the plain
data modules (config, request, sampling and pooling parameters, outputs) import no engine
part.
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
    # Models are built from layers: attention internals, kernels and the platform's choices
    # stay below the layers.
    "models": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints",
               "pagedllm.attention", "pagedllm.kernels", "pagedllm.triton_kernels",
               "pagedllm.platform", "pagedllm.executor"],
    "layers": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints"],
    "attention": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.entrypoints"],
    "engine": ["pagedllm.entrypoints"],
    # The top: the API server, the offline LLM and the CLI may use any package below.
    "entrypoints": [],
    # Metrics: plain stats records and their exporters; read by the engine and frontends.
    "metrics": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.executor",
                "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                "pagedllm.attention", "torch"],
    # Loading weights: builds models and hands their layers the checkpoint's tensors.
    "model_loader": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                     "pagedllm.executor", "pagedllm.entrypoints", "pagedllm.attention"],
    # The tokenizer: text in the frontend only.
    "tokenizer": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.executor",
                  "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                  "pagedllm.attention", "pagedllm.kernels", "pagedllm.platform"],
    # Small helpers every layer may use: they use nothing of the engine.
    "utils": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.executor",
              "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
              "pagedllm.attention", "pagedllm.platform", "pagedllm.kernels"],
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
    # Reasoning parsers: plain text in, reasoning and answer out, for the server's chat
    # endpoint, LLM.chat and structured outputs' reasoning gate; they know nothing of the
    # engine.
    "reasoning": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                  "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                  "pagedllm.attention", "pagedllm.structured_output", "pagedllm.tool_calling",
                  "torch"],
    # Logits-processor plugins: the interface, class loading and the rows the plugins see,
    # called by the model runner's sampling and the frontend's checks; it calls neither.
    "logits_processor": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                         "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                         "pagedllm.attention", "pagedllm.structured_output"],
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
    "multimodal": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                   "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                   "pagedllm.attention", "pagedllm.executor", "pagedllm.structured_output"],
    "triton_kernels": ["pagedllm.core", "pagedllm.engine", "pagedllm.worker",
                       "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers",
                       "pagedllm.attention", "pagedllm.model_loader", "pagedllm.tokenizer",
                       "pagedllm.kernels"],
}


_ENGINE_PARTS = [
    "pagedllm.core", "pagedllm.engine", "pagedllm.worker", "pagedllm.executor",
    "pagedllm.entrypoints", "pagedllm.models", "pagedllm.layers", "pagedllm.attention",
    "pagedllm.model_loader", "pagedllm.tokenizer", "pagedllm.platform", "pagedllm.kernels",
    "pagedllm.triton_kernels", "pagedllm.distributed", "pagedllm.structured_output",
    "pagedllm.tool_calling", "pagedllm.bench", "torch",
]
# Top-level modules: plain data and process-wide settings, below every package that uses
# them (the configs reach only the capabilities' own config modules).
MODULE_RULES = {
    "config.py": [*_ENGINE_PARTS, "pagedllm.lora.manager", "pagedllm.lora.layers",
                  "pagedllm.spec_decode.proposers", "pagedllm.pooling.model_pooler"],
    "request.py": [*_ENGINE_PARTS, "pagedllm.lora.manager", "pagedllm.lora.layers"],
    "sampling_params.py": _ENGINE_PARTS,
    "pooling_params.py": _ENGINE_PARTS,
    "outputs.py": _ENGINE_PARTS,
    "envs.py": _ENGINE_PARTS,
    "logger.py": _ENGINE_PARTS,
    "__init__.py": [],  # the public API re-exports the top
    # What core reads of multimodal: plain data and bookkeeping, no torch.
    "multimodal/inputs.py": ["torch", "numpy", "transformers"],
    "multimodal/encoder_cache.py": ["torch", "numpy", "transformers"],
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


def _violations(paths: list[Path], banned_prefixes: list[str]) -> list[str]:
    violations = []
    for path in paths:
        for name in _runtime_imports(path):
            for banned in banned_prefixes:
                if name == banned or name.startswith(banned + "."):
                    violations.append(f"{path.relative_to(SRC)} imports {name}")
    return violations


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_layering(package: str):
    violations = _violations(sorted((SRC / package).rglob("*.py")), FORBIDDEN[package])
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("module", sorted(MODULE_RULES))
def test_module_respects_layering(module: str):
    violations = _violations([SRC / module], MODULE_RULES[module])
    assert not violations, "\n".join(violations)


def test_every_package_has_a_rule():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.name for p in SRC.glob("*.py")}
    assert packages <= set(FORBIDDEN), sorted(packages - set(FORBIDDEN))
    assert modules <= set(MODULE_RULES), sorted(modules - set(MODULE_RULES))
