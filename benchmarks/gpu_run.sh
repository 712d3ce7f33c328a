#!/usr/bin/env bash
# Everything the CUDA backend has to show, in one command for a session's GPU machine (the
# device tool: `run` with command `bash benchmarks/gpu_run.sh` and carry [".gpu"]).
#
# Prepare .gpu here first (it is in .git/info/exclude; about 5 MB):
#   python benchmarks/random_checkpoint.py export .gpu/smollm2
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .gpu/whl gguf msgspec pyzmq
# The machine's image has torch, triton, transformers and pytest; the wheels add the rest.
# Results go to $OUT (the device tool brings them back) or ./gpu_results. The timeouts keep
# the whole script under ~9 minutes, so a session's 15 minutes of device time allow a rerun.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-gpu_results}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:/tmp/site"
if compgen -G ".gpu/whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RESULTS/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$RESULTS/gpu.txt"
[ -f .gpu/smollm2/model.safetensors ] || python3 benchmarks/random_checkpoint.py fill .gpu/smollm2

PAGEDLLM_TEST_CUDA=1 timeout 220 python3 -m pytest -q -p no:cacheprovider -rs tests/cuda \
    2>&1 | tee "$RESULTS/tests_cuda.log"
MODEL=$PWD/.gpu/smollm2
cd benchmarks
for eager in "" "--enforce-eager"; do
    timeout 75 python3 cuda_decode.py --model "$MODEL" --dtype bfloat16 --quantization int4 \
        $eager --output-json "$RESULTS/cuda_decode${eager:+_eager}.json" 2>&1 \
        | tee -a "$RESULTS/cuda_decode.log"
done
timeout 150 python3 throughput.py --model "$MODEL" --device cuda --dtype bfloat16 \
    --quantization int4 --num-prompts 256 --output-len 128 --compare hf --hf-dtype bfloat16 \
    --hf-batch-size 64,256 --output-json "$RESULTS/throughput_cuda.json" 2>&1 \
    | tee "$RESULTS/throughput_cuda.log"
