"""A random-weight checkpoint with the default model's shapes, for machines without it.

The GPU machines of the device tool reach no package registry, and the default model's
package (about 100 MB) is too large to carry there with a command. Speed does not depend on
the weights' values, so the GPU benchmarks run a checkpoint with SmolLM2-135M's config and
tokenizer and random weights, quantized to int4 by the engine (the same group kernel the
GGUF's codes run on):

    python benchmarks/random_checkpoint.py export .gpu/smollm2   # here: config + tokenizer
    python3 benchmarks/random_checkpoint.py fill .gpu/smollm2    # there: random bf16 weights
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def export(folder: Path) -> None:
    """The default GGUF's HF config and tokenizer folders, copied into `folder`."""
    from common import default_model_path

    from pagedllm.model_loader.gguf_cache import config_folder, tokenizer_folder

    folder.mkdir(parents=True, exist_ok=True)
    for source in (config_folder(default_model_path()), tokenizer_folder(default_model_path())):
        for item in Path(source).iterdir():
            shutil.copy(item, folder / item.name)
    print(f"config and tokenizer in {folder}: {sorted(p.name for p in folder.iterdir())}")


def fill(folder: Path, seed: int) -> None:
    """Random weights (transformers' initialisation, bfloat16) for the config in `folder`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    print(f"random {config.model_type} weights in {folder}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("export", "fill"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.action == "export":
        export(args.folder)
    else:
        fill(args.folder, args.seed)


if __name__ == "__main__":
    main()
