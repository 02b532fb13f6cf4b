"""Phi-3 and Phi-4 (`Phi3ForCausalLM`): the Llama decoder, whose checkpoints already hold the
fused projections this engine builds for Llama (`self_attn.qkv_proj`, q then k then v rows;
`mlp.gate_up_proj`, gate then up; GGUF `attn_qkv` and `ffn_up`), so each is one weight of the
file rather than parts to concatenate. Their RoPE variants are config (`arch.py`): LongRoPE
(the 128k-context models; `LlamaModel.fit_rope_to` picks its short or long factors) and partial
rotary embeddings (Phi-4-mini rotates the first 3/4 of each head; the layer ops' `rope_`)."""

from __future__ import annotations

from typing import ClassVar

from inflight.model.llama import LlamaModel


class Phi3Model(LlamaModel):
    _PROJECTIONS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        "qkv_proj": ("self_attn", ("qkv_proj",)),
        "o_proj": ("self_attn", ("o_proj",)),
        "gate_up_proj": ("mlp", ("gate_up_proj",)),
        "down_proj": ("mlp", ("down_proj",)),
    }
