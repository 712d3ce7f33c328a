"""`pagedllm serve -dp 2 -tp 2`: two engine cores, each with two tensor-parallel worker
processes, behind one API server: concurrent completions equal one offline engine's greedy
text, and /metrics adds the two cores up (every block free at the end)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pagedllm import LLM, SamplingParams
from tests.entrypoints.openai.conftest import API_KEY, metric, start_server, stop_server

PROMPTS = [f"Data parallel request number {i}" for i in range(6)]


def test_two_cores_behind_one_server(tiny_qwen2_dir, tmp_path):
    import httpx

    llm = LLM(str(tiny_qwen2_dir), dtype="float32", max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    server = start_server(
        [str(tiny_qwen2_dir), "-dp", "2", "-tp", "2", "--dtype", "float32",
         "--max-model-len", "256", "--api-key", API_KEY], tmp_path / "server.log")
    try:
        with httpx.Client(base_url=server.base_url, timeout=120.0,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as http:

            def complete(prompt: str) -> str:
                response = http.post("/v1/completions", json={
                    "model": str(tiny_qwen2_dir), "prompt": prompt, "max_tokens": 8,
                    "temperature": 0, "ignore_eos": True})
                assert response.status_code == 200, response.text
                return response.json()["choices"][0]["text"]

            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                assert list(pool.map(complete, PROMPTS)) == want
            text = http.get("/metrics").text
            assert metric(text, "pagedllm:num_requests_running") == 0
            assert metric(text, "pagedllm:kv_cache_usage_perc") == 0
            assert metric(text, "pagedllm:request_success_total") == len(PROMPTS)
    finally:
        stop_server(server)
