"""A whole decoder split over two tensor-parallel gloo ranks: tiny Llama (GQA: 4 query heads,
2 KV heads: one each) and Qwen2 (q/k/v biases, tied embeddings) built from the parallel
layers, loaded from the ordinary checkpoint, give transformers' logits on every rank
(prefill, then decode through each rank's own paged KV cache)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from pagedllm.distributed import parallel_state


def _rank_main(rank: int, world_size: int, init_file: str, model_dir: str) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from pagedllm.model_loader.hf_config import get_architecture
    from pagedllm.models.registry import resolve_model_class
    from tests.models.test_model_parity import ATOL, PagedRunner

    parallel_state.init_distributed_environment(world_size, rank, f"file://{init_file}",
                                                "gloo")
    parallel_state.initialize_model_parallel(world_size)
    try:
        path = Path(model_dir)
        config = AutoConfig.from_pretrained(path)
        ours = resolve_model_class(get_architecture(config))(config).eval()
        ours.load_weights(load_file(path / "model.safetensors").items())
        attention = ours.model.layers[0].self_attn.attn
        assert attention.num_heads == config.num_attention_heads // world_size
        spec = ours.spec
        runner = PagedRunner(ours, (spec.num_layers, attention.num_kv_heads, spec.head_dim))
        theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokens = torch.randint(3, config.vocab_size, (12,),
                               generator=torch.Generator().manual_seed(1)).tolist()
        with torch.no_grad():
            want = theirs(torch.tensor([tokens])).logits[0]
        (prefill,) = runner.step([("a", tokens[:9])])
        decoded = [runner.step([("a", [t])])[0] for t in tokens[9:]]
        got = torch.cat([prefill, *decoded])
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
    finally:
        parallel_state.destroy_model_parallel()


@pytest.mark.parametrize("model_fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_two_ranks_equal_transformers(model_fixture, request, tmp_path: Path):
    model_dir = request.getfixturevalue(model_fixture)
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init"), str(model_dir)), nprocs=2,
             join=True)
