"""Model loading: find the checkpoint, read its config, stream its weights into a model.

`source` resolves what the user named to a local folder or GGUF file (nothing is downloaded),
`hf_config` reads the transformers config and derives dtype and `max_model_len`,
`safetensors` and `gguf` iterate HF-named tensors, and `loader.get_model` builds the model.
"""
