"""Qwen3.5 (`Qwen3_5ForCausalLM`, and the language model of `Qwen3_5ForConditionalGeneration`):
gated DeltaNet layers beside Qwen3's attention with its output gated. The tiny Qwen3.5 of
`TINY_ARCHS` (DeltaNet in layers 0 and 2) is held to transformers' greedy tokens in every
setting that changes the computation, and what its state must survive in test_state_layers;
here, the state's shape, what it refuses, the configs, an image-and-text folder, the C++ rule
against the Python one, and the GGUF files (Qwen3.5-MoE's and Qwen3-Next's too)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file

from inflight import LLM
from inflight.errors import ModelLoadError
from inflight.model.arch import LlamaArchConfig
from inflight.runner.conv_state import ConvState, conv_state_bytes
from tests.gguf_files import write_tiny_gguf
from tests.parity import (
    assert_gguf_generates_as_its_weights,
    greedy_reference,
    greedy_tokens,
)

# an image-and-text Qwen3.5 config as transformers 5 saves one (its text model at transformers'
# defaults: the 9B's shape), the fields the engine reads
PUBLISHED = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 32, "num_attention_heads": 16,
        "num_key_value_heads": 4, "head_dim": 256, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "full_attention_interval": 4, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144, "eos_token_id": 248044,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                            "mrope_section": [11, 11, 10]},
    },
    "vision_config": {"depth": 27, "hidden_size": 1152},
}  # fmt: skip


def test_a_qwen3_5_config_is_read():
    arch = LlamaArchConfig.from_hf_config(PUBLISHED)
    assert arch.architecture == "qwen3_5" and arch.num_layers == 32
    assert arch.kv_layers == (3, 7, 11, 15, 19, 23, 27, 31)  # every fourth attends
    assert len(arch.conv_layers) == 24 and arch.conv_kernel == 4
    heads = (arch.delta_key_heads, arch.delta_value_heads, arch.delta_key_dim,
             arch.delta_value_dim)  # fmt: skip
    assert heads == (16, 32, 128, 128)
    assert arch.conv_width == 2 * 16 * 128 + 32 * 128  # q, k and v rows
    assert (arch.head_dim, arch.rope_dim, arch.rope_theta) == (256, 64, 1e7)
    assert arch.attention_output_gate and not arch.tie_word_embeddings
    assert arch.rope_scaling is None  # (text alone: the plain RoPE)
    # a float32 state matrix a value head, a row a slot (and a zero row and a scratch row)
    per_row = 24 * (32 * 128 * 128 * 4 + 3 * arch.conv_width * 2)
    assert conv_state_bytes(arch, 8, torch.bfloat16) == 10 * per_row


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"linear_num_value_heads": 24}, "do not share 16 key heads evenly"),
        ({"linear_num_value_heads": 2**64}, "value_heads"),
        ({"linear_num_key_heads": 0}, "key_heads"),
        ({"linear_key_head_dim": float("nan")}, "key_dim"),
        ({"linear_value_head_dim": -1}, "value_dim"),
        ({"linear_conv_kernel_dim": 1}, "a kernel of 2 to"),
        ({"linear_conv_kernel_dim": 2**63}, "a kernel of 2 to"),
        ({"full_attention_interval": 0}, "full_attention_interval"),
        ({"layer_types": ["linear_attention"] * 31}, "layer_types must name 32"),
        ({"layer_types": ["mamba"] * 32}, "layer_types must name 32"),
        ({"layer_types": ["linear_attention"] * 32}, "at least one layer attends"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "biased attention"),
    ],
)
def test_qwen3_5_configs_not_built_or_broken_are_refused(change, message):
    text = {**PUBLISHED["text_config"], **change}
    with pytest.raises(ValueError, match=message):
        LlamaArchConfig.from_hf_config({**text, "architectures": ["Qwen3_5ForCausalLM"]})


@pytest.fixture(scope="module")
def qwen3_5(tiny_model_factory):
    """The tiny Qwen3.5's folder, 16 prompts and transformers' greedy tokens for them."""
    folder = tiny_model_factory("qwen3_5")
    return folder, *greedy_reference(folder)


def test_the_deltanet_layers_hold_state_matrices_and_no_kv(qwen3_5):
    folder, *_ = qwen3_5
    # (no prefix cache, so no saved states: the slots and two rows alone)
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=64, max_num_seqs=5,
              enable_prefix_caching=False)  # fmt: skip
    arch = llm.core.arch
    assert arch.kv_layers == (1, 3) and len(llm.core.kv_cache.layers) == 2
    state = llm.core.runner.conv_state
    assert len(state.layers) == len(state.recurrent) == 2  # layers 0 and 2
    assert state.layers[0].shape == (7, 3, 2 * 2 * 16 + 4 * 32)  # q, k, v: 3 positions back
    assert state.recurrent[0].shape == (7, 4, 16, 32) and state.recurrent[0].dtype == torch.float32
    assert conv_state_bytes(arch, 5, torch.float32) == state.num_bytes
    # speculating 3 tokens: three draft rows a slot beside it
    spec = LLM(str(folder), dtype="float32", num_kv_blocks=64, max_num_seqs=5,
               enable_prefix_caching=False, num_speculative_tokens=3)  # fmt: skip
    drafting = spec.core.runner.conv_state
    assert drafting.recurrent[0].shape[0] == 7 + 5 * 3
    assert conv_state_bytes(arch, 5, torch.float32, num_drafts=3) == drafting.num_bytes


def test_the_state_is_reported_beside_the_kv_pool(qwen3_5):
    """`inflight_sequence_state_bytes` on /metrics: what the slots hold, which `bench memory`
    counts beside the KV pool."""
    from inflight.engine.async_engine import AsyncLLM

    folder, *_ = qwen3_5
    engine = AsyncLLM(str(folder), dtype="float32", max_num_seqs=3)
    try:
        value = engine.metrics.registry.get_sample_value("inflight_sequence_state_bytes")
        assert value == engine.core.runner.conv_state.num_bytes > 0
    finally:
        asyncio.run(engine.shutdown())


def test_ranks_that_do_not_divide_the_key_heads_are_refused_with_the_numbers():
    from inflight.parallel.shard import check_tensor_parallel

    text = {**PUBLISHED["text_config"], "linear_num_key_heads": 6, "linear_num_value_heads": 12}
    arch = LlamaArchConfig.from_hf_config({**PUBLISHED, "text_config": text})
    check_tensor_parallel(arch, 2)
    with pytest.raises(ValueError, match="4 does not divide the model's 6 DeltaNet key heads"):
        check_tensor_parallel(arch, 4)


def test_two_ranks_split_a_gguf_files_tiled_value_heads(tmp_path, qwen3_5):
    """A `qwen35` file tiles its value heads (value head v served by key head v % key heads):
    each of two ranks holds one key head and the value heads 0 and 2, or 1 and 3 (their rows,
    decay rates, convolution kernels and out_proj's columns), and gives one rank's greedy
    tokens; the folder's checkpoint order is the split test's (tests/parallel). The rank's
    state slots hold its heads alone."""
    folder, prompts, max_tokens, _ = qwen3_5
    path = write_tiny_gguf(folder, tmp_path / "qwen3_5.gguf", GGMLQuantizationType.Q8_0)
    knobs = {"dtype": "float32", "quantized_activations": "off", "max_num_batched_tokens": 32}
    want = greedy_tokens(LLM(str(path), **knobs), prompts, max_tokens)
    split = LLM(str(path), tensor_parallel_size=2, **knobs)
    assert split.core.arch.delta_heads_tiled
    delta = next(layer for layer in split.core.loaded.model.layers if layer.is_conv)
    assert (delta.key_heads, delta.value_heads, delta.decay_rate.shape) == (1, 2, (2,))
    assert split.core.runner.conv_state.recurrent[0].shape[1:] == (2, 16, 32)
    assert greedy_tokens(split, prompts, max_tokens) == want
    split.core.workers.close()


def test_an_image_and_text_folder_serves_its_language_model(tmp_path, qwen3_5):
    """`Qwen3_5ForConditionalGeneration`'s folder: the language model under
    `model.language_model.`, a vision tower and a multi-token-prediction layer beside it (both
    left out), its config nested in `text_config`."""
    folder, prompts, max_tokens, expected = qwen3_5
    out = tmp_path / "qwen3_5_vl"
    out.mkdir()
    for f in folder.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    text = json.loads((folder / "config.json").read_text())
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "tie_word_embeddings": text.pop("tie_word_embeddings"),
              "text_config": {k: v for k, v in text.items() if k != "architectures"},
              "vision_config": {"depth": 1}}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    weights = load_file(folder / "model.safetensors")
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in weights.items()}
    renamed["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    renamed["mtp.layers.0.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(renamed, out / "model.safetensors")
    llm = LLM(str(out), dtype="float32")
    assert llm.core.arch.architecture == "qwen3_5"
    assert greedy_tokens(llm, prompts[:6], max_tokens[:6]) == expected[:6]


def test_the_cpp_rule_computes_the_python_one():
    """`gated_delta_rule` in C++ against the Python loop: requests of 1 to 9 rows (decodes and
    prompt chunks), some starting from zeros, some from a state, in place or into another row,
    the state after two tokens written to draft rows too; rows not written stay as they
    were."""
    from inflight.kernels import load_extension
    from inflight.model.qwen3_5 import gated_delta_rule, l2_normalized

    ext = load_extension()
    torch.manual_seed(0)
    state = ConvState(1, 4, kernel=4, channels=8, dtype=torch.float32,
                      device=torch.device("cpu"), recurrent=(6, 16, 24), num_drafts=1)  # fmt: skip
    states = state.recurrent[0]
    states[:4].normal_()  # (the slots' rows; the zero row, 4, stays zeros)
    lengths = [1, 9, 1, 4]
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    t = starts[-1]
    q = l2_normalized(torch.randn(t, 6, 16)) / 4
    k = l2_normalized(torch.randn(t, 6, 16))
    v, g, beta = torch.randn(t, 6, 24), -torch.rand(t, 6), torch.rand(t, 6)
    rows = {"read_rows": torch.tensor([0, 4, 3, 1]), "write_rows": torch.tensor([0, 2, 5, 1])}
    snapshots = torch.full((t,), -1)
    snapshots[2], snapshots[t - 2] = 6, 7  # (request 1's second token, request 3's third)
    step = type("Step", (), {**rows, "starts": starts, "snapshot_rows": snapshots})()
    before, python_states = states.clone(), states.clone()
    want = gated_delta_rule(q, k, v, g, beta, python_states, step)
    got = ext.gated_delta_rule(q, k, v, g, beta, states, step.read_rows, step.write_rows,
                               snapshots, starts)  # fmt: skip
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states, python_states, rtol=1e-5, atol=1e-5)
    assert states[4].abs().sum() == 0  # the zero row is read, never written
    untouched = [3, 4, *range(8, 10)]
    assert torch.equal(states[untouched], before[untouched])
    assert not torch.equal(states[6], before[6]) and not torch.equal(states[7], before[7])
    with pytest.raises(RuntimeError, match="out of range"):
        ext.gated_delta_rule(q, k, v, g, beta, states, torch.tensor([0, 4, 3, 10]),
                             step.write_rows, snapshots, starts)  # fmt: skip
    with pytest.raises(RuntimeError, match="snapshot row 10 out of range"):
        ext.gated_delta_rule(q, k, v, g, beta, states, step.read_rows, step.write_rows,
                             snapshots.clamp(min=10), starts)  # fmt: skip
    with pytest.raises(RuntimeError, match="float32"):
        ext.gated_delta_rule(q.double(), k, v, g, beta, states, step.read_rows,
                             step.write_rows, snapshots, starts)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tiled", [False, True])
def test_the_cpp_layer_computes_the_pytorch_one(qwen3_5, dtype, tiled):
    """`gated_delta_net` (a DeltaNet layer between its projections in one C++ call) against the
    layer's PyTorch ops (`delta_net`): requests of 1 to 9 rows from their states, the output,
    the convolution's state and the matrices written, to float32 rounding (bf16: a step of its
    own where an elementwise function lands an ulp apart)."""
    from tests.model.test_layer_ops import conv_step

    folder, *_ = qwen3_5
    model = LLM(str(folder), dtype=str(dtype).removeprefix("torch.")).core.loaded.model
    layer = next(layer for layer in model.layers if layer.is_conv)
    layer.tiled = tiled
    ext = layer.ops.ext
    torch.manual_seed(int(tiled))
    lengths, rows = [1, 9, 1, 4], 10
    t = sum(lengths)
    step = conv_step(lengths, layer.conv_weight.shape[1] - 1, rows, snapshots={2: 4, 12: 5})
    step.starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    qkvz = torch.randn(t, layer.qkvz_proj.out_features, dtype=dtype)
    ba = torch.randn(t, 2 * layer.value_heads, dtype=dtype)
    conv = torch.randn(rows, *layer.conv_weight.shape[::-1], dtype=dtype)[:, 1:]
    states = torch.randn(rows, layer.value_heads, layer.key_dim, layer.value_dim) * 0.1
    want_conv, want_states = conv.clone().contiguous(), states.clone()
    got_conv, got_states = conv.clone().contiguous(), states.clone()
    want = layer.delta_net(qkvz, ba, want_conv, want_states, step)
    got = ext.gated_delta_net(
        qkvz, ba, layer.conv_weight, got_conv, step.taps, step.keep, step.read_rows,
        step.write_rows, step.snapshot_rows, step.starts, got_states, layer.decay_rate,
        layer.dt_bias, layer.norm.weight, layer.norm.eps, layer.key_heads, tiled,
    )  # fmt: skip
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got_conv, want_conv)
    torch.testing.assert_close(got_states, want_states, rtol=2e-5, atol=2e-5)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    else:
        torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7)
        assert (got == want).float().mean() > 0.95
    with pytest.raises(RuntimeError, match="key heads"):
        ext.gated_delta_net(qkvz, ba, layer.conv_weight, got_conv, step.taps, step.keep,
                            step.read_rows, step.write_rows, step.snapshot_rows, step.starts,
                            got_states, layer.decay_rate, layer.dt_bias, layer.norm.weight,
                            1e-6, layer.value_heads + 1, tiled)  # fmt: skip
    with pytest.raises(RuntimeError, match="out of range"):
        ext.gated_delta_net(qkvz, ba, layer.conv_weight, got_conv, step.taps, step.keep,
                            step.read_rows, step.write_rows, step.snapshot_rows,
                            [0, 1, 10, 11, t + 1], got_states, layer.decay_rate, layer.dt_bias,
                            layer.norm.weight, 1e-6, layer.key_heads, tiled)  # fmt: skip


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_qwen35_gguf_generates_as_transformers_with_its_weights(tmp_path, qwen3_5, qtype):
    """A `qwen35` file as llama.cpp's converter writes it: the DeltaNet sizes in `ssm.*`, every
    norm but the DeltaNet output's as 1 + w, `ssm_a` = -exp(A_log), dt's bias as `ssm_dt.bias`,
    and the value heads tiled (each key head's first, then each one's second) in every tensor
    that has them. transformers reads no qwen35 GGUF: the reference is the folder's model with
    the file's rounded weights."""
    folder, *_ = qwen3_5
    path = write_tiny_gguf(folder, tmp_path / "qwen35.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.conv_layers, arch.kv_layers) == ("qwen3_5", (0, 2), (1, 3))
    assert arch.delta_heads_tiled and arch.attention_output_gate and arch.rope_dim == 16
    assert_gguf_generates_as_its_weights(llm, folder, qtype)


# Qwen3.5-MoE as transformers 5 saves its text config (at transformers' defaults: the 35B-A3B's
# shape), the fields the engine reads
MOE = {
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
    "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256,
    "full_attention_interval": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25},
}  # fmt: skip


def test_a_qwen3_5_moe_config_is_read():
    arch = LlamaArchConfig.from_hf_config(MOE)
    assert arch.architecture == "qwen3_5_moe" and len(arch.kv_layers) == 10
    experts = (arch.num_experts, arch.experts_per_token, arch.expert_intermediate_size)
    assert experts == (256, 8, 512) and arch.dense_layers == ()
    assert arch.norm_topk_prob and arch.router_scoring == "softmax"  # (always renormalized)
    assert (arch.shared_expert_intermediate_size, arch.shared_expert_gate) == (512, True)
    assert arch.delta_value_heads == 32 and arch.rope_dim == 64
    with pytest.raises(ValueError, match="num_experts_per_tok 300"):
        LlamaArchConfig.from_hf_config({**MOE, "num_experts_per_tok": 300})
    outer = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
             "text_config": {k: v for k, v in MOE.items() if k != "architectures"}}  # fmt: skip
    assert LlamaArchConfig.from_hf_config(outer) == arch


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_qwen35moe_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """A `qwen35moe` file: Qwen3.5's layers as `qwen35` files hold them, the experts stacked,
    the router and the shared expert's gate float32."""
    folder = tiny_model_factory("qwen3_5_moe")
    path = write_tiny_gguf(folder, tmp_path / "qwen35moe.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.conv_layers, arch.num_experts) == ("qwen3_5_moe", (0, 2), 4)
    assert arch.shared_expert_gate and arch.norm_topk_prob and arch.delta_heads_tiled
    assert_gguf_generates_as_its_weights(llm, folder, qtype)


NEXT = {  # Qwen3-Next-80B-A3B's config.json, the fields the engine reads
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "decoder_sparse_step": 1, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "moe_intermediate_size": 512,
    "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
    "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_theta": 10000000,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "vocab_size": 151936,
}  # fmt: skip


def test_a_qwen3_next_config_is_read():
    arch = LlamaArchConfig.from_hf_config(NEXT)
    assert arch.architecture == "qwen3_next" and len(arch.kv_layers) == 12
    assert (arch.num_experts, arch.experts_per_token, arch.dense_layers) == (512, 10, ())
    assert arch.shared_expert_gate and arch.norm_topk_prob and arch.rope_dim == 64
    assert LlamaArchConfig.from_hf_config({**NEXT, "mlp_only_layers": [0, 5]}).dense_layers == (
        0,
        5,
    )


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0],
                         ids=lambda q: q.name)  # fmt: skip
def test_a_qwen3next_gguf_generates_as_transformers_with_its_weights(
    tmp_path, tiny_model_factory, qtype
):
    """A `qwen3next` file: `in_proj_qkvz` split into `attn_qkv` and `attn_gate` by its
    converter, `ssm_ba` grouped by key head as the checkpoint holds it, the value heads in the
    checkpoint's order (not tiled), a dense MLP where the file has no router."""
    folder = tiny_model_factory("qwen3_next")
    path = write_tiny_gguf(folder, tmp_path / "qwen3next.gguf", qtype)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.conv_layers, arch.dense_layers) == ("qwen3_next", (0, 2), (1,))
    assert not arch.delta_heads_tiled
    assert_gguf_generates_as_its_weights(llm, folder, qtype)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("ssm.inner_size", 102, "inner_size 102 is not a width for each of 4 value heads"),
        ("ssm.inner_size", 100, r"conv_weight' has shape \(192, 4\), expected \(164, 4\)"),
        ("ssm.time_step_rank", 0, "inner_size 128 is not a width for each of 0 value heads"),
        ("ssm.time_step_rank", 3, "inner_size 128 is not a width for each of 3 value heads"),
        ("ssm.group_count", 0, "key_heads"),
        ("ssm.conv_kernel", 2**40, "a kernel of 2 to"),
        ("full_attention_interval", 0, "full_attention_interval 0"),
    ],
)
def test_a_qwen35_gguf_whose_deltanet_fields_disagree_is_refused(
    tmp_path, qwen3_5, key, value, message
):
    """Sizes no model has, or that its tensors do not have, in a file's metadata: a
    ModelLoadError naming the file (and the tensor, where the shapes disagree)."""
    folder, *_ = qwen3_5

    def changed(writer) -> None:
        writer.kv_data[0].pop(f"qwen35.{key}")
        writer.add_uint64(f"qwen35.{key}", value)

    path = write_tiny_gguf(folder, tmp_path / "qwen35.gguf", GGMLQuantizationType.F32,
                           metadata=changed)  # fmt: skip
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(path), dtype="float32")
