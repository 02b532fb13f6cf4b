"""Decode steps through `DecodeGraphs`: static buffers, padded batch sizes, a scratch block.

Without a GPU nothing is captured, but the forward reads the same static buffers (through the
C++ kernels' `decode_metadata`), so the filling and padding are checked here on any machine;
with a GPU the graphs are captured and replayed for real.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.engine import engine_core
from inflight.engine.engine_core import warm_up_tokens
from inflight.runner.cuda_graphs import DecodeGraphs, graph_batch_sizes

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Small blocks and a pool that binds: block 0 belongs to some request at most steps, so a
# padding row that wrote anywhere but the scratch block would change someone's tokens.
KNOBS = dict(dtype="float32", attention_backend="triton", kv_block_size=4, num_kv_blocks=48,
             max_num_seqs=11, max_num_batched_tokens=96, enable_prefix_caching=False)  # fmt: skip


def test_batch_sizes_step_by_eight_and_end_at_the_cap():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(4) == [1, 2, 4]
    assert graph_batch_sizes(11) == [1, 2, 4, 8, 11]
    assert graph_batch_sizes(256)[:6] == [1, 2, 4, 8, 16, 24]
    assert graph_batch_sizes(256)[-2:] == [248, 256]


def generate(llm: LLM) -> list[list[int]]:
    rng = random.Random(0)
    vocab = llm.core.arch.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 30))] for _ in range(14)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(4, 20), ignore_eos=True)
              for _ in prompts]  # fmt: skip
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def count_graph_steps(llm: LLM) -> list[int]:
    """Wraps the engine's DecodeGraphs.load to record each graph step's batch size."""
    graphs = llm.core.runner.decode_graphs
    assert isinstance(graphs, DecodeGraphs)
    sizes: list[int] = []
    load = graphs.load

    def counted(scheduled):
        sizes.append(len(scheduled))
        return load(scheduled)

    graphs.load = counted
    return sizes


@pytest.fixture
def eager_tokens(tiny_llama):
    """The tokens of eager steps; on a CPU the reference attention's (Triton's interpreter
    would take a minute for the same tokens)."""
    attention = "triton" if torch.cuda.is_available() else "torch"
    return generate(
        LLM(str(tiny_llama), enforce_eager=True, **{**KNOBS, "attention_backend": attention})
    )


def test_static_buffers_give_the_eager_tokens(tiny_llama, eager_tokens, monkeypatch):
    monkeypatch.setattr(engine_core, "supports_graphs", lambda attn, device: True)
    # On a CPU the C++ kernels read the buffers as Triton's would (and run in a second, where
    # Triton's interpreter takes half a minute): any backend with `decode_metadata` will do.
    attention = "triton" if torch.cuda.is_available() else "cpu"
    llm = LLM(str(tiny_llama), **{**KNOBS, "attention_backend": attention})
    kv = llm.core.kv_cache
    assert kv.scratch_block == kv.num_blocks == 48
    assert kv.layers[0][0].shape[0] == 49, "one block past the pool's"
    sizes = count_graph_steps(llm)

    assert generate(llm) == eager_tokens
    assert len(set(sizes)) > 3, "decode steps of several batch sizes, most of them padded"
    pool = llm.core.kv_cache_manager.pool
    assert pool.num_blocks == 48 and pool.num_free_blocks == 48
    assert llm.core.scheduler.num_preemptions > 0, "the pool was meant to bind"


def test_steps_with_prompt_tokens_and_eager_engines_skip_the_graphs(tiny_llama, monkeypatch):
    if not torch.cuda.is_available():
        assert LLM(str(tiny_llama), **KNOBS).core.runner.decode_graphs is None
    monkeypatch.setattr(engine_core, "supports_graphs", lambda attn, device: True)
    llm = LLM(str(tiny_llama), **{**KNOBS, "enforce_eager": True})
    assert llm.core.runner.decode_graphs is None
    assert llm.core.kv_cache.scratch_block == 48, "every engine keeps one, for its warm-up"
    graphs = LLM(str(tiny_llama), **KNOBS).core.runner.decode_graphs

    def step(num_tokens: int, sample: bool = True) -> SimpleNamespace:
        return SimpleNamespace(num_tokens=num_tokens, sample=sample)

    assert graphs.fits([step(1)] * 11)
    assert not graphs.fits([step(1)] * 12), "more than the largest graph"
    assert not graphs.fits([step(1), step(5)]), "a prompt chunk in the step"
    assert not graphs.fits([step(1, sample=False)])


def test_warm_up_writes_only_the_scratch_block(tiny_llama):
    """The start-up step (run again here by hand) leaves every block of the pool as it was."""
    llm = LLM(str(tiny_llama), **KNOBS)
    kv = llm.core.kv_cache
    for k, v in kv.layers:
        k.normal_()
        v.normal_()
    before = [(k.clone(), v.clone()) for k, v in kv.layers]
    llm.core.runner.warm_up(96)  # the step budget: 24 blocks' worth, all in the scratch block
    pool = slice(0, kv.num_blocks)
    for (k, v), (k0, v0) in zip(kv.layers, before, strict=True):
        assert torch.equal(k[pool], k0[pool]) and torch.equal(v[pool], v0[pool])
        assert not torch.equal(k[kv.scratch_block], k0[kv.scratch_block])


def test_warm_up_size_per_device():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert warm_up_tokens(2048, 8192, gpu, 16) == 2048, "a GPU's: the step budget"
    assert warm_up_tokens(2048, 1000, gpu, 16) == 1000, "within one request's length"
    assert warm_up_tokens(2048, 8192, cpu, 16) == 16, "a CPU's: one block"
    assert warm_up_tokens(8, 8192, cpu, 16) == 8


@GPU
def test_captured_graphs_give_the_eager_tokens(tiny_llama, eager_tokens):
    llm = LLM(str(tiny_llama), **KNOBS)
    sizes = count_graph_steps(llm)
    assert generate(llm) == eager_tokens
    graphs = llm.core.runner.decode_graphs
    assert sizes and all(g is not None for g, _ in graphs.graphs.values())


@pytest.mark.parametrize("arch", ["gemma3", pytest.param("gpt_oss", marks=GPU)])
def test_graphs_read_each_kv_groups_table(arch, tiny_model_factory, monkeypatch):
    """Windowed layers give their pages back under graphs too: each group's table and slots
    sit in the buffers, and every layer reads its own group's (Gemma 3: one global group beside
    windowed ones; gpt-oss on a GPU, where its experts are routed there: banded and global
    layers, sinks)."""
    folder = str(tiny_model_factory(arch))
    attention = "triton" if torch.cuda.is_available() else "torch"
    knobs = {**KNOBS, "num_kv_blocks": 200}  # pages of a group's layers: more of them
    eager = LLM(folder, enforce_eager=True, **{**knobs, "attention_backend": attention})
    want = generate(eager)
    monkeypatch.setattr(engine_core, "supports_graphs", lambda attn, device: True)
    # (on a CPU the C++ kernels read the buffers, as in the test above)
    llm = LLM(
        folder, **{**knobs, "attention_backend": "triton" if attention == "triton" else "cpu"}
    )
    graphs = llm.core.runner.decode_graphs
    assert graphs is not None and graphs.num_groups == llm.core.kv_layout.num_groups > 1
    sizes = count_graph_steps(llm)
    assert generate(llm) == want
    assert len(sizes) > 10 and llm.core.kv_cache_manager.num_window_releases > 0
    pool = llm.core.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks
