"""Images and video alongside text: what the frontend, the scheduler and the runner share.

- inputs.py: `MultiModalFeature`, one processed item as plain data (no torch), and
  tensor_data.py its tensors to and from bytes;
- processor.py + layouts.py: the frontend's processing over the checkpoint's transformers
  processor (placeholder expansion, item spans, hashing.py);
- encoder_cache.py: the scheduler's encoder budget and cache bookkeeping (pure Python);
- media.py: loading images and videos from URLs for the server;
- video.py: Qwen2-VL's video frames cut into patches (transformers' video processor needs
  torchvision).

The runner's side (running the encoder, its cache, the merge) is a step hook:
worker/step_hooks/multimodal.py; the models are in models/ (llava.py...).
"""
