"""Decode-step fast paths the worker owns, one per platform (base.py): the CPU's one-call
decoder stack (cpu_stack.py) and CUDA graphs (cuda_graphs.py)."""

from pagedllm.worker.decode_step.base import DecodeBatch, DecodeStep

__all__ = ["DecodeBatch", "DecodeStep"]
