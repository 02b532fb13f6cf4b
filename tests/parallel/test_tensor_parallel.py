"""Tensor parallelism on CPU ranks: a model split over two processes gives one rank's greedy
tokens (which are transformers') for every family, with prefix hits, chunked prompts
and preemption (recomputed and swapped) in the run, over a GGUF's blocks too; sizes that do
not split a model are refused before any rank starts; a rank that dies stops the engine with
its name."""

from __future__ import annotations

import re

import httpx
import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.core.speculation import StepCostFit
from inflight.errors import ConfigError, ModelLoadError
from inflight.model.arch import LlamaArchConfig
from inflight.model.packed_linear import blocks_serve_every_batch
from inflight.parallel.shard import Shard, shard_arch, shard_tensor
from inflight.sampling_params import StructuredOutputs
from tests.gguf_files import k_quant_mix, write_tiny_gguf
from tests.parity import mixed_max_tokens, random_prompts
from tests.server.live import LiveServer
from tests.server.test_errors import assert_error, engine_for

# Every tiny family, for the ways a split differs: Llama's separate q/k/v and gate/up (and
# Llama 3's and Phi-4-mini's RoPE variants, Mistral's window); Phi-3's fused in the checkpoint,
# with a window; Gemma 2's own embedding lookup, output norms and logit cap applied to each
# vocabulary slice; Gemma 3's KV groups and per-head q/k norms (Qwen3's norms too); gpt-oss's
# experts (each split by its columns, stacked and interleaved in the checkpoint), their biases
# and the sinks; Qwen3-MoE's and Mixtral's experts without the stacking; Qwen2's biases on
# q/k/v rows; Granite's multipliers, elementwise; SmolLM3's layers without RoPE; EXAONE 4's
# output norms alone and its four KV groups; GLM-4's and ERNIE 4.5's rotary rows reordered
# within each head; Arcee's MLP without a gate; LFM2's short convolutions, each rank its
# channels and their state; EXAONE 3's GPT-2-style names, renamed before a rank cuts its share;
# OLMo 2's, OLMoE's and MiniMax-M2's q/k norms over all heads, each rank's gathered with the
# others'; Qwen3.5's DeltaNet layers, each rank its key heads and the value heads they serve
# (their state too), and its attention's query gates beside each head (Qwen3-Next's
# projections grouped by key head).
SPLIT_ARCHS = ("llama", "llama3_rope", "phi4_mini", "mistral", "phi3", "gemma2", "gemma3",
               "qwen3", "gpt_oss", "qwen3_moe", "mixtral", "qwen2", "granite", "smollm3",
               "exaone4", "glm4", "ernie4_5", "arcee", "qwen2_moe", "glm4_moe",
               "ernie4_5_moe", "ministral3", "dots1", "hunyuan_moe", "granitemoe",
               "deepseek_v2", "deepseek_v3", "glm4_moe_lite", "lfm2", "lfm2_moe",
               "exaone", "seed_oss", "hunyuan_dense", "gemma", "olmo2", "olmo3", "olmoe",
               "minimax_m2", "qwen3_5", "qwen3_5_moe", "qwen3_next")  # fmt: skip
# Small blocks and pool: preemption happens; small chunks: every long prompt is chunked; 4
# seats: the prompts that share a prefix wait for the ones whose blocks they hit; a context
# within the tiny Phi-4-mini's original one, where transformers rotates with its short factors
SPLIT = {"tensor_parallel_size": 2, "kv_block_size": 4, "max_num_batched_tokens": 64,
         "prefill_chunk_size": 16, "max_num_seqs": 4, "max_model_len": 64}  # fmt: skip
POOL_BLOCKS = 24  # per KV group (pages): a fraction of what 4 sequences of 64 tokens would hold
# windowed and global tables
KV_GROUPS = {"gemma2": 2, "gemma3": 6, "gpt_oss": 2, "exaone4": 4, "olmo3": 4}


def prompts_with_shared_prefixes(vocab_size: int) -> list[list[int]]:
    """8 prompts, the last 4 sharing the first 16 tokens of the first 4 (prefix-cache hits)."""
    base = random_prompts(vocab_size, lengths=(12, 20, 28, 36), seed=3)
    return base + [p[:16] + p[::-1][: len(p) - 16] for p in base]


@pytest.mark.parametrize("arch", SPLIT_ARCHS)
def test_two_ranks_give_one_ranks_greedy_tokens(tiny_model_factory, arch):
    """One rank is held to transformers token for token (model/test_parity_tiny.py)."""
    folder = str(tiny_model_factory(arch))
    knobs = {"dtype": "float32", "preemption_mode": "swap" if arch == "llama" else "recompute",
             "num_kv_blocks": POOL_BLOCKS * KV_GROUPS.get(arch, 1), **SPLIT}  # fmt: skip
    one = LLM(folder, **{**knobs, "tensor_parallel_size": 1})
    prompts = prompts_with_shared_prefixes(one.vocab_size)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
              for n in mixed_max_tokens(len(prompts))]  # fmt: skip
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    llm = LLM(folder, **knobs)
    model = llm.core.loaded.model
    if model.fusable:  # the ranks' layers in the C++ loop, all-reducing where Python's do
        assert model.fused_layers.all_reduce is not None
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.core.scheduler.num_preemptions > 0
    if llm.core.kv_cache_manager.enable_prefix_caching:  # (off for LFM2's convolution state)
        assert llm.core.kv_cache_manager.prefix_stats.hits > 0
    kv = llm.core.kv_cache_manager
    assert kv.pool.num_used_blocks == 0 and not kv.swapped
    llm.core.workers.close()


def test_default_model_over_three_ranks_matches_one():
    """SmolLM2's 9 heads and 3 KV heads split three ways, each rank holding its slices of the
    Q4_1 blocks (16-bit activations, as one rank computes them). In float32, where the blocks
    serve every batch on every CPU kind (a CPU with bf16 would compute this file in bf16); 16
    bits pinned, since where AMX or VNNI make auto 8 bits the all-reduce's summation order moves
    8-bit rounding enough to flip a token."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=16)
    knobs = {"dtype": "float32", "quantized_activations": "int16"}
    one = LLM(kv_cache_memory_bytes=64 << 20, **knobs)
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    del one
    split = LLM(tensor_parallel_size=3, kv_cache_memory_bytes=64 << 20, **knobs)
    got = [o.outputs[0].token_ids for o in split.generate(prompts, params, use_tqdm=False)]
    assert split.core.loaded.model.layers[0].down_proj.blocks_only  # no float copy
    split.core.workers.close()
    assert got == expected


@pytest.mark.skipif(not blocks_serve_every_batch(torch.bfloat16, 16),
                    reason="no 16-column layout (AVX-512 VNNI with bf16)")  # fmt: skip
def test_default_model_in_bf16_over_three_ranks_matches_one():
    """A bf16 engine's ranks each hold their slices of the Q4_1 blocks in the 16-column layout
    alone (no bf16 copy), and give one rank's greedy tokens."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = SamplingParams(temperature=0, max_tokens=16)
    knobs = {"dtype": "bfloat16", "kv_cache_memory_bytes": 64 << 20}
    one = LLM(**knobs)
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    del one
    split = LLM(tensor_parallel_size=3, **knobs)
    got = [o.outputs[0].token_ids for o in split.generate(prompts, params, use_tqdm=False)]
    down = split.core.loaded.model.layers[0].down_proj
    assert down.blocks_only and down.small_kernel == "gguf-int16" and down.in_features == 512
    split.core.workers.close()
    assert got == expected


def test_k_quant_blocks_split_on_block_boundaries(tiny_model_factory, tmp_path):
    """A Q4_K_M-like file: each rank keeps its rows of every matrix and its whole 256-weight
    blocks of down's inputs; o's inputs split mid-block (128 of 256 columns a rank), so o
    loads as floats. Tokens as one rank's, with 16-bit activations: o's floats on the ranks
    then differ from one rank's rounded x by too little to flip a token (the file's default,
    8 bits, moves a random model's near-ties)."""
    path = write_tiny_gguf(tiny_model_factory("llama_wide"), tmp_path / "kmix.gguf", None,
                           mix=k_quant_mix)  # fmt: skip
    prompts = random_prompts(400, lengths=(5, 17, 30), seed=4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    knobs = {"dtype": "float32", "quantized_activations": "int16"}
    one = LLM(str(path), **knobs)
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    split = LLM(str(path), tensor_parallel_size=2, **knobs)
    layer = split.core.loaded.model.layers[0]
    assert layer.down_proj.blocks_only and layer.gate_up_proj.blocks_only
    assert not layer.o_proj.blocks_only and layer.o_proj.in_features == 128
    got = [o.outputs[0].token_ids for o in split.generate(prompts, params, use_tqdm=False)]
    split.core.workers.close()
    assert got == expected


def test_drafts_and_grammars_on_two_ranks(tiny_llama, monkeypatch):
    """A draft model (whole, on rank 0) drafts every step, and its drafts are verified on every
    rank's rows; a grammar (rank 0's alone) masks the gathered logits: the same tokens as one
    rank, every draft of the model drafting for itself kept, the pattern held."""
    monkeypatch.setattr(StepCostFit, "break_even_rate", lambda self: 0.0)  # (untimed)
    knobs = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 96,
             "num_speculative_tokens": 3, "speculative_model": str(tiny_llama)}  # fmt: skip
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12]]
    phone = SamplingParams(
        temperature=0,
        max_tokens=12,
        structured_outputs=StructuredOutputs(regex=r"[0-9]{3}-[0-9]{4}"),
    )
    plain = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    def run(llm: LLM) -> list[list[int]]:
        outputs = llm.generate(prompts, [plain, phone], use_tqdm=False)
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", outputs[1].outputs[0].text)
        return [o.outputs[0].token_ids for o in outputs]

    expected = run(LLM(str(tiny_llama), **knobs))
    split = LLM(str(tiny_llama), tensor_parallel_size=2, **knobs)
    assert run(split) == expected
    stats = split.core.scheduler.speculation.stats
    assert stats.drafted > 5 and stats.accepted == stats.drafted
    split.core.workers.close()


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (3, "tensor_parallel_size 3 does not divide the model's 4 attention heads"),
        (8, "tensor_parallel_size 8 does not divide the model's 4 attention heads"),
        (0, "tensor_parallel_size must be an integer from 1 to 1024, got 0"),
        (2**63, "tensor_parallel_size must be an integer from 1 to 1024"),
        (True, "tensor_parallel_size must be an integer, got True"),
        (2.5, "tensor_parallel_size must be an integer, got 2.5"),
    ],
)
def test_sizes_that_do_not_split_are_refused_before_any_rank_starts(tiny_llama, size, message,
                                                                    monkeypatch):  # fmt: skip
    def no_ranks(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr("inflight.engine.engine_core.RankWorkers", no_ranks)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        LLM(str(tiny_llama), tensor_parallel_size=size)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"distributed_executor_backend": "mpi"}, "must be mp or ray, got 'mpi'"),
        ({"ray_cpus_per_rank": 0}, "ray_cpus_per_rank must be an integer from 1 to 65536, got 0"),
        ({"ray_cpus_per_rank": 2**64}, "from 1 to 65536, got 18446744073709551616"),
        ({"ray_cpus_per_rank": True}, "ray_cpus_per_rank must be an integer, got True"),
        ({"ray_cpus_per_rank": 1.5}, "ray_cpus_per_rank must be an integer, got 1.5"),
        # Ray ranks need a cluster this process has joined (tests/server/test_replicas.py has one)
        ({"distributed_executor_backend": "ray"}, "needs a Ray cluster: call ray.init"),
    ],
)
def test_ray_rank_knobs_are_checked(tiny_llama, knobs, message, monkeypatch):
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        LLM(str(tiny_llama), tensor_parallel_size=2, **knobs)


def test_ranks_that_would_not_fit_in_memory_together_are_refused_before_starting(
    tiny_llama, monkeypatch
):  # fmt: skip
    """Two ranks on one machine: all the weights and two pools, each of half the heads."""
    monkeypatch.setattr("inflight.engine.engine_core.RankWorkers", None)
    monkeypatch.setattr("inflight.model.loader.available_memory_bytes", lambda: 2**18)
    # blocks x tokens x layers x (K, V) x 1 KV head x head_dim x 4 bytes: 0.15 GiB a rank
    pool = 40_000 * 16 * 2 * 2 * 1 * 16 * 4
    with pytest.raises(ModelLoadError, match=f"{2 * pool / 2**30:.2f} GiB for the KV pool"):
        LLM(str(tiny_llama), dtype="float32", tensor_parallel_size=2, num_kv_blocks=40_000)


def test_health_says_the_engine_is_down_when_a_rank_dies(tiny_llama):
    with LiveServer(engine_for(tiny_llama, tensor_parallel_size=2), served_model_name="t") as s:
        assert httpx.get(s.url + "/health").status_code == 200
        rank = s.engine.core.workers.launcher._procs[0]
        rank.kill()
        rank.wait()
        body = {"model": "t", "prompt": "x", "max_tokens": 4}
        response = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        assert_error(response, 503, "engine_unavailable", None, "rank 1 (pid")
        assert "exited with code -9" in response.json()["error"]["message"]
        assert_error(httpx.get(s.url + "/health"), 503, "engine_unavailable")


def test_slices_cover_every_weight_once():
    """Column-parallel slices of q/k/v (fused or not) and gate/up tile the rows exactly, o and
    down tile the columns, and o's bias is counted once."""
    arch = LlamaArchConfig(architecture="llama", vocab_size=12, hidden_size=8,
                           intermediate_size=6, num_layers=1, num_heads=4, num_kv_heads=2,
                           head_dim=2, rms_norm_eps=1e-5, rope_theta=1e4,
                           max_position_embeddings=64, tie_word_embeddings=False)  # fmt: skip
    q = torch.arange(8 * 8.0).view(8, 8)
    kv = torch.arange(4 * 8.0).view(4, 8) + 100
    qkv = torch.cat([q, kv, kv + 100])
    gate_up = torch.arange(12 * 8.0).view(12, 8)
    shards = [Shard(arch, r, 2) for r in range(2)]
    layer = "model.layers.0"
    got = {r: {n: shard_tensor(s, f"{layer}.{n}", t) for n, t in
               {"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": kv,
                "self_attn.qkv_proj.weight": qkv, "mlp.gate_up_proj.weight": gate_up,
                "self_attn.o_proj.weight": q, "self_attn.o_proj.bias": torch.ones(8),
                "mlp.down_proj.weight": gate_up[:8, :6]}.items()}
           for r, s in enumerate(shards)}  # fmt: skip
    assert torch.equal(torch.cat([got[0]["self_attn.q_proj.weight"],
                                  got[1]["self_attn.q_proj.weight"]]), q)  # fmt: skip
    assert torch.equal(got[1]["self_attn.k_proj.weight"], kv[2:])
    assert torch.equal(got[1]["self_attn.qkv_proj.weight"],
                       torch.cat([q[4:], kv[2:], kv[2:] + 100]))  # fmt: skip
    assert torch.equal(got[1]["mlp.gate_up_proj.weight"], torch.cat([gate_up[3:6], gate_up[9:]]))
    assert torch.equal(got[1]["self_attn.o_proj.weight"], q[:, 4:])
    assert torch.equal(got[0]["self_attn.o_proj.bias"] + got[1]["self_attn.o_proj.bias"],
                       torch.ones(8))  # fmt: skip
    assert torch.equal(got[0]["mlp.down_proj.weight"], gate_up[:8, :3])
    assert shard_arch(shards[0]).num_heads == 2 and shard_arch(shards[0]).vocab_size == 6


def test_experts_split_by_their_own_columns():
    """Each expert's gate/up rows and down inputs by the experts' width (not the dense MLP's),
    under each checkpoint's names: per expert (Qwen3-MoE's, a GGUF's), Mixtral's w1/w3/w2, and
    gpt-oss's stacks with gate and up interleaved; routers whole; down's biases counted once."""
    arch = LlamaArchConfig(architecture="gpt_oss", vocab_size=12, hidden_size=8,
                           intermediate_size=6, num_layers=1, num_heads=4, num_kv_heads=2,
                           head_dim=2, rms_norm_eps=1e-5, rope_theta=1e4,
                           max_position_embeddings=64, tie_word_embeddings=False, num_experts=3,
                           experts_per_token=2, expert_intermediate_size=4)  # fmt: skip
    gate, down = torch.arange(4 * 8.0).view(4, 8), torch.arange(8 * 4.0).view(8, 4)
    stack = torch.arange(3 * 8 * 8.0).view(3, 8, 8)  # [E, hidden, 2I]: gate, up, gate, up, ...
    rank1 = Shard(arch, 1, 2)
    mlp = "model.layers.0.mlp"
    for name in ("experts.2.gate_proj.weight", "experts.2.up_proj.weight"):
        assert torch.equal(shard_tensor(rank1, f"{mlp}.{name}", gate), gate[2:])
    assert torch.equal(shard_tensor(rank1, f"{mlp}.experts.0.down_proj.weight", down), down[:, 2:])
    moe = "model.layers.0.block_sparse_moe"
    assert torch.equal(shard_tensor(rank1, f"{moe}.experts.1.w3.weight", gate), gate[2:])
    assert torch.equal(shard_tensor(rank1, f"{moe}.experts.1.w2.weight", down), down[:, 2:])
    assert torch.equal(shard_tensor(rank1, f"{moe}.gate.weight", down), down)  # the router
    assert torch.equal(shard_tensor(rank1, f"{mlp}.experts.gate_up_proj", stack), stack[..., 4:])
    assert torch.equal(shard_tensor(rank1, f"{mlp}.experts.down_proj", stack), stack[:, 2:4])
    bias = torch.ones(3, 8)
    assert not shard_tensor(rank1, f"{mlp}.experts.down_proj_bias", bias).any()
    assert torch.equal(shard_tensor(Shard(arch, 0, 2), f"{mlp}.experts.down_proj_bias", bias),
                       bias)  # fmt: skip
    assert shard_arch(rank1).expert_intermediate_size == 2
    assert shard_arch(rank1).intermediate_size == 3


def test_more_ranks_than_kv_heads_share_them():
    arch = LlamaArchConfig(architecture="llama", vocab_size=8, hidden_size=8,
                           intermediate_size=8, num_layers=1, num_heads=4, num_kv_heads=2,
                           head_dim=2, rms_norm_eps=1e-5, rope_theta=1e4,
                           max_position_embeddings=64, tie_word_embeddings=False)  # fmt: skip
    # ranks 0-1 read KV head 0 with query heads 0 and 1; ranks 2-3 KV head 1
    assert [list(Shard(arch, r, 4).kv_heads) for r in range(4)] == [[0], [0], [1], [1]]
    assert [list(Shard(arch, r, 4).heads) for r in range(4)] == [[0], [1], [2], [3]]


def test_ray_bundles_are_counted_against_the_nodes_cpus():
    """A rank's bundle defaults to the smallest node's CPUs (a head node offering none aside);
    bundles fit where whole ones fit the nodes, the first on rank 0's node."""
    from inflight.parallel.ray_ranks import bundles_fit, default_cpus_per_rank

    nodes = {"big": 8, "small": 4, "head": 0}
    assert default_cpus_per_rank(nodes) == 4
    assert bundles_fit(3, 4, nodes, "big")  # two on the big node, one on the small one
    assert not bundles_fit(4, 4, nodes, "big")
    assert not bundles_fit(2, 4, nodes, "head"), "rank 0's node holds no bundle"
    assert bundles_fit(3, 4, nodes, None)
    with pytest.raises(ConfigError, match="offers no CPUs"):
        default_cpus_per_rank({"head": 0})
