"""The real default model against transformers loading the same GGUF: greedy, float32, token for
token, with 16 mixed-length prompts in one batch, with every prompt chunked, under preemption,
and four at a time (every decode step small enough to multiply from the GGUF blocks), with
activations rounded to 16 bits over the blocks (`quantized_activations` auto's choice for this
file in float32, but on CPUs with AMX tiles, where auto takes 8 bits) and on the exact float32
path.
"""

from __future__ import annotations

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.kernels import load_extension
from inflight.model.loader import model_activations
from inflight.model.packed_linear import blocks_serve_every_batch, eight_bits_are_faster
from tests.parity import hf_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_TOKENS = [16, 12, 20, 8, 12, 16, 12, 18, 12, 12, 20, 16, 12, 12, 8, 16]

ENGINE_SETTINGS = {
    "one_batch": {},
    "chunked_prefill": {"prefill_chunk_size": 32, "max_num_batched_tokens": 256},
    # 36 blocks of 16 = 576 tokens for ~1,700 tokens of demand: preemption is certain.
    "preemption": {"num_kv_blocks": 36, "max_num_batched_tokens": 512},
    "four_at_a_time": {"max_num_seqs": 4},
    "four_at_a_time_exact": {"max_num_seqs": 4, "quantized_activations": "off"},
}


@pytest.fixture(scope="module")
def expected(hf_default_model, smollm_prompts):
    return hf_greedy(hf_default_model, smollm_prompts, MAX_TOKENS)


@pytest.mark.parametrize("setting", list(ENGINE_SETTINGS))
def test_smollm2_greedy_parity(smollm_prompts, expected, loaded_float32, setting):
    assert max(len(p) for p in smollm_prompts) > 256 and min(len(p) for p in smollm_prompts) < 10
    knobs = ENGINE_SETTINGS[setting]
    knobs = {"quantized_activations": "int16", **knobs}
    llm = LLM(dtype="float32", loaded_model=loaded_float32(knobs["quantized_activations"]), **knobs)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(smollm_prompts, params, use_tqdm=False)
    for i, (out, want) in enumerate(zip(outputs, expected, strict=True)):
        assert out.outputs[0].token_ids == want, f"prompt {i} diverged"
    if setting == "preemption":
        assert llm.core.scheduler.num_preemptions > 0
    if setting.startswith("four_at_a_time") and load_extension().gguf_linear_available():
        fused = llm.core.loaded.model.fused_layers
        assert fused.small_batch_rows >= 4
        exact = setting.endswith("exact")
        assert fused.activation_bits == (0 if exact else 16) and not fused.decode_weights
    pool = llm.core.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks
    faster = eight_bits_are_faster() and blocks_serve_every_batch(torch.float32, 8)
    assert model_activations(llm.core.loaded.path, torch.float32) == ("int8" if faster else "int16")
