"""GGUF file -> LlamaArchConfig and Hugging Face-named float32 tensors.

Dequantization is the `gguf` package's (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K and more).
llama.cpp's converter permutes the rows of Q and K weights of `llama`-architecture models into
an interleaved RoPE layout; `unpermute_qk` undoes that so the weights match HF's half-rotation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from inflight.errors import ModelLoadError
from inflight.model.arch import LlamaArchConfig

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def open_gguf(path: Path) -> GGUFReader:
    try:
        return GGUFReader(path)
    except Exception as e:  # the gguf package raises many kinds on bad bytes
        raise ModelLoadError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from e


def field_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_arch_config(reader: GGUFReader, path: Path) -> LlamaArchConfig:
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: unsupported GGUF architecture {arch!r}; "
            f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ModelLoadError(
            f"{path}: GGUF rope frequency factors (llama3 RoPE) are not supported yet"
        )

    def meta(key: str, default: Any = None) -> Any:
        value = field_value(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(meta("embedding_length"))
    num_heads = int(meta("attention.head_count"))
    tokens = field_value(reader, "tokenizer.ggml.tokens") or []
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    return LlamaArchConfig(
        architecture=arch,
        vocab_size=int(meta("vocab_size", len(tokens) or None)),
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_layers=int(meta("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(meta("attention.head_count_kv", num_heads)),
        head_dim=int(meta("attention.key_length", hidden // num_heads)),
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        max_position_embeddings=int(meta("context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        bos_token_id=field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: interleaved RoPE row pairs back to HF's halves."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def hf_name(gguf_name: str) -> str | None:
    base, _, kind = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        mapped = _LAYER_NAMES.get(part)
        return None if mapped is None else f"model.layers.{layer}.{mapped}.{kind}"
    mapped = _TOP_NAMES.get(base)
    return None if mapped is None else f"{mapped}.{kind}"


def iter_gguf_weights(
    reader: GGUFReader, cfg: LlamaArchConfig, path: Path
) -> Iterator[tuple[str, torch.Tensor]]:
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{path}: unexpected GGUF tensor {tensor.name!r}")
        try:
            array = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as e:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name!r} has unsupported type {tensor.tensor_type.name}"
            ) from e
        # GGUF lists dims fastest-first; numpy order is the reverse.
        array = np.asarray(array, dtype=np.float32).reshape(tuple(reversed(tensor.shape.tolist())))
        if cfg.architecture == "llama":
            if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
                array = unpermute_qk(array, cfg.num_heads)
            elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
                array = unpermute_qk(array, cfg.num_kv_heads)
        # (memory-mapped F32 tensors are read-only views; torch wants writable memory)
        yield name, torch.from_numpy(np.require(array, requirements=["C", "W"]))
