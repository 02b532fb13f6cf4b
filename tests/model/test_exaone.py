"""EXAONE 3.0 and 3.5 (`ExaoneForCausalLM`, GGUF `exaone`): Llama's decoder under GPT-2-style
checkpoint names. The tiny EXAONE 3.5 of `TINY_ARCHS` (as transformers 5 saves it: the original
names, Llama's architecture, `model_type` exaone) is held to transformers' greedy tokens in every
setting; here, the config as published (EXAONE's own key names), a folder written that way, and
the GGUF against transformers with the file's weights."""

from __future__ import annotations

import json
import shutil

import pytest
from gguf import GGMLQuantizationType

from inflight import LLM, SamplingParams
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import tiny_gguf_engine
from tests.parity import assert_gguf_generates_as_its_weights, random_prompts

EXAONE35_7B = {  # EXAONE-3.5-7.8B-Instruct's config.json, the fields the engine reads
    "architectures": ["ExaoneForCausalLM"], "model_type": "exaone", "activation_function": "silu",
    "head_dim": 128, "hidden_size": 4096, "intermediate_size": 14336, "layer_norm_epsilon": 1e-05,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_layers": 32, "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 102400,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip


def test_a_published_exaone_config_is_read():
    arch = LlamaArchConfig.from_hf_config(EXAONE35_7B)
    assert (arch.architecture, arch.num_layers, arch.rms_norm_eps, arch.num_kv_heads) == (
        "exaone", 32, 1e-05, 8)  # fmt: skip
    assert arch.rope_scaling_dict["rope_type"] == "llama3"
    with pytest.raises(ValueError, match="activation_function 'gelu'"):
        LlamaArchConfig.from_hf_config({**EXAONE35_7B, "activation_function": "gelu"})


def test_a_folder_as_published_generates_as_transformers_save(tmp_path, tiny_model_factory):
    """The published folders say `ExaoneForCausalLM` and EXAONE's own key names
    (`num_layers`, `layer_norm_epsilon`) where transformers 5 writes Llama's."""
    folder = tiny_model_factory("exaone")
    published = tmp_path / "published"
    shutil.copytree(folder, published)
    config = json.loads((published / "config.json").read_text())
    config["architectures"] = ["ExaoneForCausalLM"]
    config["num_layers"] = config.pop("num_hidden_layers")
    config["layer_norm_epsilon"] = config.pop("rms_norm_eps")
    config["activation_function"] = config.pop("hidden_act")
    (published / "config.json").write_text(json.dumps(config))
    prompts = random_prompts(200, lengths=(3, 17, 40))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def tokens(path) -> list:
        llm = LLM(str(path), dtype="float32")
        assert llm.core.arch.architecture == "exaone"
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    assert tokens(published) == tokens(folder)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_an_exaone_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """As llama.cpp's converter writes it: Llama's tensor names, Q/K rows as they are (RoPE in
    halves), the llama3 scaling as `rope_freqs`."""
    folder = tiny_model_factory("exaone")
    llm = tiny_gguf_engine(folder, tmp_path / "exaone.gguf", qtype)
    assert (llm.core.arch.architecture, llm.core.arch.rope_freq_factors is not None) == (
        "exaone", True)  # fmt: skip
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
