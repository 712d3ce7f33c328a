"""LoRA adapters: many fine-tuned variants of one base model served in the same batches.

`LoRARequest` names a PEFT adapter folder; `peft_adapter.py` reads and checks it; the worker's
`LoRAModelManager` (manager.py) keeps the step's adapters in slots and hands every linear
layer its slot weights; each layer adds its adapters' deltas, grouped by adapter (layers.py).
Nothing here is imported eagerly: the request type travels through torch-free layers.
"""
