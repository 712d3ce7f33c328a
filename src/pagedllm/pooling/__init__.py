"""Pooling models: how a sequence's hidden states become one embedding, class scores or a
reward (vLLM's pooling runner). `config.py` reads the pooling setup as vLLM does (overrides,
or a sentence-transformers folder); `pooler.py` pools packed hidden states."""
