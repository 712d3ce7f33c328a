#!/usr/bin/env bash
# Everything the CUDA backend has to show, in one command for a session's GPU machine (the
# device tool: `run` with command `bash benchmarks/gpu_run.sh` and carry [".gpu"]).
#
# Prepare .gpu here first (it is in .git/info/exclude; about 5 MB, 19 MB with transformers):
#   python benchmarks/random_checkpoint.py export .gpu/smollm2
#   cp -r "$(python -c 'import sys; sys.path[:0] = ["benchmarks", "src"]; \
#     import multimodal; print(multimodal.smollm2_tokenizer_dir())')" .gpu/smollm2_tokenizer
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .gpu/whl gguf msgspec pyzmq
# The machine's image has torch, triton, transformers and pytest; the wheels add the rest
# (transformers too, where the tests need a newer one than the image's).
#
# Arguments pick the parts (default: all): tests decode throughput multimodal, e.g.
#   bash benchmarks/gpu_run.sh tests multimodal
# Results go to $OUT (the device tool brings them back) or ./gpu_results. The timeouts keep
# each part under ~4 minutes (tests and multimodal together ran 4.5 minutes on an H100); a
# session's 15 minutes of device time then allow one rerun of a part.
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS=" ${*:-tests decode throughput multimodal} "
for part in $PARTS; do
    case "$part" in tests|decode|throughput|multimodal) ;;
        *) echo "unknown part '$part' (tests, decode, throughput, multimodal)" >&2; exit 2 ;;
    esac
done
want() { [[ "$PARTS" == *" $1 "* ]]; }
RESULTS=${OUT:-gpu_results}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:/tmp/site"
if compgen -G ".gpu/whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        .gpu/whl/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RESULTS/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$RESULTS/gpu.txt"
MODEL=$PWD/.gpu/smollm2
if want decode || want throughput; then
    [ -f .gpu/smollm2/model.safetensors ] || python3 benchmarks/random_checkpoint.py fill .gpu/smollm2
fi
if want tests; then
    PAGEDLLM_TEST_CUDA=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/cuda \
        2>&1 | tee "$RESULTS/tests_cuda.log"
fi
cd benchmarks
if want decode; then
    for eager in "" "--enforce-eager"; do
        timeout 75 python3 cuda_decode.py --model "$MODEL" --dtype bfloat16 --quantization int4 \
            $eager --output-json "$RESULTS/cuda_decode${eager:+_eager}.json" 2>&1 \
            | tee -a "$RESULTS/cuda_decode.log"
    done
fi
if want throughput; then
    timeout 150 python3 throughput.py --model "$MODEL" --device cuda --dtype bfloat16 \
        --quantization int4 --num-prompts 256 --output-len 128 --compare hf --hf-dtype bfloat16 \
        --hf-batch-size 64,256 --output-json "$RESULTS/throughput_cuda.json" 2>&1 \
        | tee "$RESULTS/throughput_cuda.log"
fi
if want multimodal; then
    # LLaVA-shaped (CLIP ViT-B/16 + a SmolLM2-135M-sized Llama), built here (~0.9 GB), bf16.
    TOKENIZER=(); [ -d ../.gpu/smollm2_tokenizer ] && TOKENIZER=(--tokenizer ../.gpu/smollm2_tokenizer)
    timeout 150 python3 multimodal.py --device cuda --model-dir /tmp/llava-bench \
        ${TOKENIZER[@]+"${TOKENIZER[@]}"} \
        --dtype bfloat16 --num-requests 32 --max-tokens 16 --num-iters 5 --ttft-repeats 3 \
        --output-json "$RESULTS/multimodal_llava_16.json" 2>&1 | tee "$RESULTS/multimodal.log"
    timeout 100 python3 multimodal.py --device cuda --model-dir /tmp/llava-bench \
        ${TOKENIZER[@]+"${TOKENIZER[@]}"} \
        --dtype bfloat16 --num-requests 32 --max-tokens 128 --num-iters 3 --ttft-repeats 1 \
        --skip-hf-sequential --output-json "$RESULTS/multimodal_llava_128.json" 2>&1 \
        | tee -a "$RESULTS/multimodal.log"
fi
