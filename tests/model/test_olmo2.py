"""OLMo 2 (`Olmo2ForCausalLM`, GGUF `olmo2`): EXAONE 4's layer (norms of the sublayers' outputs
alone) with query and key norms across all heads. The tiny OLMo 2 of `TINY_ARCHS` is held to
transformers' greedy tokens in every setting and its fused layer loop to the Python one; here,
the config as published, the GGUF against transformers with the file's weights, and what is
refused: tensor parallelism (a rank lacks the other ranks' heads its norms span) and OLMo 3's
windowed files."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from inflight.errors import ConfigError, ModelLoadError
from inflight.model.arch import LlamaArchConfig
from inflight.parallel.shard import check_tensor_parallel
from tests.gguf_files import write_tiny_gguf
from tests.model.test_smollm3 import _weights_rounded_as_in
from tests.parity import hf_greedy, random_prompts

PUBLISHED = {  # OLMo-2-0425-1B's config.json, the fields the engine reads
    "architectures": ["Olmo2ForCausalLM"], "vocab_size": 100352, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 16, "max_position_embeddings": 4096, "rope_theta": 500000,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "attention_bias": False,
}  # fmt: skip


def test_a_published_olmo2_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert (arch.architecture, arch.qk_norms_span_heads, arch.sliding_window) == (
        "olmo2", True, None
    )  # fmt: skip
    assert not LlamaArchConfig.from_hf_config({**PUBLISHED, "architectures": [
        "Exaone4ForCausalLM"]}).qk_norms_span_heads  # fmt: skip


def test_tensor_parallelism_is_refused_before_any_rank_starts(tiny_model_factory):
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    check_tensor_parallel(arch, 1)
    with pytest.raises(ValueError, match="norms span all heads at once"):
        check_tensor_parallel(arch, 2)
    with pytest.raises((ConfigError, ValueError), match="norms span all heads at once"):
        LLM(str(tiny_model_factory("olmo2")), tensor_parallel_size=2)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_olmo2_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp's converter names the output norms as Gemma's, the q/k norms attn_q_norm and
    attn_k_norm (as wide as all heads), and leaves Q/K rows as they are (NeoX-style RoPE)."""
    folder = tiny_model_factory("olmo2")
    path = write_tiny_gguf(folder, tmp_path / "olmo2.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    assert llm.core.arch.architecture == "olmo2"
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if qtype != GGMLQuantizationType.F32:
        _weights_rounded_as_in(reference, qtype)
    prompts = random_prompts(llm.core.arch.vocab_size, lengths=(2, 9, 30, 64))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == (
        expected
    )


def test_an_olmo2_file_with_a_window_is_refused(tmp_path, tiny_model_factory):
    """OLMo 3's files (its windowed layers rotate unscaled beside YaRN-scaled global ones)."""
    path = write_tiny_gguf(tiny_model_factory("olmo2"), tmp_path / "olmo3.gguf",
                           GGMLQuantizationType.F32,
                           metadata=lambda w: w.add_sliding_window(4096))  # fmt: skip
    with pytest.raises(ModelLoadError, match="sliding window .OLMo 3. is not supported"):
        LLM(str(path))
