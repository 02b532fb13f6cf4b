"""Hunyuan dense (`HunYuanDenseV1ForCausalLM`, GGUF `hunyuan-dense`): Qwen3's layer with its
per-head q/k norms (the checkpoint's `query_layernorm`, `key_layernorm`) applied to the rotated
queries and keys, after RoPE (`DecoderLayer.qk_norm_after_rope`, which the C++ layer loop
honours too). Its RoPE's NTK `alpha` only stretches the base (`arch.py`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch

from inflight.model.llama import DecoderLayer, renamed_weights
from inflight.model.qwen3 import Qwen3DecoderLayer, Qwen3Model

# the checkpoint's names of Qwen3's q/k norms
_NORM_NAMES = {r"\.self_attn\.query_layernorm\.": ".self_attn.q_norm.",
               r"\.self_attn\.key_layernorm\.": ".self_attn.k_norm."}  # fmt: skip


class HunyuanDecoderLayer(Qwen3DecoderLayer):
    qk_norm_after_rope = True


class HunyuanModel(Qwen3Model):
    layer_class: ClassVar[type[DecoderLayer]] = HunyuanDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(renamed_weights(weights, _NORM_NAMES))
