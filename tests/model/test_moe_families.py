"""Qwen2-MoE (`Qwen2MoeForCausalLM`, GGUF `qwen2moe`), GLM-4.5 (`Glm4MoeForCausalLM`, GGUF
`glm4moe`), ERNIE 4.5 (`Ernie4_5_MoeForCausalLM`, GGUF `ernie4_5-moe`) and MiniMax-M2
(`MiniMaxM2ForCausalLM`, GGUF `minimax-m2`): experts beside a shared expert that every token runs
through (Qwen2-MoE's under a sigmoid gate), and routers that choose by their scores plus a
learned bias (GLM-4.5's and MiniMax-M2's sigmoid, ERNIE 4.5's softmax; GLM-4.5's within the
best groups of experts) and keep their weights in float32. Their tiny models in `TINY_ARCHS`
are held to transformers' greedy tokens in every setting; here, the configs as published, the
GGUF files against transformers with the files' weights, the multi-token-prediction weights
left out of loading, and routings no router can follow refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file

from inflight import LLM, SamplingParams
from inflight.kernels import load_extension
from inflight.model.arch import LlamaArchConfig
from inflight.model.packed_linear import PackedLinear, blocks_serve_every_batch
from tests.gguf_files import tiny_gguf_engine, write_tiny_gguf
from tests.parity import assert_gguf_generates_as_its_weights, random_prompts

Q = GGMLQuantizationType

GLM45_AIR = {  # GLM-4.5-Air's config.json, the fields the engine reads
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "head_dim": 128,
    "hidden_size": 4096, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96,
    "num_experts_per_tok": 8, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000, "routed_scaling_factor": 1.0, "tie_word_embeddings": False,
    "topk_group": 1, "first_k_dense_replace": 1, "use_qk_norm": False, "vocab_size": 151552,
}  # fmt: skip
QWEN15_MOE = {  # Qwen1.5-MoE-A2.7B's
    "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "moe_intermediate_size": 1408, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
    "use_sliding_window": False, "tie_word_embeddings": False, "vocab_size": 151936,
    "decoder_sparse_step": 1,
}  # fmt: skip


ERNIE45_21B = {  # ERNIE-4.5-21B-A3B-PT's
    "architectures": ["Ernie4_5_MoeForCausalLM"], "hidden_size": 2560, "head_dim": 128,
    "intermediate_size": 12288, "max_position_embeddings": 131072, "moe_intermediate_size": 1536,
    "moe_k": 6, "moe_layer_interval": 1, "moe_layer_start_index": 1, "moe_layer_end_index": 27,
    "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_norm_min": 1e-12,
    "num_attention_heads": 20, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-05, "rope_theta": 500000, "tie_word_embeddings": True,
    "use_bias": False, "vocab_size": 103424,
}  # fmt: skip


MINIMAX_M2 = {  # MiniMax-M2's (its RoPE's width as the legacy `rotary_dim`)
    "architectures": ["MiniMaxM2ForCausalLM"], "head_dim": 128, "hidden_size": 3072,
    "intermediate_size": 1536, "max_position_embeddings": 196608, "num_attention_heads": 48,
    "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8,
    "num_local_experts": 256, "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06,
    "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "use_qk_norm": True, "use_routing_bias": True,
    "vocab_size": 200064,
}  # fmt: skip


DOTS_LLM1 = {  # dots.llm1.inst's
    "architectures": ["Dots1ForCausalLM"], "hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "n_routed_experts": 128, "n_shared_experts": 2,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "num_attention_heads": 32,
    "num_key_value_heads": 32, "num_hidden_layers": 62, "head_dim": 128,
    "rope_theta": 10000000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "sliding_window": 4096, "max_window_layers": 62, "use_sliding_window": False,
    "vocab_size": 152064, "tie_word_embeddings": False,
}  # fmt: skip


HUNYUAN_A13B = {  # Hunyuan-A13B-Instruct's (per-layer lists of one value)
    "architectures": ["HunYuanMoEV1ForCausalLM"], "hidden_size": 4096, "intermediate_size": 3072,
    "moe_intermediate_size": [3072] * 32, "moe_topk": [8] * 32, "num_experts": 64,
    "num_shared_expert": [1] * 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "head_dim": 128, "rope_theta": 10000.0,
    "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
    "max_position_embeddings": 32768, "vocab_size": 128167, "tie_word_embeddings": True,
    "rms_norm_eps": 1e-05, "use_qk_norm": True, "use_mixed_mlp_moe": True,
}  # fmt: skip


OLMOE = {  # OLMoE-1B-7B-0924's
    "architectures": ["OlmoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 1024,
    "num_experts": 64, "num_experts_per_tok": 8, "num_attention_heads": 16,
    "num_key_value_heads": 16, "num_hidden_layers": 16, "norm_topk_prob": False,
    "clip_qkv": None, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "vocab_size": 50304, "tie_word_embeddings": False,
}  # fmt: skip
GRANITE_MOE = {  # shaped as Granite 3.1 3B-A800M's
    "architectures": ["GraniteMoeForCausalLM"], "hidden_size": 1536, "intermediate_size": 512,
    "num_local_experts": 40, "num_experts_per_tok": 8, "num_attention_heads": 24,
    "num_key_value_heads": 8, "num_hidden_layers": 32, "attention_multiplier": 0.015625,
    "embedding_multiplier": 12.0, "logits_scaling": 6.0, "residual_multiplier": 0.22,
    "rope_theta": 10000000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
    "vocab_size": 49155, "tie_word_embeddings": True,
}  # fmt: skip


def test_published_configs_are_read():
    glm = LlamaArchConfig.from_hf_config(GLM45_AIR)
    assert (glm.architecture, glm.num_experts, glm.experts_per_token, glm.dense_layers) == (
        "glm4_moe", 128, 8, (0,))  # fmt: skip
    assert (glm.router_scoring, glm.norm_topk_prob, glm.shared_expert_intermediate_size,
            glm.shared_expert_gate) == ("sigmoid", True, 1408, False)  # fmt: skip
    assert (glm.rotary_dim, glm.qkv_bias, glm.qk_norm, glm.extra_checkpoint_layers) == (
        64, True, False, 1)  # fmt: skip
    ernie = LlamaArchConfig.from_hf_config(ERNIE45_21B)
    assert (ernie.architecture, ernie.num_experts, ernie.experts_per_token, ernie.dense_layers,
            ernie.router_scoring, ernie.router_score_bias, ernie.norm_topk_prob,
            ernie.shared_expert_intermediate_size) == (
        "ernie4_5_moe", 64, 6, (0,), "softmax", True, True, 3072)  # fmt: skip
    with pytest.raises(ValueError, match="integers"):  # (the vision-language models' lists)
        LlamaArchConfig.from_hf_config({**ERNIE45_21B, "moe_num_experts": [64, 64]})
    minimax = LlamaArchConfig.from_hf_config(MINIMAX_M2)
    assert (minimax.architecture, minimax.num_experts, minimax.experts_per_token,
            minimax.expert_intermediate_size, minimax.dense_layers, minimax.router_scoring,
            minimax.norm_topk_prob, minimax.rotary_dim, minimax.qk_norms_span_heads) == (
        "minimax_m2", 256, 8, 1536, (), "sigmoid", True, 64, True)  # fmt: skip
    for other in ({"scoring_func": "softmax"}, {"use_routing_bias": False},
                  {"qk_norm_type": "per_head"}):  # fmt: skip
        with pytest.raises(ValueError, match="published router"):
            LlamaArchConfig.from_hf_config({**MINIMAX_M2, **other})
    dots = LlamaArchConfig.from_hf_config(DOTS_LLM1)
    assert (dots.architecture, dots.num_experts, dots.dense_layers, dots.router_scoring,
            dots.routed_scaling_factor, dots.shared_expert_intermediate_size, dots.qk_norm,
            dots.sliding_window) == (
        "dots1", 128, (0,), "sigmoid", 2.5, 2816, True, None)  # fmt: skip
    # (its window applies from `max_window_layers` on, as transformers reads the config)
    windowed = LlamaArchConfig.from_hf_config({**DOTS_LLM1, "max_window_layers": 60})
    assert windowed.layer_windows[59:] == [None, 4096, 4096]
    hunyuan = LlamaArchConfig.from_hf_config(HUNYUAN_A13B)
    assert (hunyuan.architecture, hunyuan.num_experts, hunyuan.experts_per_token,
            hunyuan.expert_intermediate_size, hunyuan.shared_expert_intermediate_size,
            hunyuan.norm_topk_prob, round(hunyuan.rope_theta)) == (
        "hunyuan_moe", 64, 8, 3072, 3072, True, 11158840)  # fmt: skip
    with pytest.raises(ValueError, match="one value for every layer"):
        LlamaArchConfig.from_hf_config({**HUNYUAN_A13B, "moe_topk": [8] * 31 + [4]})
    olmoe = LlamaArchConfig.from_hf_config(OLMOE)
    assert (olmoe.architecture, olmoe.num_experts, olmoe.norm_topk_prob,
            olmoe.qk_norms_span_heads) == ("olmoe", 64, False, True)  # fmt: skip
    with pytest.raises(ValueError, match="clip_qkv"):
        LlamaArchConfig.from_hf_config({**OLMOE, "clip_qkv": 8.0})
    granite = LlamaArchConfig.from_hf_config(GRANITE_MOE)
    assert (granite.architecture, granite.num_experts, granite.expert_intermediate_size,
            granite.norm_topk_prob, granite.shared_expert_intermediate_size,
            granite.embedding_multiplier, granite.logits_scaling) == (
        "granitemoe", 40, 512, True, 0, 12.0, 6.0)  # fmt: skip
    shared = LlamaArchConfig.from_hf_config(
        {
            **GRANITE_MOE,
            "shared_intermediate_size": 1024,
            "architectures": ["GraniteMoeSharedForCausalLM"],
        }
    )
    assert shared.shared_expert_intermediate_size == 1024
    qwen = LlamaArchConfig.from_hf_config(QWEN15_MOE)
    assert (qwen.architecture, qwen.num_experts, qwen.experts_per_token, qwen.dense_layers) == (
        "qwen2_moe", 60, 4, ())  # fmt: skip
    assert (qwen.router_scoring, qwen.norm_topk_prob, qwen.shared_expert_intermediate_size,
            qwen.shared_expert_gate, qwen.qkv_bias, qwen.sliding_window) == (
        "softmax", False, 5632, True, True, None)  # fmt: skip


@pytest.mark.parametrize(("fields", "says"), [
    ({"n_group": 3}, "groups must divide the experts"),
    ({"n_group": 4, "topk_group": 5}, "groups must divide the experts"),
    ({"n_group": 64, "topk_group": 1}, "8 experts a token from 1 groups of 2"),
    ({"routed_scaling_factor": float("nan")}, "routed_scaling_factor must be positive"),
    ({"routed_scaling_factor": -2.5}, "routed_scaling_factor must be positive"),
    ({"num_nextn_predict_layers": 2**63}, "extra checkpoint layers"),
    ({"first_k_dense_replace": "1"}, "integers"),
])  # fmt: skip
def test_routings_no_router_follows_are_refused(fields, says):
    with pytest.raises(ValueError, match=says):
        LlamaArchConfig.from_hf_config({**GLM45_AIR, **fields})


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize(
    "family",
    [
        "qwen2_moe",
        "glm4_moe",
        "ernie4_5_moe",
        "minimax_m2",
        "dots1",
        "hunyuan_moe",
        "olmoe",
        "granitemoe",
    ],
)
def test_a_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, family, qtype
):
    """As llama.cpp's converters write them: the shared expert as `ffn_*_shexp` (Qwen2-MoE's
    gate as the vector `ffn_gate_inp_shexp`), GLM-4.5's score bias as `exp_probs_b`, its routing
    in `expert_*` keys, its dense first layer by `leading_dense_block_count`, and its pre-MLP
    norm as `post_attention_norm`. In Q8_0 with 16-bit activations every expert, the shared
    one included, multiplies from its blocks."""
    folder = tiny_model_factory(family)
    llm = tiny_gguf_engine(folder, tmp_path / f"{family}.gguf", qtype)
    arch = llm.core.arch
    expected = {"qwen2_moe": ("softmax", False, 64, True, (), 1.0, 1),
                "glm4_moe": ("sigmoid", True, 32, False, (0,), 2.5, 2),
                "ernie4_5_moe": ("softmax", True, 32, False, (0,), 1.0, 1),
                "minimax_m2": ("sigmoid", True, 0, False, (), 1.0, 1),
                "dots1": ("sigmoid", True, 32, False, (0,), 2.5, 2),
                "hunyuan_moe": ("softmax", False, 32, False, (), 1.0, 1),
                "olmoe": ("softmax", False, 0, False, (), 1.0, 1),
                "granitemoe": ("softmax", False, 64, False, (), 1.0, 1)}[family]  # fmt: skip
    assert (arch.router_scoring, arch.router_score_bias, arch.shared_expert_intermediate_size,
            arch.shared_expert_gate, arch.dense_layers, arch.routed_scaling_factor,
            arch.expert_groups) == expected  # fmt: skip
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
    if (
        qtype != Q.F32
        and arch.shared_expert_intermediate_size
        and blocks_serve_every_batch(torch.float32, 16)
    ):
        sparse = [layer for layer in llm.core.loaded.model.layers if layer.sparse]
        shared = [m for layer in sparse for m in layer.shared_expert.modules()
                  if isinstance(m, PackedLinear)]  # fmt: skip
        assert len(shared) == 2 * (2 - len(arch.dense_layers))
        assert all(m.blocks_only for m in shared)


@pytest.mark.skipif(not blocks_serve_every_batch(torch.bfloat16, 16),
                    reason="no 16-column layout (AVX-512 VNNI with bf16)")  # fmt: skip
def test_a_bf16_engine_takes_a_q8_0_moe_files_experts_from_their_blocks(
    tmp_path, tiny_model_factory
):
    """A bf16 engine over a MoE file of legacy blocks: every expert, the shared one included,
    multiplies from its blocks with no bf16 copy, one by one (the one-call C++ experts read the
    8-column layout), and each request's greedy tokens are the same alone as in a batch."""
    path = write_tiny_gguf(tiny_model_factory("qwen2_moe"), tmp_path / "moe.gguf", Q.Q8_0)
    llm = LLM(str(path), dtype="bfloat16", device="cpu", enable_prefix_caching=False)
    sparse = [layer for layer in llm.core.loaded.model.layers if layer.sparse]
    assert sparse
    for layer in sparse:
        experts = [m for e in [*layer.experts, layer.shared_expert] for m in e.modules()
                   if isinstance(m, PackedLinear)]  # fmt: skip
        assert len(experts) == 2 * (len(layer.experts) + 1)
        assert all(m.blocks_only and m.weight.is_meta for m in experts)
        assert {m.small_kernel for m in experts} == {"gguf-int16"}
        assert layer.expert_packings is None  # the Python loop over the experts
    prompts = random_prompts(llm.core.arch.vocab_size, lengths=(3, 17, 40, 9))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert together == alone


def _with_mtp_weights(folder, out, family):
    """A copy of the tiny model with the multi-token-prediction weights its published
    checkpoints hold: GLM-4.5's layer after the last (the last layer's weights again, and the
    layer's own), ERNIE 4.5's `model.mtp_*`."""
    shutil.copytree(folder, out)
    weights = load_file(out / "model.safetensors")
    last = json.loads((out / "config.json").read_text())["num_hidden_layers"] - 1
    hidden = weights["model.norm.weight"].shape[0]
    if family == "glm4_moe":
        extra = {name.replace(f"layers.{last}.", f"layers.{last + 1}."): t.clone()
                 for name, t in weights.items() if f"layers.{last}." in name}  # fmt: skip
        mtp = f"model.layers.{last + 1}"
        extra |= {f"{mtp}.eh_proj.weight": torch.randn(hidden, 2 * hidden),
                  f"{mtp}.enorm.weight": torch.ones(hidden),
                  f"{mtp}.hnorm.weight": torch.ones(hidden)}  # fmt: skip
    else:
        extra = {name.replace(f"model.layers.{last}.", "model.mtp_block.0."): t.clone()
                 for name, t in weights.items() if f"layers.{last}." in name}  # fmt: skip
        extra |= {"model.mtp_emb_norm.0.weight": torch.ones(hidden),
                  "model.mtp_hidden_norm.0.weight": torch.ones(hidden),
                  "model.mtp_linear_proj.0.weight": torch.randn(hidden, 2 * hidden)}  # fmt: skip
    save_file({**weights, **extra}, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("family", ["glm4_moe", "ernie4_5_moe"])
def test_the_multi_token_prediction_weights_are_left_out(tmp_path, tiny_model_factory, family):
    """GLM-4.5's checkpoints (and llama.cpp's files of them, in `block_count`) hold a
    multi-token-prediction layer after the last, ERNIE 4.5's `mtp_*` weights: loading leaves
    them out of the HF folder (and the GGUF file), which generate as the model without them."""
    folder = tiny_model_factory(family)
    with_mtp = _with_mtp_weights(folder, tmp_path / "with-mtp", family)
    prompts = random_prompts(200, lengths=(3, 17))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def tokens(path) -> list:
        llm = LLM(str(path), dtype="float32", quantized_activations="off")
        assert llm.core.arch.num_layers == 2
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    expected = tokens(folder)
    assert tokens(with_mtp) == expected
    if family == "glm4_moe":  # (llama.cpp's ERNIE 4.5 converter leaves them out)
        gguf = write_tiny_gguf(with_mtp, tmp_path / "mtp.gguf", Q.F32)
        assert LLM(str(gguf), dtype="float32").core.arch.extra_checkpoint_layers == 1
        assert tokens(gguf) == expected


def test_a_sigmoid_router_stays_float32_in_a_bf16_model(tiny_model_factory):
    """Its biased scores choose among experts by small margins: its weights and bias load in
    float32, as transformers and vLLM keep them, while the rest of the model is bf16."""
    llm = LLM(str(tiny_model_factory("glm4_moe")), dtype="bfloat16")
    sparse = llm.core.loaded.model.layers[1]
    assert sparse.router_weight.dtype == sparse.router_bias.dtype == torch.float32
    assert llm.core.loaded.model.norm.weight.dtype == torch.bfloat16
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("family", ["qwen3_5_moe", "qwen3_next"])
def test_a_deltanet_moe_layer_keeps_both_kinds_of_float32_parameters(tiny_model_factory, family):
    """A layer that is an MoE layer and a DeltaNet one keeps both classes' float32 parameters
    in a bf16 model: the decay rates and dt bias the C++ DeltaNet layer takes as float32 (an MoE
    class's list alone hid them, and a bf16 Qwen3.5-MoE refused its first step)."""
    llm = LLM(str(tiny_model_factory(family)), dtype="bfloat16")
    delta = next(layer for layer in llm.core.loaded.model.layers if layer.is_conv)
    assert delta.decay_rate.dtype == delta.dt_bias.dtype == torch.float32
    assert delta.out_proj.weight.dtype == torch.bfloat16
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("family", ["qwen2_moe", "glm4_moe", "granitemoe", "gpt_oss"])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_block_experts_in_one_call_give_the_python_loops_bits(
    tmp_path, tiny_model_factory, family, tokens
):
    """Where every expert multiplies from its blocks with the integer kernel, one C++ call
    (`gguf_int_experts`) routes a layer's experts: it gives what the Python loop gives, bit for
    bit, for decode-sized and prompt-sized steps (gpt-oss's biased experts and clamped SwiGLU
    too)."""
    if not blocks_serve_every_batch(torch.float32, 16):
        pytest.skip("16-bit activations over blocks do not take every batch here")
    llm = tiny_gguf_engine(tiny_model_factory(family), tmp_path / f"{family}.gguf", Q.Q8_0)
    layer = next(layer for layer in llm.core.loaded.model.layers if layer.sparse)
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, llm.core.arch.hidden_size, generator=gen)
    weights, chosen = (layer.route_in_float32(x) if layer.float32_router
                       else layer.route_tokens(layer.gate(x)))  # fmt: skip
    fast = layer._host_routed_experts(x, weights, chosen)
    assert layer.block_experts, "the layer's experts should all multiply from their blocks"
    layer.block_experts = False  # the Python loop
    assert torch.equal(layer._host_routed_experts(x, weights, chosen), fast)


def torch_routing(x, router, bias, top_k, scoring, eps, scale):
    """`MoEDecoderLayer.route_in_float32`'s ops without groups (and `GptOssDecoderLayer`'s
    `route_tokens` for "softmax_of_chosen"): the reference for the C++ router."""
    logits = x @ router.t()
    if scoring == "softmax_of_chosen":
        choice = logits if bias is None else logits + bias
        best, chosen = torch.topk(choice, top_k, dim=-1)
        return torch.softmax(best, dim=-1) * scale, chosen, choice
    sigmoid = scoring == "sigmoid"
    scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
    choice = scores if bias is None else scores + bias
    chosen = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, chosen)
    return weights / (weights.sum(dim=-1, keepdim=True) + eps) * scale, chosen, choice


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax", "softmax_of_chosen"])
@pytest.mark.parametrize("biased", [True, False])
def test_the_cpp_router_chooses_as_pytorch_and_alike_in_any_batch(scoring, biased):
    """`route_experts` (LFM2-MoE's, MiniMax-M2's, a float32 model's softmax gates and gpt-oss's
    softmax of the chosen biased logits, in both layer loops): the experts PyTorch's ops choose,
    best first, with their weights to float32 rounding; a token's choice and weights the same
    bits alone as in its batch (its own row, in a fixed order)."""
    ext = load_extension()
    gen = torch.Generator().manual_seed(len(scoring) + 2 * int(biased))
    x, router = torch.randn(300, 96, generator=gen), torch.randn(24, 96, generator=gen) * 0.1
    bias = torch.randn(24, generator=gen) * 0.1 if biased else None
    weights, chosen = ext.route_experts(x, router, bias, 4, scoring, True, 1e-6, 2.5)
    want_weights, want_chosen, choice = torch_routing(x, router, bias, 4, scoring, 1e-6, 2.5)
    # tokens whose fourth and fifth choices part by more than float32 rounding of the scores
    ranked = choice.sort(dim=-1, descending=True).values
    clear = (ranked[:, 3] - ranked[:, 4]) > 1e-5
    assert clear.float().mean() > 0.9
    assert torch.equal(chosen[clear], want_chosen[clear])
    torch.testing.assert_close(weights[clear], want_weights[clear], rtol=1e-5, atol=1e-6)
    for t in (0, 1, 157, 299):
        alone = ext.route_experts(x[t : t + 1], router, bias, 4, scoring, True, 1e-6, 2.5)
        assert torch.equal(alone[0][0], weights[t]) and torch.equal(alone[1][0], chosen[t])


def test_router_logits_and_router_sigmoids_are_pytorchs_alike_in_any_batch():
    """`router_logits` (a router's x @ W.T in float32) and `router_sigmoids` (a sigmoid
    router's scores, a shared expert's gate of one row): PyTorch's values to float32 rounding,
    a row's bits the same alone as in any batch; shapes and dtypes checked."""
    ext = load_extension()
    gen = torch.Generator().manual_seed(3)
    x, router = torch.randn(300, 96, generator=gen), torch.randn(24, 96, generator=gen) * 0.1
    gate = torch.randn(1, 96, generator=gen) * 0.1
    logits, gates = ext.router_logits(x, router), ext.router_sigmoids(x, gate)
    scores = ext.router_sigmoids(x, router)
    torch.testing.assert_close(scores, torch.sigmoid(x @ router.t()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, x @ router.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gates, torch.sigmoid(x @ gate.t()), rtol=1e-5, atol=1e-6)
    for t in (0, 1, 157, 299):
        row = x[t : t + 1]
        assert torch.equal(ext.router_logits(row, router)[0], logits[t])
        assert torch.equal(ext.router_sigmoids(row, gate)[0], gates[t])
        assert torch.equal(ext.router_sigmoids(row, router)[0], scores[t])
    with pytest.raises(RuntimeError, match="router"):
        ext.router_logits(x, torch.randn(4, 95))
    with pytest.raises(RuntimeError, match="x"):
        ext.router_logits(x.double(), router)


def test_the_cpp_router_survives_hostile_rows_and_refuses_bad_arguments():
    """NaN and infinite rows still choose experts in range (NaN ranks first, as in `topk`); bad
    shapes, dtypes and counts are refused before anything is read."""
    ext = load_extension()
    x, router = torch.randn(4, 32), torch.randn(8, 32)
    x[0] = float("nan")
    x[1, 3] = float("inf")
    x[2] = 1e38
    for scoring in ("sigmoid", "softmax", "softmax_of_chosen"):
        weights, chosen = ext.route_experts(x, router, None, 8, scoring, True, 0.0, 1.0)
        assert chosen.min() >= 0 and chosen.max() < 8
        assert all(sorted(row.tolist()) == list(range(8)) for row in chosen), "k = E: all, once"
        assert torch.isclose(weights[3].sum(), torch.tensor(1.0)), "a finite row renormalizes"
    for top_k in (0, 9, 2**63 - 1, -(2**63)):
        with pytest.raises(RuntimeError, match="top_k"):
            ext.route_experts(x, router, None, top_k, "sigmoid", True, 0.0, 1.0)
    with pytest.raises(RuntimeError, match="router"):
        ext.route_experts(x, torch.randn(8, 31), None, 2, "sigmoid", True, 0.0, 1.0)
    with pytest.raises(RuntimeError, match="bias"):
        ext.route_experts(x, router, torch.randn(7), 2, "sigmoid", True, 0.0, 1.0)
    with pytest.raises(RuntimeError, match="x"):
        ext.route_experts(x.double(), router, None, 2, "sigmoid", True, 0.0, 1.0)
    for scoring in ("tanh", "", "softmax\x00"):
        with pytest.raises(RuntimeError, match="softmax, sigmoid or softmax_of_chosen"):
            ext.route_experts(x, router, None, 2, scoring, True, 0.0, 1.0)
    with pytest.raises(TypeError):  # (a lone surrogate is no UTF-8 string)
        ext.route_experts(x, router, None, 2, "softmax\ud800", True, 0.0, 1.0)


@pytest.mark.skipif(not blocks_serve_every_batch(torch.float32, 16),
                    reason="16-bit activations over blocks do not take every batch")  # fmt: skip
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "gpt_oss"])
def test_a_softmax_router_is_float32_where_every_expert_is_blocks(
    tmp_path, tiny_model_factory, family
):
    """In a float32 model whose experts all multiply from a file's blocks, a softmax `gate` is
    loaded as the float32 router the C++ one runs (a token's experts from its own row; gpt-oss's
    with its bias, softmaxed over the chosen), and the layers run in the fused C++ loop; where
    the experts are floats (an F32 file) the gate stays the model's linear and the layers run in
    Python."""
    folder = tiny_model_factory(family)
    for qtype, from_blocks in ((Q.Q8_0, True), (Q.F32, False)):
        llm = tiny_gguf_engine(folder, tmp_path / f"{family}-{qtype.name}.gguf", qtype)
        model = llm.core.loaded.model
        sparse = [layer for layer in model.layers if layer.sparse]
        assert all(layer.float32_router == from_blocks for layer in sparse)
        assert all(hasattr(layer, "gate") != from_blocks for layer in sparse)
        assert (model.fused_layers is not None) == from_blocks
        if family == "gpt_oss" and from_blocks:
            layer = sparse[0]
            assert layer.scoring == "softmax_of_chosen" and layer.router_bias is not None
            # the PyTorch router (other backends) and the C++ one choose alike
            x = torch.randn(
                64, llm.core.arch.hidden_size, generator=torch.Generator().manual_seed(0)
            )
            weights, chosen = layer.route_in_float32(x)
            want = load_extension().route_experts(
                x, layer.router_weight, layer.router_bias, layer.top_k, "softmax_of_chosen",
                layer.norm_topk_prob, layer.norm_epsilon, layer.routed_scale,
            )  # fmt: skip
            assert torch.equal(chosen, want[1])
            torch.testing.assert_close(weights, want[0], rtol=1e-5, atol=1e-6)


def test_a_file_whose_experts_are_not_all_blocks_keeps_its_router():
    """The float32 router replaces a softmax gate only where every expert stack is in a format
    kept as blocks (a file with one stack of floats keeps the gate, its packed linear)."""
    from types import SimpleNamespace

    from inflight.model.loader import _block_types, _experts_all_blocks

    kept = _block_types(torch.float32, 16)
    q8, f16 = int(Q.Q8_0), int(Q.F16)

    def index(gate, up, down):
        types = {"gate": gate, "up": up, "down": down}
        return SimpleNamespace(entries=[{"name": f"blk.0.ffn_{p}_exps.{e}.weight", "type": t}
                                        for p, t in types.items() for e in range(2)])  # fmt: skip

    assert _experts_all_blocks(index(q8, q8, q8), kept) == (q8 in kept)
    assert not _experts_all_blocks(index(q8, f16, q8), kept)
    assert not _experts_all_blocks(SimpleNamespace(entries=[]), kept)  # no experts
    # gpt-oss's bias stacks are float32 beside blocks: its experts' weights are all blocks
    f32 = int(Q.F32)
    biased = index(q8, q8, q8)
    biased.entries += [{"name": f"blk.0.ffn_{p}_exps.{e}.bias", "type": f32}
                       for p in ("gate", "up", "down") for e in range(2)]  # fmt: skip
    assert _experts_all_blocks(biased, kept) == (q8 in kept)


@pytest.mark.skipif(not blocks_serve_every_batch(torch.float32, 16),
                    reason="16-bit activations over blocks do not take every batch")  # fmt: skip
def test_the_experts_call_refuses_bad_biases_limits_and_experts(tmp_path, tiny_model_factory):
    """`gguf_int_experts` checks what it indexes before it runs: a bias list per expert of the
    right widths, a finite clamp (0: SiLU), experts in range."""
    llm = tiny_gguf_engine(tiny_model_factory("gpt_oss"), tmp_path / "gpt-oss.gguf", Q.Q8_0)
    layer = next(layer for layer in llm.core.loaded.model.layers if layer.sparse)
    gate_up, down, bits = layer.expert_packings
    biases_up, biases_down, limit, alpha = layer.expert_kernel_extras()
    inter, hidden = layer.experts[0].down_proj.in_features, llm.core.arch.hidden_size
    x = torch.randn(2, hidden)
    chosen, weights = torch.tensor([[0, 1], [1, 2]]), torch.full((2, 2), 0.5)
    run = load_extension().gguf_int_experts

    def call(up=biases_up, dn=biases_down, lim=limit, chosen=chosen):
        return run(x, chosen, weights, gate_up, down, inter, bits, up, dn, lim, alpha)

    assert call().shape == (2, hidden)
    with pytest.raises(RuntimeError, match="one an expert"):
        call(up=biases_up[:-1])
    with pytest.raises(RuntimeError, match=rf"an expert's bias: \[{hidden}\] float32"):
        call(dn=[torch.zeros(hidden + 1)] * len(biases_down))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(RuntimeError, match="swiglu_limit"):
            call(lim=bad)
    with pytest.raises(RuntimeError, match="expert 2147483647 of"):
        call(chosen=torch.tensor([[0, 2**31 - 1], [1, 2]]))
