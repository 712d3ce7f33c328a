"""`pagedllm bench throughput|latency|serve`: vLLM's benchmark commands, with progress bars.

throughput.py and latency.py run the engine in-process (`LLM`); serve.py drives a running
OpenAI-compatible server (ours or any other) with streaming requests. The comparisons with
peers (transformers, llama.cpp) stay in the repository's benchmarks/ scripts, which share
serve.py's client.
"""
