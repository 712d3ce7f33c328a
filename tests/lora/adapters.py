"""Random PEFT LoRA adapters made with peft, and transformers (+ peft) greedy references."""

from __future__ import annotations

import torch

MAX_TOKENS = 16
# (rank, alpha, targets, rsLoRA)
ADAPTERS = [
    (8, 16, ["q_proj", "v_proj"], False),
    (4, 8, ["q_proj", "k_proj", "v_proj", "o_proj"], False),
    (16, 32, ["gate_proj", "up_proj", "down_proj"], True),
    (8, 4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
     False),
]


def make_adapter(model_dir, out_dir, rank, alpha, targets, rslora, seed):
    """A random PEFT LoRA adapter (lora_B not zero, so it changes the output)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                        lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.05)
    model.save_pretrained(out_dir)
    return out_dir


def reference_tokens(model_dir, adapter_dir, prompts):
    """transformers (+ peft when an adapter is given) greedy continuations."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import hf_greedy_tokens

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).eval()
    return hf_greedy_tokens(model, prompts, MAX_TOKENS)


def misfit_adapter(source, out_dir):
    """A copy of `source` whose q_proj lora_A reads one feature more than the model has."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out_dir)
    weights = load_file(str(out_dir / "adapter_model.safetensors"))
    for name, tensor in list(weights.items()):
        if "q_proj.lora_A" in name:
            weights[name] = torch.zeros(tensor.shape[0], tensor.shape[1] + 1)
    save_file(weights, str(out_dir / "adapter_model.safetensors"))
    return out_dir
