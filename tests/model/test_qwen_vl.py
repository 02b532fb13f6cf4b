"""The language models of Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`, GGUF `qwen2vl`),
Qwen3-VL (`Qwen3VLForConditionalGeneration`, GGUF `qwen3vl`) and Qwen3-VL-MoE
(`Qwen3VLMoeForConditionalGeneration`, GGUF `qwen3vlmoe`: its experts stacked per layer, in
either of two layouts), served on text: their vision parts
are left out at load, and over text alone every position is the same in all three sections of
their multimodal RoPE, which is then the plain one. Tiny folders of each generate as
transformers' image-and-text model does on the same text; so do their GGUF files; and the
configs as published (Qwen2.5-VL's at the top level, Qwen3-VL's nested) are read."""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file

from inflight import LLM
from inflight.model.arch import LlamaArchConfig
from tests.gguf_files import write_tiny_gguf
from tests.parity import assert_greedy_as

QWEN25_VL_7B = {  # Qwen2.5-VL-7B-Instruct's config.json: the language model's fields on top
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False,
    "vocab_size": 152064, "bos_token_id": 151643, "eos_token_id": 151645,
    "image_token_id": 151655, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "hidden_size": 1280, "out_hidden_size": 3584},
}  # fmt: skip
QWEN3_VL_8B = {  # Qwen3-VL-8B-Instruct's: the language model's fields in `text_config`
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "tie_word_embeddings": False, "image_token_id": 151655,
    "text_config": {
        "model_type": "qwen3_vl_text", "hidden_size": 4096, "intermediate_size": 12288,
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
        "rope_theta": 5000000, "vocab_size": 151936, "bos_token_id": 151643,
        "eos_token_id": 151645,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                         "rope_type": "default"}},
    "vision_config": {"depth": 27, "deepstack_visual_indexes": [8, 16, 24]},
}  # fmt: skip
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "initializer_range": 0.2, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip


def test_published_configs_are_read():
    qwen25 = LlamaArchConfig.from_hf_config(QWEN25_VL_7B)
    assert (qwen25.architecture, qwen25.num_layers, qwen25.qkv_bias, qwen25.rope_theta,
            qwen25.rope_scaling, qwen25.eos_token_ids) == (
        "qwen2", 28, True, 1e6, None, (151645,))  # fmt: skip
    qwen3 = LlamaArchConfig.from_hf_config(QWEN3_VL_8B)
    assert (qwen3.architecture, qwen3.num_layers, qwen3.head_dim, qwen3.rope_theta,
            qwen3.rope_scaling) == ("qwen3", 36, 128, 5e6, None)  # fmt: skip
    qwen2 = LlamaArchConfig.from_hf_config(
        {
            **QWEN25_VL_7B,
            "model_type": "qwen2_vl",
            "architectures": ["Qwen2VLForConditionalGeneration"],
        }
    )
    assert (qwen2.architecture, qwen2.num_layers) == ("qwen2", 28)
    moe = {**QWEN3_VL_8B, "architectures": ["Qwen3VLMoeForConditionalGeneration"],
           "text_config": {**QWEN3_VL_8B["text_config"], "model_type": "qwen3_vl_moe_text",
                           "num_experts": 128, "num_experts_per_tok": 8,
                           "moe_intermediate_size": 768}}  # fmt: skip
    qwen3_moe = LlamaArchConfig.from_hf_config(moe)
    assert (qwen3_moe.architecture, qwen3_moe.num_experts, qwen3_moe.norm_topk_prob) == (
        "qwen3_moe", 128, True)  # fmt: skip


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"])
def vl_folder(request, tmp_path_factory, tokenizer_dir):
    """A tiny image-and-text Qwen VL saved by transformers, and the model itself."""
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
    )

    folder = tmp_path_factory.mktemp(request.param)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(folder)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": 64}  # fmt: skip
    torch.manual_seed(0)
    if request.param == "qwen2_5_vl":
        config = Qwen2_5_VLConfig(
            text_config={**TEXT, "vocab_size": len(tokenizer), "rope_parameters": rope},
            vision_config={**vision, "fullatt_block_indexes": [0]})  # fmt: skip
        model = Qwen2_5_VLForConditionalGeneration(config)
    else:  # (the MoE's experts 96 wide: neither stack's layout can be mistaken for the other)
        moe = request.param == "qwen3_vl_moe"
        text = {**TEXT, "vocab_size": len(tokenizer), "head_dim": 16,
                "rope_parameters": {**rope, "mrope_interleaved": True}}  # fmt: skip
        if moe:
            text |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 96}
        kind = (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration) if moe else (
            Qwen3VLConfig, Qwen3VLForConditionalGeneration)  # fmt: skip
        config = kind[0](text_config=text,
                         vision_config={**vision, "deepstack_visual_indexes": [0]})  # fmt: skip
        model = kind[1](config)
    model.eval().save_pretrained(folder)
    return folder, model, len(tokenizer)


def test_an_image_and_text_folder_generates_as_transformers_on_text(vl_folder):
    folder, reference, vocab = vl_folder
    llm = LLM(str(folder), dtype="float32")
    assert_greedy_as(llm, reference, vocab)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_its_gguf_generates_as_its_folder(vl_folder, tmp_path, qtype):
    """As llama.cpp's converters write them: the language model's tensors under Qwen2's and
    Qwen3's names, and their RoPE's sections, which the loader need not read. In F32 the
    folder's tokens; in Q8_0 the same over the blocks (16-bit x) as exact."""
    folder = vl_folder[0]
    path = write_tiny_gguf(folder, tmp_path / "vl.gguf", qtype)
    if qtype == GGMLQuantizationType.F32:
        want = LLM(str(folder), dtype="float32")
        assert_same_greedy(LLM(str(path), dtype="float32", quantized_activations="off"), want)
    else:
        exact = LLM(str(path), dtype="float32", quantized_activations="off")
        assert_same_greedy(LLM(str(path), dtype="float32", quantized_activations="int16"), exact)


def assert_same_greedy(llm, want) -> None:
    from inflight import SamplingParams
    from tests.parity import random_prompts

    prompts = random_prompts(llm.core.arch.vocab_size, lengths=(2, 9, 30, 64))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def tokens(engine) -> list:
        return [o.outputs[0].token_ids for o in engine.generate(prompts, params, use_tqdm=False)]

    assert tokens(llm) == tokens(want)


def test_moe_stacks_in_the_published_layout_load_alike(vl_folder, tmp_path):
    """Qwen3-VL-MoE's published checkpoints hold each layer's experts as [E, H, 2I] and
    [E, I, H], transformers saves [E, 2I, H] and [E, H, I]: both load, on one rank or split
    over two."""
    folder = vl_folder[0]
    if "moe" not in folder.name:
        pytest.skip("Qwen3-VL-MoE's stacks")
    published = tmp_path / "published"
    shutil.copytree(folder, published)
    weights = load_file(published / "model.safetensors")
    stacks = [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert stacks
    for name in stacks:
        weights[name] = weights[name].transpose(1, 2).contiguous()
    save_file(weights, published / "model.safetensors", metadata={"format": "pt"})
    assert_same_greedy(LLM(str(published), dtype="float32"), LLM(str(folder), dtype="float32"))
    split = LLM(str(published), dtype="float32", tensor_parallel_size=2)
    assert_same_greedy(split, LLM(str(folder), dtype="float32"))
