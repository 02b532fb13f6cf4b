"""How a family's layers are configured from each spelling of its config: Gemma 3's windowed and
global layers, their RoPE bases and score scale, from transformers 4 and 5 config.json files and
from the GGUF metadata llama.cpp writes or leaves out; what is not built is refused."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType

from inflight.errors import ModelLoadError
from inflight.model.arch import LlamaArchConfig
from inflight.model.gguf_header import read_gguf_header
from inflight.model.gguf_loader import gguf_arch_config
from tests.gguf_files import write_tiny_gguf

GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "sliding_window": 512,
    "query_pre_attn_scalar": 24,
}


def test_gemma3_from_a_transformers_4_config():
    """`rope_theta` and `rope_scaling` for the global layers, `rope_local_base_freq` for the
    windowed ones, every `sliding_window_pattern`-th layer global."""
    config = {**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 5e3,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0},
              "sliding_window_pattern": 6}  # fmt: skip
    arch = LlamaArchConfig.from_hf_config(config)
    assert arch.full_attention_layers == (5, 11)
    assert [arch.layer_window(i) for i in (0, 4, 5, 6, 11)] == [512, 512, None, 512, None]
    assert (arch.rope_theta, arch.local_rope_theta) == (1e6, 5e3)
    assert arch.rope_scaling_dict == {"rope_type": "linear", "factor": 8.0}
    assert arch.attention_scale == 24**-0.5


def test_gemma3_from_a_transformers_5_config():
    """`rope_parameters` per layer kind, `layer_types` listing each layer."""
    types = ["sliding_attention", "full_attention"] * 6
    config = {**GEMMA3, "layer_types": types, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 2e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }}  # fmt: skip
    arch = LlamaArchConfig.from_hf_config(config)
    assert arch.full_attention_layers == (1, 3, 5, 7, 9, 11)
    assert (arch.rope_theta, arch.local_rope_theta) == (2e6, 1e4)
    assert arch.rope_scaling_dict == {"rope_type": "linear", "factor": 4.0}


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"final_logit_softcapping": 0.0}, "final_logit_softcapping must be positive"),
        ({"attn_logit_softcapping": float("nan")}, "attn_logit_softcapping must be positive"),
        ({"hidden_activation": "silu"}, "hidden_activation"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"rope_parameters": {"full_attention": {"rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
         "sliding-window layers"),
    ],
)  # fmt: skip
def test_gemma3_variants_not_built_are_refused_with_the_reason(extra, why):
    with pytest.raises(ValueError, match=why):
        LlamaArchConfig.from_hf_config({**GEMMA3, **extra})


@pytest.mark.parametrize(
    ("fields", "full_layers", "local_theta"),
    [
        ({}, (5,), 1e4),  # what llama.cpp assumes: every sixth global, a base of 10k
        ({"pattern": [True, False, True, True, False, True]}, (1, 4), 1e4),
        ({"pattern": 3, "freq_base_swa": 5e4}, (2, 5), 5e4),
        ({"pattern": 0}, (), 1e4),  # every layer windowed
    ],
)
def test_gemma3_gguf_metadata_places_the_global_layers(
    tmp_path, tiny_model_factory, fields, full_layers, local_theta
):
    def metadata(writer):
        key = "gemma3.attention.sliding_window_pattern"
        pattern = fields.get("pattern")
        if isinstance(pattern, list):
            writer.add_array(key, pattern)
        elif pattern is not None:
            writer.add_uint32(key, pattern)
        if "freq_base_swa" in fields:
            writer.add_float32("gemma3.rope.freq_base_swa", fields["freq_base_swa"])

    path = write_tiny_gguf(tiny_model_factory("gemma3"), tmp_path / "tiny.gguf",
                           GGMLQuantizationType.F32, metadata=metadata)  # fmt: skip
    arch = gguf_arch_config(read_gguf_header(path), path)
    assert arch.full_attention_layers == full_layers
    assert arch.local_rope_theta == local_theta
    assert arch.query_pre_attn_scalar == arch.head_dim  # llama.cpp's, but on the 27B


def test_gemma_soft_caps_are_read_from_configs_and_gguf_files(tmp_path, tiny_model_factory):
    """Gemma 2's caps of scores and logits (Gemma 3 configs carry them too, as null), from
    config.json and from the GGUF fields llama.cpp writes; its every other layer global."""
    arch = LlamaArchConfig.from_hf_config(
        {**GEMMA3, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
    )
    assert (arch.attn_logit_softcapping, arch.final_logit_softcapping) == (50.0, 30.0)
    assert LlamaArchConfig.from_hf_config(GEMMA3).final_logit_softcapping is None
    path = write_tiny_gguf(tiny_model_factory("gemma2"), tmp_path / "tiny.gguf",
                           GGMLQuantizationType.F32)  # fmt: skip
    arch = gguf_arch_config(read_gguf_header(path), path)
    assert (arch.architecture, arch.attn_logit_softcapping, arch.final_logit_softcapping) == (
        "gemma2", 2.0, 3.0
    )  # fmt: skip
    assert (arch.full_attention_layers, arch.local_rope_theta) == ((1, 3), None)
    assert arch.query_pre_attn_scalar == arch.head_dim  # llama.cpp's, but on the 27B


def test_gguf_experts_are_read_where_llama_cpp_defines_them_and_refused_elsewhere(
    tmp_path, tiny_model_factory
):
    """A qwen3moe file says its experts' count and width; a layer without a router is dense;
    a family llama.cpp gives no experts (here phi3) with an expert count is refused, as is a
    qwen3moe file without one."""
    path = write_tiny_gguf(tiny_model_factory("qwen3_moe"), tmp_path / "moe.gguf",
                           GGMLQuantizationType.F32)  # fmt: skip
    arch = gguf_arch_config(read_gguf_header(path), path)
    assert (arch.architecture, arch.num_experts, arch.experts_per_token) == ("qwen3_moe", 4, 2)
    assert (arch.expert_intermediate_size, arch.intermediate_size) == (32, 128)
    assert arch.dense_layers == (1,) and arch.norm_topk_prob  # the tiny one's mlp_only_layers

    def experts(writer):
        writer.add_uint32("phi3.expert_count", 4)

    path = write_tiny_gguf(tiny_model_factory("phi3"), tmp_path / "phi3.gguf",
                           GGMLQuantizationType.F32, metadata=experts)  # fmt: skip
    with pytest.raises(ModelLoadError, match="a phi3 file with experts is not supported"):
        gguf_arch_config(read_gguf_header(path), path)
    path = write_tiny_gguf(tiny_model_factory("qwen3"), tmp_path / "qwen3.gguf",
                           GGMLQuantizationType.F32)  # fmt: skip
    header = read_gguf_header(path)
    header.fields["general.architecture"] = "qwen3moe"
    header.fields.update({k.replace("qwen3.", "qwen3moe."): v for k, v in header.fields.items()})
    with pytest.raises(ModelLoadError, match=r"lacks qwen3moe\.expert_count"):
        gguf_arch_config(header, path)


def test_a_published_gemma3_image_and_text_config_is_read_for_its_language_model():
    """Gemma 3 4B's config.json names only what differs from transformers' defaults; its token
    ids and tying are in the outer config."""
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "eos_token_id": [1, 106],
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                        "model_type": "gemma3_text", "num_hidden_layers": 34,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152},
    }  # fmt: skip
    arch = LlamaArchConfig.from_hf_config(config)
    assert (arch.architecture, arch.num_layers, arch.hidden_size) == ("gemma3", 34, 2560)
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim) == (8, 4, 256)  # the defaults
    assert arch.full_attention_layers == (5, 11, 17, 23, 29)
    assert arch.rope_scaling_dict == {"rope_type": "linear", "factor": 8.0}
    assert (arch.rope_theta, arch.local_rope_theta, arch.query_pre_attn_scalar) == (1e6, 1e4, 256)
    assert arch.eos_token_ids == (1, 106) and arch.tie_word_embeddings


def test_a_gemma3_image_and_text_folder_generates_as_transformers(tmp_path, tokenizer_dir):
    """Its language model's weights (`language_model.model.*`) run; the vision tower and the
    projector are left out; text-only prompts give transformers' tokens."""
    import torch
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    from inflight import LLM
    from tests.parity import assert_greedy_as

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(tmp_path)
    vocab = len(tokenizer)
    text = Gemma3TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, query_pre_attn_scalar=24, sliding_window=24,
                            max_position_embeddings=512, initializer_range=0.2)  # fmt: skip
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=4, image_token_index=vocab - 1,
                          boi_token_index=vocab - 3, eoi_token_index=vocab - 2)  # fmt: skip
    torch.manual_seed(0)
    reference = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms of w != 0, so that the 1 + w offset matters
        for name, param in reference.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)
    reference.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32")
    assert llm.core.arch.architecture == "gemma3"
    assert_greedy_as(llm, reference, vocab - 4, lengths=(3, 17, 40), max_tokens=8)


def test_qwen3_moe_experts_from_either_spelling_and_bad_routing_refused():
    config = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
              "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": True}  # fmt: skip
    arch = LlamaArchConfig.from_hf_config(config)
    assert (arch.architecture, arch.num_experts, arch.experts_per_token) == ("qwen3_moe", 8, 2)
    assert arch.dense_layers == (0, 2, 3, 4)  # every second layer routes, but layer 3
    assert arch.expert_intermediate_size == 32 and arch.norm_topk_prob
    renamed = {**config, "num_local_experts": 8}  # how transformers 5 writes it
    del renamed["num_experts"]
    assert LlamaArchConfig.from_hf_config(renamed) == arch
    with pytest.raises(ValueError, match=r"num_experts_per_tok 9 must be in 1\.\.num_experts"):
        LlamaArchConfig.from_hf_config({**config, "num_experts_per_tok": 9})


def test_mixtral_routes_every_layer_through_experts_of_its_intermediate_size():
    arch = LlamaArchConfig.from_hf_config({
        "architectures": ["MixtralForCausalLM"], "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 4096,
    })  # fmt: skip
    assert (arch.architecture, arch.num_experts, arch.expert_intermediate_size) == (
        "mixtral", 8, 48)  # fmt: skip
    assert arch.dense_layers == () and arch.norm_topk_prob and arch.sliding_window == 4096


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"num_hidden_layers": 2**64}, "layers"),
        ({"hidden_size": 2**63}, "hidden_size must be a positive integer below 2"),
        ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer"),
        ({"sliding_window": -5}, "sliding_window must be positive"),
        ({"sliding_window_pattern": 0}, "sliding_window_pattern 0"),
        ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be positive"),
        ({"query_pre_attn_scalar": float("nan")}, "query_pre_attn_scalar must be positive"),
    ],
)
def test_shapes_no_model_has_are_refused_not_built(extra, why):
    """A hostile config must not hang building 2**64 layers or divide by zero."""
    with pytest.raises(ValueError, match=why):
        LlamaArchConfig.from_hf_config({**GEMMA3, **extra})


def test_a_moe_config_of_2_to_the_64_layers_is_refused():
    config = {"architectures": ["MixtralForCausalLM"], "vocab_size": 100, "hidden_size": 64,
              "intermediate_size": 48, "num_hidden_layers": 2**64, "num_attention_heads": 4,
              "num_local_experts": 8, "num_experts_per_tok": 2}  # fmt: skip
    with pytest.raises(ValueError, match="layers: more than"):
        LlamaArchConfig.from_hf_config(config)


PHI3 = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 512}  # fmt: skip
FACTORS = [1.0] * 8


def _longrope(**rope):
    return {**PHI3, "rope_scaling": {"type": "longrope", "short_factor": FACTORS,
                                     "long_factor": FACTORS, **rope}}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({**PHI3, "partial_rotary_factor": float("inf")}, "partial_rotary_factor inf"),
        ({**PHI3, "partial_rotary_factor": float("nan")}, "partial_rotary_factor nan"),
        ({**PHI3, "partial_rotary_factor": 0.0}, "partial_rotary_factor 0.0"),  # not "all"
        (_longrope(original_max_position_embeddings=1), "more than one position"),  # ln(1): /0
        (_longrope(original_max_position_embeddings=2**64), "more than one position"),
        (_longrope(original_max_position_embeddings=64, attention_factor=float("nan")),
         "attention factor must be positive"),
        (_longrope(original_max_position_embeddings=64, short_factor=[1.0] * 7), "factors"),
        ({**PHI3, "architectures": ["MixtralForCausalLM"], "num_local_experts": 2**40,
          "num_experts_per_tok": 2}, "experts a layer"),  # would build 2**40 experts
        ({**PHI3, "architectures": ["GraniteForCausalLM"], "logits_scaling": float("inf")},
         "logits_scaling must be positive"),
        ({**PHI3, "architectures": ["Gemma2ForCausalLM"], "attn_logit_softcapping": -1.0},
         "attn_logit_softcapping must be positive"),
        # (PHI3 names no head_dim: hidden_size / heads)
        ({**PHI3, "num_attention_heads": 0}, "num_attention_heads must be a positive integer"),
        ({**PHI3, "head_dim": float("inf")}, "head_dim must be a positive integer"),
        ({**PHI3, "head_dim": 2**64}, "head_dim must be a positive integer"),
        ({**PHI3, "hidden_size": True}, "hidden_size must be a positive integer"),
        ({"architectures": ["Mistral3ForConditionalGeneration"], "text_config": [1]},
         "text_config must be an object"),
        ({**PHI3, "architectures": ["Qwen2_5_VLForConditionalGeneration"], "vocab_size": "x"},
         "language model config"),  # (transformers' own check of it)
    ],
)  # fmt: skip
def test_hostile_rope_expert_and_multiplier_fields_are_refused(config, why):
    """Infinities, NaN, zero and 2**64 in the newer fields are ValueErrors (a ModelLoadError
    naming the file at load), never an OverflowError, a division by zero or a hang."""
    with pytest.raises(ValueError, match=why):
        LlamaArchConfig.from_hf_config(config)


def test_a_gguf_field_no_integer_holds_is_a_load_error(tmp_path, tiny_model_factory):
    """A count written as the float infinity reaches int(): an OverflowError there is reported
    as a ModelLoadError naming the file, like any refused field."""
    from inflight.errors import ModelLoadError
    from inflight.model.gguf_loader import read_gguf_index

    def experts(writer):
        writer.add_float32("qwen3.expert_count", float("inf"))

    path = write_tiny_gguf(tiny_model_factory("qwen3"), tmp_path / "inf.gguf",
                           GGMLQuantizationType.F32, metadata=experts)  # fmt: skip
    with pytest.raises(ModelLoadError, match=r"inf\.gguf"):
        read_gguf_index(path)


@pytest.mark.parametrize(("arch", "quantization"), [
    ("LlamaForCausalLM", {"quant_method": "awq", "bits": 4}),
    ("LlamaForCausalLM", {"quant_method": "mxfp4"}),  # gpt-oss's only
    ("GptOssForCausalLM", {"quant_method": "fp8"}),
    ("GptOssForCausalLM", "mxfp4"),
])  # fmt: skip
def test_quantized_checkpoints_other_than_gpt_oss_mxfp4_are_refused_naming_the_method(
    arch, quantization
):
    from tests.model.test_gpt_oss import GPT_OSS_20B

    config = {**GPT_OSS_20B, "architectures": [arch], "quantization_config": quantization}
    with pytest.raises(ValueError, match=r"quantization .* is not supported: quantized weights"):
        LlamaArchConfig.from_hf_config(config)
    ok = {**GPT_OSS_20B, "quantization_config": {"quant_method": "mxfp4"}}
    assert LlamaArchConfig.from_hf_config(ok).architecture == "gpt_oss"


GEMMA_7B = {  # gemma-7b's config.json: `hidden_act` gelu, `hidden_activation` unset
    "architectures": ["GemmaForCausalLM"], "hidden_act": "gelu", "hidden_activation": None,
    "hidden_size": 3072, "head_dim": 256, "intermediate_size": 24576, "num_attention_heads": 16,
    "num_key_value_heads": 16, "num_hidden_layers": 28, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "vocab_size": 256000,
}  # fmt: skip


def test_gemma_takes_tanh_gelu_and_a_tied_head_where_its_config_names_neither():
    """As transformers does (its `hidden_act` "gelu" is not what the layers compute); another
    `hidden_activation` is refused."""
    arch = LlamaArchConfig.from_hf_config(GEMMA_7B)
    # (tied, as transformers' Gemma configs are where they do not say)
    assert (arch.architecture, arch.head_dim, arch.tie_word_embeddings) == ("gemma", 256, True)
    with pytest.raises(ValueError, match="unsupported hidden_activation 'relu'"):
        LlamaArchConfig.from_hf_config({**GEMMA_7B, "hidden_activation": "relu"})
