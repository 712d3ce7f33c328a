"""pagedllm: high-throughput LLM inference with a paged KV cache and continuous batching."""
