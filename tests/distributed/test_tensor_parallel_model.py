"""A whole decoder split over two tensor-parallel gloo ranks: tiny Llama (GQA: 4 query heads,
2 KV heads: one each), Qwen2 (q/k/v biases, tied embeddings) and the MoE models (Mixtral;
Qwen2-MoE with its shared expert and a dense layer), each expert split or, with expert
parallelism, whole experts per rank, built from the parallel layers and loaded from the
ordinary checkpoint, give transformers' logits on every rank (prefill, then decode through
each rank's own paged KV cache), and the greedy tokens of the gathered best-of-share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from pagedllm.distributed import parallel_state


def _rank_main(rank: int, world_size: int, init_file: str, model_dir: str,
               expert_parallel: bool = False) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from pagedllm.model_loader.hf_config import get_architecture
    from pagedllm.models.registry import resolve_model_class
    from tests.models.test_model_parity import ATOL, PagedRunner

    parallel_state.init_distributed_environment(world_size, rank, f"file://{init_file}",
                                                "gloo")
    parallel_state.initialize_model_parallel(world_size, 1, expert_parallel)
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
        hidden = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            assert torch.equal(ours.compute_greedy_tokens(hidden),
                               ours.compute_logits(hidden).argmax(-1))
        experts = [m for m in ours.modules() if hasattr(m, "local_experts")]
        if experts and expert_parallel:  # whole experts: half of them here
            assert len(experts[0].local_experts) == experts[0].num_experts // world_size
    finally:
        parallel_state.destroy_model_parallel()


@pytest.mark.parametrize("model_fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_two_ranks_equal_transformers(model_fixture, request, tmp_path: Path):
    model_dir = request.getfixturevalue(model_fixture)
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init"), str(model_dir)), nprocs=2,
             join=True)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("expert_parallel", [False, True], ids=["split-experts", "ep"])
def test_moe_over_two_ranks_equals_transformers(arch, expert_parallel, tmp_path: Path):
    from tests.models.test_model_parity import _config, save_random

    model_dir = save_random(tmp_path / arch, _config(arch))
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init"), str(model_dir), expert_parallel),
             nprocs=2, join=True)
