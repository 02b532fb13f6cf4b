"""Writes a GGUF file in the shapes of a real Llama model (or SmolLM3-3B, LFM2-1.2B, LFM2-8B-A1B,
gpt-oss-20b, DeepSeek-V2-Lite, Qwen3.5-9B, -0.8B or -35B-A3B, or Qwen3-30B-A3B), with
random weights and SmolLM2's tokenizer (from the default model's file), for memory and speed
benchmarks at sizes no package ships. Weights are N(0, 0.02), norms 1: the text is noise, the
shapes, bytes and kernels real.

    .venv/bin/python scripts/synthetic_gguf.py llama-3.2-3b --type Q4_0 --out /tmp/llama3b-q4_0.gguf

gpt-oss-20b is written as ggml-org's published file is laid out (`gpt-oss`: MXFP4 experts,
their biases, sinks, YaRN and the window in metadata; `--type Q8_0` for the rest): its expert
blocks are random bytes (FP4 codes, exponents near 2^-7), and SmolLM2's vocabulary is padded
with unused ordinary tokens to gpt-oss's 201,088 (as its own vocabulary is: not added
tokens), so that the embedding, the LM head and the tokenizer have their size.

LFM2-1.2B is written as llama.cpp's converter lays it out (`lfm2`: ten gated short
convolutions of 3 positions, `shortconv.*`, and six attention layers with q/k norms, a KV head
count per layer that is 0 for a convolution; tied embeddings, the final norm `token_embd_norm`).
LFM2-8B-A1B (`lfm2moe`) has 24 such layers, six of them attention, and after two dense MLPs 32
experts a layer, 4 a token, chosen by sigmoid scores plus a bias (`exp_probs_b`).

DeepSeek-V2-Lite is written as llama.cpp's converter lays it out (`deepseek2`: latent attention
with its expansion split into `attn_k_b` and `attn_v_b`, a dense first layer, then 64 experts
a layer, 6 a token, beside two shared ones; YaRN), SmolLM2's vocabulary padded to its 102,400.

Qwen3.5 is written as llama.cpp's converter lays it out (`qwen35`: three gated DeltaNet layers
in four, `attn_qkv`, `attn_gate` and `ssm_*`, their decay rates negative; every fourth layer
attention whose query rows carry each head's gate), SmolLM2's vocabulary padded to its 248,320;
Qwen3.5-35B-A3B (`qwen35moe`) has 256 experts of 512 a layer, 8 a token, beside a shared expert
under a sigmoid gate (`--layers N`: its first N of 40).

Qwen3-30B-A3B is written as llama.cpp's converter lays it out (`qwen3moe`: 128 experts a
layer, 8 a token, stacked per layer; q/k norms), SmolLM2's vocabulary padded to its 151,936;
`--layers N` writes its first N layers alone (its 48 take 57 GiB in F16).

`--like FILE` takes another GGUF's architecture, metadata, tokenizer and tensor shapes whole
(Gemma 3 270M's, say), its weights random; `--like FILE --header-only` writes that file's
metadata and tensor shapes alone (a few MB: a machine without the file makes it from them).

`--type` is any type the `gguf` package quantizes (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1);
for the K-quant mixes (Q4_K_M, Q5_K_M, Q6_K) write F16 and convert it with llama.cpp's
`llama-quantize` (built beside `llama-server`, see docs/benchmarks.md):
`llama-quantize in-f16.gguf out-q4_k_m.gguf Q4_K_M`. Tensors are generated and quantized one at
a time and written as they come, so memory stays near one tensor's size whatever the model's.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from gguf import (
    ExpertGatingFuncType,
    GGMLQuantizationType,
    GGUFReader,
    GGUFWriter,
    LlamaFileType,
    RopeScalingType,
)
from gguf.quants import quantize
from tqdm import tqdm

from inflight.model.loader import default_model_path

# (layers, hidden, intermediate, heads, kv heads, rope theta, context) of the real models
SHAPES = {
    "llama-3.2-1b": (16, 2048, 8192, 32, 8, 500000.0, 131072),
    "llama-3.2-3b": (28, 3072, 8192, 24, 8, 500000.0, 131072),
    "llama-3.1-8b": (32, 4096, 14336, 32, 8, 500000.0, 131072),
    "smollm3-3b": (36, 2048, 11008, 16, 4, 5000000.0, 65536),
    "lfm2-1.2b": (16, 2048, 8192, 32, 8, 1000000.0, 128000),
}
# LFM2-1.2B's attention layers (the others are short convolutions of LFM2_KERNEL positions)
LFM2_ATTENTION_LAYERS = (2, 5, 8, 10, 12, 14)
LFM2_KERNEL = 3
# LFM2-8B-A1B: (layers, hidden, dense intermediate, experts, experts a token, expert
# intermediate, dense layers, heads, kv heads), and its attention layers
LFM2_8B_A1B = (24, 2048, 7168, 32, 4, 1792, 2, 32, 8)
LFM2_MOE_ATTENTION_LAYERS = (2, 6, 10, 14, 18, 21)
# Qwen3.5: (layers, hidden, intermediate, heads, kv heads, head dim, DeltaNet key heads, value
# heads, key dim, value dim, vocab, tied embeddings); every fourth layer attends, the others are
# DeltaNet layers with a convolution of 4. 9B: transformers' `Qwen3_5TextConfig` defaults; 0.8B:
# its published sizes (24 layers of 1,024, 16 DeltaNet heads of 128, the embeddings its LM head)
QWEN3_5 = {
    "qwen3.5-9b": (32, 4096, 12288, 16, 4, 256, 16, 32, 128, 128, 248320, False),
    "qwen3.5-0.8b": (24, 1024, 3584, 8, 2, 256, 16, 16, 128, 128, 248320, True),
    "qwen3.5-35b-a3b": (40, 2048, 0, 16, 2, 256, 16, 32, 128, 128, 248320, False),
}
# Qwen3.5-MoE (`qwen35moe`): (experts, experts a token, expert intermediate, shared expert
# intermediate) of a shape above whose MLPs are experts beside a gated shared expert
QWEN3_5_EXPERTS = {"qwen3.5-35b-a3b": (256, 8, 512, 512)}
QWEN3_5_INTERVAL, QWEN3_5_KERNEL = 4, 4
# the GGUF architecture of each shape not written as `llama` (SmolLM3's every fourth layer
# attends without RoPE, and its embeddings are its LM head)
ARCHITECTURES = {"smollm3-3b": "smollm3", "gpt-oss-20b": "gpt-oss",
                 "deepseek-v2-lite": "deepseek2", "lfm2-1.2b": "lfm2",
                 "lfm2-8b-a1b": "lfm2moe", **dict.fromkeys(QWEN3_5, "qwen35"),
                 **dict.fromkeys(QWEN3_5_EXPERTS, "qwen35moe"),
                 "qwen3-30b-a3b": "qwen3moe"}  # fmt: skip
# Qwen3-30B-A3B (`qwen3moe`): (layers, hidden, experts, experts a token, expert intermediate,
# heads, kv heads, head dim, vocab); q/k norms, no dense layer, the chosen renormalized
QWEN3_30B_A3B = (48, 2048, 128, 8, 768, 32, 4, 128, 151936)
# gpt-oss-20b: (layers, hidden, experts, experts a token, heads, kv heads, head dim, vocab)
GPT_OSS_20B = (24, 2880, 32, 4, 64, 8, 64, 201088)
# DeepSeek-V2-Lite: (layers, hidden, dense intermediate, experts, experts a token, expert
# intermediate, shared experts, heads, kv_lora_rank, qk_nope, qk_rope, v head, vocab)
DEEPSEEK_V2_LITE = (27, 2048, 10944, 64, 6, 1408, 2, 16, 512, 128, 64, 128, 102400)
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")  # fmt: skip


def tensors(layers: int, hidden: int, inter: int, heads: int, kv_heads: int, vocab: int,
            tied: bool = False, lfm2: bool = False):  # fmt: skip
    """(GGUF name, shape in numpy order) of every tensor, llama.cpp's names; `tied`: no LM head
    of its own (the embeddings serve); `lfm2`: LFM2's convolution layers and q/k norms."""
    head_dim = hidden // heads
    yield "token_embd.weight", (vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (hidden,)
        if lfm2 and i not in LFM2_ATTENTION_LAYERS:
            yield from _short_convolution(b, hidden)
        else:
            yield from _attention(b, hidden, heads, kv_heads, head_dim, qk_norms=lfm2)
        yield b + "ffn_norm.weight", (hidden,)
        yield b + "ffn_gate.weight", (inter, hidden)
        yield b + "ffn_up.weight", (inter, hidden)
        yield b + "ffn_down.weight", (hidden, inter)
    yield ("token_embd_norm.weight" if lfm2 else "output_norm.weight"), (hidden,)
    if not tied:
        yield "output.weight", (vocab, hidden)


def _expert_stacks(b: str, hidden: int, experts: int, inter: int):
    """A sparse layer's expert stacks, 3-D as llama.cpp's converters write them (after its
    router)."""
    yield b + "ffn_gate_exps.weight", (experts, inter, hidden)
    yield b + "ffn_up_exps.weight", (experts, inter, hidden)
    yield b + "ffn_down_exps.weight", (experts, hidden, inter)


def _short_convolution(b: str, hidden: int):
    """An LFM2 convolution layer's tensors (after its input norm)."""
    yield b + "shortconv.conv.weight", (hidden, LFM2_KERNEL)
    yield b + "shortconv.in_proj.weight", (3 * hidden, hidden)
    yield b + "shortconv.out_proj.weight", (hidden, hidden)


def lfm2_moe_tensors(vocab: int):
    """(GGUF name, shape in numpy order) of LFM2-8B-A1B's tensors, llama.cpp's names; expert
    stacks are 3-D."""
    layers, hidden, inter, experts, _, expert_inter, dense, heads, kv_heads = LFM2_8B_A1B
    yield "token_embd.weight", (vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (hidden,)
        if i in LFM2_MOE_ATTENTION_LAYERS:
            yield from _attention(b, hidden, heads, kv_heads, hidden // heads, qk_norms=True)
        else:
            yield from _short_convolution(b, hidden)
        yield b + "ffn_norm.weight", (hidden,)
        if i < dense:
            yield b + "ffn_gate.weight", (inter, hidden)
            yield b + "ffn_up.weight", (inter, hidden)
            yield b + "ffn_down.weight", (hidden, inter)
            continue
        yield b + "ffn_gate_inp.weight", (experts, hidden)
        yield b + "exp_probs_b.bias", (experts,)
        yield from _expert_stacks(b, hidden, experts, expert_inter)
    yield "token_embd_norm.weight", (hidden,)


def _attention(b: str, hidden: int, heads: int, kv_heads: int, head_dim: int, qk_norms: bool):
    """An attention layer's tensors (after its input norm)."""
    yield b + "attn_q.weight", (heads * head_dim, hidden)
    yield b + "attn_k.weight", (kv_heads * head_dim, hidden)
    yield b + "attn_v.weight", (kv_heads * head_dim, hidden)
    yield b + "attn_output.weight", (hidden, heads * head_dim)
    if qk_norms:
        yield b + "attn_q_norm.weight", (head_dim,)
        yield b + "attn_k_norm.weight", (head_dim,)


def qwen3_moe_tensors(layers: int):
    """(GGUF name, shape in numpy order) of Qwen3-30B-A3B's tensors (its first `layers`),
    llama.cpp's names; expert stacks are 3-D, the router F32 as llama.cpp's quantizer leaves
    it."""
    _, hidden, experts, _, expert_inter, heads, kv_heads, head_dim, vocab = QWEN3_30B_A3B
    yield "token_embd.weight", (vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (hidden,)
        yield from _attention(b, hidden, heads, kv_heads, head_dim, qk_norms=True)
        yield b + "ffn_norm.weight", (hidden,)
        yield b + "ffn_gate_inp.weight", (experts, hidden)
        yield from _expert_stacks(b, hidden, experts, expert_inter)
    yield "output_norm.weight", (hidden,)
    yield "output.weight", (vocab, hidden)


def qwen3_5_tensors(shape: str, layers: int):
    """(GGUF name, shape in numpy order) of a Qwen3.5's tensors (its first `layers`), as
    llama.cpp's converter writes them (`qwen35`, `qwen35moe`): DeltaNet layers' `attn_qkv`,
    `attn_gate` (z), `ssm_*`; attention layers' query rows with each head's gate after them;
    expert stacks 3-D, the shared expert's gate a vector."""
    _, hidden, inter, heads, kv_heads, head_dim, kh, vh, kd, vd, vocab, tied = QWEN3_5[shape]
    conv = 2 * kh * kd + vh * vd
    yield "token_embd.weight", (vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (hidden,)
        if (i + 1) % QWEN3_5_INTERVAL:
            yield b + "attn_qkv.weight", (conv, hidden)
            yield b + "attn_gate.weight", (vh * vd, hidden)
            yield b + "ssm_beta.weight", (vh, hidden)
            yield b + "ssm_alpha.weight", (vh, hidden)
            yield b + "ssm_conv1d.weight", (conv, QWEN3_5_KERNEL)
            yield b + "ssm_a", (vh,)
            yield b + "ssm_dt.bias", (vh,)
            yield b + "ssm_norm.weight", (vd,)
            yield b + "ssm_out.weight", (hidden, vh * vd)
        else:
            yield b + "attn_q.weight", (2 * heads * head_dim, hidden)
            yield b + "attn_k.weight", (kv_heads * head_dim, hidden)
            yield b + "attn_v.weight", (kv_heads * head_dim, hidden)
            yield b + "attn_output.weight", (hidden, heads * head_dim)
            yield b + "attn_q_norm.weight", (head_dim,)
            yield b + "attn_k_norm.weight", (head_dim,)
        yield b + "post_attention_norm.weight", (hidden,)
        if shape in QWEN3_5_EXPERTS:
            experts, _, expert_inter, shared = QWEN3_5_EXPERTS[shape]
            yield b + "ffn_gate_inp.weight", (experts, hidden)
            yield from _expert_stacks(b, hidden, experts, expert_inter)
            yield b + "ffn_gate_inp_shexp.weight", (hidden,)
            yield b + "ffn_gate_shexp.weight", (shared, hidden)
            yield b + "ffn_up_shexp.weight", (shared, hidden)
            yield b + "ffn_down_shexp.weight", (hidden, shared)
            continue
        yield b + "ffn_gate.weight", (inter, hidden)
        yield b + "ffn_up.weight", (inter, hidden)
        yield b + "ffn_down.weight", (hidden, inter)
    yield "output_norm.weight", (hidden,)
    if not tied:
        yield "output.weight", (vocab, hidden)


def write_qwen3_5_metadata(w: GGUFWriter, shape: str) -> tuple[int, int, int]:
    """A Qwen3.5's `qwen35` fields, as llama.cpp's converter writes them; returns (layers,
    hidden, vocab)."""
    layers, hidden, inter, heads, kv_heads, head_dim, kh, vh, kd, vd, vocab, _ = QWEN3_5[shape]
    w.add_context_length(262144)
    if shape in QWEN3_5_EXPERTS:
        experts, used, expert_inter, shared = QWEN3_5_EXPERTS[shape]
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        w.add_expert_feed_forward_length(expert_inter)
        w.add_expert_shared_feed_forward_length(shared)
    else:
        w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim // 4)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_rope_freq_base(10000000.0)
    w.add_ssm_conv_kernel(QWEN3_5_KERNEL)
    w.add_ssm_state_size(kd)
    w.add_ssm_group_count(kh)
    w.add_ssm_time_step_rank(vh)
    w.add_ssm_inner_size(vh * vd)
    w.add_full_attention_interval(QWEN3_5_INTERVAL)
    return layers, hidden, vocab


def gpt_oss_tensors():
    """(GGUF name, shape in numpy order) of gpt-oss-20b's tensors, llama.cpp's names; expert
    stacks are 3-D (their biases 2-D)."""
    layers, hidden, experts, _, heads, kv_heads, head_dim, vocab = GPT_OSS_20B
    q, kv = heads * head_dim, kv_heads * head_dim
    yield "token_embd.weight", (vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (hidden,)
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            yield b + f"{name}.weight", (rows, hidden)
            yield b + f"{name}.bias", (rows,)
        yield b + "attn_output.weight", (hidden, q)
        yield b + "attn_output.bias", (hidden,)
        yield b + "attn_sinks.weight", (heads,)
        yield b + "post_attention_norm.weight", (hidden,)
        yield b + "ffn_gate_inp.weight", (experts, hidden)
        yield b + "ffn_gate_inp.bias", (experts,)
        for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            yield b + f"{name}.weight", (experts, hidden, hidden)
            yield b + f"{name}.bias", (experts, hidden)
    yield "output_norm.weight", (hidden,)
    yield "output.weight", (vocab, hidden)


def deepseek_tensors():
    """(GGUF name, shape in numpy order) of DeepSeek-V2-Lite's tensors, llama.cpp's names (its
    converter's: W_UK transposed as `attn_k_b` [heads, latent, nope], W_UV as `attn_v_b`)."""
    (layers, hidden, inter, experts, _, expert_inter, shared, heads, latent, nope, rope, v,
     vocab) = DEEPSEEK_V2_LITE  # fmt: skip
    yield "token_embd.weight", (vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (hidden,)
        yield b + "attn_q.weight", (heads * (nope + rope), hidden)
        yield b + "attn_kv_a_mqa.weight", (latent + rope, hidden)
        yield b + "attn_kv_a_norm.weight", (latent,)
        yield b + "attn_k_b.weight", (heads, latent, nope)
        yield b + "attn_v_b.weight", (heads, v, latent)
        yield b + "attn_output.weight", (hidden, heads * v)
        yield b + "ffn_norm.weight", (hidden,)
        if i == 0:
            yield b + "ffn_gate.weight", (inter, hidden)
            yield b + "ffn_up.weight", (inter, hidden)
            yield b + "ffn_down.weight", (hidden, inter)
            continue
        yield b + "ffn_gate_inp.weight", (experts, hidden)
        yield from _expert_stacks(b, hidden, experts, expert_inter)
        yield b + "ffn_gate_shexp.weight", (shared * expert_inter, hidden)
        yield b + "ffn_up_shexp.weight", (shared * expert_inter, hidden)
        yield b + "ffn_down_shexp.weight", (hidden, shared * expert_inter)
    yield "output_norm.weight", (hidden,)
    yield "output.weight", (vocab, hidden)


def write_deepseek_metadata(w: GGUFWriter) -> tuple[int, int, int]:
    """DeepSeek-V2-Lite's `deepseek2` fields, as llama.cpp's converter writes them (YaRN's
    mscale_all_dim of 0.707 as a tenth); returns (layers, hidden, vocab)."""
    (layers, hidden, inter, experts, used, expert_inter, shared, heads, latent, nope, rope, v,
     vocab) = DEEPSEEK_V2_LITE  # fmt: skip
    w.add_context_length(163840)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_key_length(latent + rope)
    w.add_value_length(latent)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v)
    w.add_kv_lora_rank(latent)
    w.add_rope_dimension_count(rope)
    w.add_rope_freq_base(10000.0)
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(40.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_rope_scaling_yarn_log_mul(0.1 * 0.707)
    w.add_leading_dense_block_count(1)
    w.add_expert_feed_forward_length(expert_inter)
    w.add_expert_count(experts)
    w.add_expert_used_count(used)
    w.add_expert_shared_count(shared)
    w.add_expert_weights_scale(1.0)
    return layers, hidden, vocab


def random_mxfp4(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """[rows, cols / 32 * 17] MXFP4 blocks of random codes, exponents 2^-9..2^-7 (values up to
    about 0.05: the scale of N(0, 0.02) weights)."""
    blocks = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(119, 122, (rows, cols // 32), dtype=np.uint8)
    return blocks.reshape(rows, -1)


def copy_tokenizer(source: GGUFReader, w: GGUFWriter, vocab: int) -> None:
    """SmolLM2's tokenizer, as its GGUF holds it, padded with unused tokens to `vocab`."""
    for key in TOKENIZER_KEYS:
        field = source.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type") and len(value) < vocab:
            extra = vocab - len(value)
            value = value + ([f"<unused_{i}>" for i in range(extra)]
                             if key.endswith("tokens") else [1] * extra)  # fmt: skip
        w.add_key_value(key, value, field.types[0],
                        field.types[-1] if len(field.types) > 1 else None)  # fmt: skip


# a header-only file's tensors ("name:dim,dim,..." in numpy order), written by --header-only
LIKE_TENSORS = "inflight.synthetic.tensors"
# fields the reader makes of the file's own header, and those each written file sets anew
NOT_COPIED = ("GGUF.", "general.architecture", "general.file_type", "general.name", LIKE_TENSORS)


def like_specs(source: GGUFReader) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape in numpy order) of every tensor of `source`, or of the one it is a header of."""
    if LIKE_TENSORS in source.fields:
        entries = (e.split(":") for e in source.fields[LIKE_TENSORS].contents())
        return [(name, tuple(int(d) for d in dims.split(","))) for name, dims in entries]
    # (the reader's shapes are GGUF's, fastest dimension first)
    return [(t.name, tuple(int(d) for d in reversed(t.shape.tolist()))) for t in source.tensors]


def copy_metadata(source: GGUFReader, w: GGUFWriter) -> None:
    """Every key of `source` but its header's and those each file sets anew."""
    for key, field in source.fields.items():
        if key.startswith(NOT_COPIED):
            continue
        w.add_key_value(key, field.contents(), field.types[0],
                        field.types[-1] if len(field.types) > 1 else None)  # fmt: skip


def write_header_only(source: GGUFReader, out: Path) -> None:
    """`source`'s metadata and its tensors' shapes, no tensor data."""
    w = GGUFWriter(out, str(source.fields["general.architecture"].contents()))
    copy_metadata(source, w)
    specs = like_specs(source)
    w.add_array(LIKE_TENSORS, [f"{name}:{','.join(map(str, shape))}" for name, shape in specs])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def write_tensors(
    w: GGUFWriter,
    specs: list[tuple[str, tuple[int, ...]]],
    qtype: GGMLQuantizationType,
    seed: int,
    mxfp4_experts: bool = False,
) -> None:
    """The header and metadata given so far, then the tensors of `specs` (name, shape in numpy
    order): matrices in `qtype`, N(0, 0.02); norms 1 and other vectors small, in F32;
    `mxfp4_experts`: expert stacks as random MXFP4 blocks."""
    rng = np.random.default_rng(seed)

    def kind(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType:
        if mxfp4_experts and "_exps.weight" in name:
            return GGMLQuantizationType.MXFP4
        matrix = len(shape) >= 2 and name.endswith(".weight") and "ffn_gate_inp" not in name
        # (convolution kernels stay F32, as llama.cpp's quantizer leaves them)
        kernel = "shortconv.conv" in name or "ssm_conv1d" in name
        return qtype if matrix and not kernel else GGMLQuantizationType.F32

    for name, shape in specs:  # headers first: the writer streams the data afterwards
        size = 4 * math.prod(shape)
        if kind(name, shape) == GGMLQuantizationType.MXFP4:
            size = math.prod(shape) // 32 * 17
        elif kind(name, shape) != GGMLQuantizationType.F32:
            rows = math.prod(shape[:-1])
            size = quantize(np.zeros((1, shape[-1]), np.float32), qtype).nbytes * rows
        # (a dtype other than uint8: the shape given is then the values', not the bytes')
        raw = None if kind(name, shape) == GGMLQuantizationType.F32 else kind(name, shape)
        w.add_tensor_info(name, shape, np.dtype(np.float32), size, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in tqdm(specs, desc="writing tensors", unit="tensor"):
        if kind(name, shape) == GGMLQuantizationType.MXFP4:  # a layer's experts: 141 MB
            w.write_tensor_data(random_mxfp4(rng, shape[0] * shape[1], shape[2]))
            continue
        if kind(name, shape) == GGMLQuantizationType.F32:  # norms 1; biases, sinks, routers small
            norm = name.endswith("norm.weight")
            values = (np.ones(shape, np.float32) if norm else
                      rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))  # fmt: skip
            if name.endswith(".ssm_a"):  # a decay rate -exp(A_log): negative, as trained
                values = -rng.uniform(1.0, 16.0, shape).astype(np.float32)
            w.write_tensor_data(values)
            continue
        count, rows = math.prod(shape[:-1]), []  # (an expert stack's rows: all experts')
        for start in range(0, count, 4096):  # a slice at a time: float32 stays small
            n = min(4096, count - start)
            values = rng.standard_normal((n, shape[-1]), dtype=np.float32) * np.float32(0.02)
            rows.append(quantize(values, qtype))
        w.write_tensor_data(np.concatenate(rows))


def write_like(like: GGUFReader, qtype: GGMLQuantizationType, seed: int, out: Path) -> None:
    """A file of `like`'s architecture, metadata and tensor shapes, its weights random."""
    w = GGUFWriter(out, str(like.fields["general.architecture"].contents()))
    w.add_name(f"synthetic like {like.fields['general.name'].contents()}"
               if "general.name" in like.fields else "synthetic")  # fmt: skip
    copy_metadata(like, w)
    w.add_file_type(int(LlamaFileType[f"MOSTLY_{qtype.name}"]))
    write_tensors(w, like_specs(like), qtype, seed)
    w.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", nargs="?", choices=[*SHAPES, "lfm2-8b-a1b", "gpt-oss-20b",
                                                     "deepseek-v2-lite", *QWEN3_5,
                                                     "qwen3-30b-a3b"])  # fmt: skip
    parser.add_argument("--like", type=Path,
                        help="a GGUF file (or a header of one) whose architecture, metadata, "
                        "tokenizer and tensor shapes to take, in place of a shape")  # fmt: skip
    parser.add_argument(
        "--header-only",
        action="store_true",
        help="with --like: its metadata and tensor shapes alone, no data",
    )
    parser.add_argument("--layers", type=int,
                        help="the first N layers alone (qwen3-30b-a3b, qwen3.5-*: a file that "
                        "fits a small machine, its layers' shapes whole)")  # fmt: skip
    parser.add_argument("--type", default="F16", help="F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", type=Path,
                        help="a GGUF file whose tokenizer to copy (default: the default "
                        "model's; `--tokenizer-only` writes a small one)")  # fmt: skip
    parser.add_argument("--tokenizer-only", action="store_true",
                        help="write the tokenizer's metadata alone, no tensors (for machines "
                        "without the default model)")  # fmt: skip
    args = parser.parse_args(argv)
    if (args.shape is None) == (args.like is None):
        parser.error("name a shape or --like FILE")
    qtype = GGMLQuantizationType[args.type]
    if args.like is not None:
        like = GGUFReader(args.like)
        if args.header_only:
            write_header_only(like, args.out)
        else:
            write_like(like, qtype, args.seed, args.out)
        print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")
        return
    source = GGUFReader(args.tokenizer or default_model_path())
    if args.tokenizer_only:
        w = GGUFWriter(args.out, "llama")
        copy_tokenizer(source, w, len(source.fields["tokenizer.ggml.tokens"].contents()))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")
        return
    gpt_oss = args.shape == "gpt-oss-20b"
    arch = ARCHITECTURES.get(args.shape, "llama")
    w = GGUFWriter(args.out, arch)
    w.add_name(f"synthetic {args.shape}")
    if arch == "deepseek2":
        layers, hidden, vocab = write_deepseek_metadata(w)
        specs = list(deepseek_tensors())
    elif arch in ("qwen35", "qwen35moe"):
        layers, hidden, vocab = write_qwen3_5_metadata(w, args.shape)
        layers = args.layers or layers
        specs = list(qwen3_5_tensors(args.shape, layers))
    elif arch == "qwen3moe":
        layers, hidden, experts, used, expert_inter, heads, kv_heads, head_dim, vocab = (
            QWEN3_30B_A3B
        )
        layers = args.layers or layers
        w.add_context_length(40960)
        w.add_feed_forward_length(6144)
        w.add_rope_freq_base(1000000.0)
        w.add_expert_feed_forward_length(expert_inter)
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        specs = list(qwen3_moe_tensors(layers))
    elif arch == "lfm2moe":
        layers, hidden, inter, experts, used, expert_inter, dense, heads, kv_heads = LFM2_8B_A1B
        head_dim = hidden // heads
        vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
        w.add_context_length(128000)
        w.add_feed_forward_length(inter)
        w.add_rope_freq_base(1000000.0)
        w.add_expert_feed_forward_length(expert_inter)
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        w.add_leading_dense_block_count(dense)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        specs = list(lfm2_moe_tensors(vocab))
    elif gpt_oss:
        layers, hidden, experts, used, heads, kv_heads, head_dim, vocab = GPT_OSS_20B
        w.add_context_length(131072)
        w.add_feed_forward_length(hidden)
        w.add_expert_feed_forward_length(hidden)
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        w.add_sliding_window(128)
        w.add_rope_freq_base(150000.0)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        specs = list(gpt_oss_tensors())
    else:
        layers, hidden, inter, heads, kv_heads, theta, context = SHAPES[args.shape]
        head_dim = hidden // heads
        vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
        w.add_context_length(context)
        w.add_feed_forward_length(inter)
        w.add_rope_freq_base(theta)
        specs = list(tensors(layers, hidden, inter, heads, kv_heads, vocab,
                             tied=arch in ("smollm3", "lfm2"), lfm2=arch == "lfm2"))  # fmt: skip
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_layer_norm_rms_eps(1e-6 if arch in ("qwen35", "qwen35moe", "qwen3moe") else 1e-5)
    if arch in ("lfm2", "lfm2moe"):  # a KV head count per layer: 0 for a convolution
        attending = LFM2_ATTENTION_LAYERS if arch == "lfm2" else LFM2_MOE_ATTENTION_LAYERS
        w.add_head_count_kv([kv_heads if i in attending else 0 for i in range(layers)])
        w.add_shortconv_l_cache(LFM2_KERNEL)
    if arch not in ("deepseek2", "qwen35", "qwen35moe", "qwen3moe"):  # (heads' sizes above)
        w.add_head_count(heads)
        if arch not in ("lfm2", "lfm2moe"):
            w.add_head_count_kv(kv_heads)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(int(LlamaFileType[f"MOSTLY_{qtype.name}"]))
    copy_tokenizer(source, w, vocab)
    write_tensors(w, specs, qtype, args.seed, mxfp4_experts=gpt_oss)
    w.close()
    print(f"{args.out}: {args.out.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main(sys.argv[1:])
