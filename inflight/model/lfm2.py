"""LFM2 (`Lfm2ForCausalLM`, GGUF `lfm2`): Liquid AI's hybrid of short convolutions and attention;
LFM2-MoE (`Lfm2MoeForCausalLM`, GGUF `lfm2moe`) the same layers with experts for their MLPs
after the first dense ones (a sigmoid router whose learned bias chooses, GLM-4.5's).

Most layers are gated short convolutions: `in_proj` makes three rows B, C and x of each token,
B * x goes through a causal depthwise convolution over the last `conv_kernel` positions (3),
C gates its output, and `out_proj` takes it back to the residual stream. The other layers are
Qwen3's attention (per-head q/k RMSNorms before RoPE). Every layer has a SwiGLU MLP; the final
norm is named `embedding_norm` although it comes last.

A convolution layer holds no KV: each request's last inputs to it travel from step to step in
`runner/conv_state.py`'s slots, and the KV cache holds the attention layers alone
(`arch.kv_layers`). The forward pass gets the KV layers' caches and metadata, and the step's
`ConvStep`, and hands every layer its own: a convolution layer's "cache" is its state tensor
and the step, which `attention` (the token-mixing sublayer) reads in its place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, renamed_weights
from inflight.model.moe import MoEDecoderLayer, MoEModel
from inflight.model.packed_linear import Decodes, apply_linear
from inflight.model.qwen3 import Qwen3DecoderLayer, Qwen3Model

# the checkpoint's names -> the Llama names the base loader fuses and places
_NAMES = {
    r"\.feed_forward\.w1\.": ".mlp.gate_proj.",
    r"\.feed_forward\.w3\.": ".mlp.up_proj.",
    r"\.feed_forward\.w2\.": ".mlp.down_proj.",
    r"\.self_attn\.out_proj\.": ".self_attn.o_proj.",
    r"\.self_attn\.q_layernorm\.": ".self_attn.q_norm.",
    r"\.self_attn\.k_layernorm\.": ".self_attn.k_norm.",
    r"\.operator_norm\.": ".input_layernorm.",
    r"\.ffn_norm\.": ".post_attention_layernorm.",
    r"^model\.embedding_norm\.": "model.norm.",
    r"\.conv\.conv\.weight$": ".conv_weight",
    r"\.conv\.(in|out)_proj\.": r".\1_proj.",
}


class Lfm2DecoderLayer(Qwen3DecoderLayer):
    """Qwen3's attention layer, or (`is_conv`) a gated short convolution in its place."""

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        self.is_conv = index in cfg.conv_layers
        if self.is_conv:
            del self.qkv_proj, self.o_proj, self.q_norm, self.k_norm
            # (a rank's share of the channels under tensor parallelism: its out_proj's output
            # is then a partial sum, all-reduced as attention's is)
            hidden, channels = cfg.hidden_size, cfg.conv_width
            self.in_proj = nn.Linear(hidden, 3 * channels, bias=False)
            self.out_proj = nn.Linear(channels, hidden, bias=False)
            self.conv_weight = nn.Parameter(torch.zeros(channels, cfg.conv_kernel),
                                            requires_grad=False)  # fmt: skip

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: Any,
        meta: Any,
        query_scale: torch.Tensor | None,
        decodes: Decodes,
    ) -> torch.Tensor:
        if not self.is_conv:
            return super().attention(x, cos, sin, kv_cache, meta, query_scale, decodes)
        state, step = kv_cache
        b, c, h = apply_linear(self.in_proj, x, decodes).chunk(3, dim=-1)
        mixed = c * self.ops.short_convolution(b * h, self.conv_weight, state, step)
        return apply_linear(self.out_proj, mixed, decodes)


class ConvStateModel(Qwen3Model):
    """A model whose `conv_layers` carry state from step to step in place of KV (LFM2's short
    convolutions, Qwen3.5's DeltaNet layers): each such layer (`is_conv`) is handed its state
    tensor and the step, the others their KV caches."""

    graph_capturable = False  # (each step picks its state rows on the host)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # the KV layers' (`arch.kv_layers`)
        meta: Any,
        logits_indices: torch.Tensor,
        layer_metas: list[Any] | None = None,  # the KV layers', where KV groups differ
        conv_step: Any = None,  # the step's `runner.conv_state.ConvStep`
    ) -> torch.Tensor:
        """LlamaModel's forward, each layer handed its own cache and metadata: a convolution
        layer its state tensor and the step (which reads the KV layers' first metadata, for
        the decode rows its linears tell apart)."""
        if conv_step is None:
            raise ValueError(f"{type(self).__name__}'s forward pass needs the step's "
                             "convolution state")  # fmt: skip
        caches: list[Any] = []
        metas: list[Any] = []
        kv_index = conv_index = 0
        for layer in self.layers:
            if layer.is_conv:
                caches.append((conv_step.states[conv_index], conv_step))
                metas.append(meta)
                conv_index += 1
            else:
                caches.append(kv_caches[kv_index])
                metas.append(layer_metas[kv_index] if layer_metas else meta)
                kv_index += 1
        return super().forward(input_ids, positions, caches, meta, logits_indices, metas)


class Lfm2Model(ConvStateModel):
    layer_class: ClassVar[type[DecoderLayer]] = Lfm2DecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(conv_weights(renamed_weights(weights, _NAMES)))

    def linear_sources(self) -> dict[str, list[str]]:
        """The Llama names of the attention layers' and the MLPs' linears (which the GGUF loader
        gives them too), and each convolution layer's `in_proj` and `out_proj`."""
        sources = super().linear_sources()
        for i in self.cfg.conv_layers:
            del sources[f"layers.{i}.qkv_proj"], sources[f"layers.{i}.o_proj"]
            for name in ("in_proj", "out_proj"):
                sources[f"layers.{i}.{name}"] = [f"model.layers.{i}.{name}.weight"]
        return sources


class Lfm2MoeDecoderLayer(MoEDecoderLayer, Lfm2DecoderLayer):
    """LFM2's layer (a convolution or attention) with experts for its MLP in sparse layers."""


# LFM2-MoE's MLP names, before LFM2's and the experts' loaders read them: its experts' (saved
# one by one, or stacked), its dense MLPs' and its routers' under the names those expect
_MOE_NAMES = {
    r"\.feed_forward\.experts\.(\d+)\.w1\.": r".mlp.experts.\1.gate_proj.",
    r"\.feed_forward\.experts\.(\d+)\.w3\.": r".mlp.experts.\1.up_proj.",
    r"\.feed_forward\.experts\.(\d+)\.w2\.": r".mlp.experts.\1.down_proj.",
    r"\.feed_forward\.w1\.": ".mlp.gate_proj.",
    r"\.feed_forward\.w3\.": ".mlp.up_proj.",
    r"\.feed_forward\.w2\.": ".mlp.down_proj.",
    r"\.feed_forward\.expert_bias$": ".mlp.gate.e_score_correction_bias",
    r"\.feed_forward\.": ".mlp.",
}


class Lfm2MoeModel(MoEModel, Lfm2Model):
    layer_class: ClassVar[type[DecoderLayer]] = Lfm2MoeDecoderLayer
    graph_capturable = False  # (LFM2's: its state rows)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(renamed_weights(weights, _MOE_NAMES))


def conv_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The convolutions' weights [H, 1, kernel] (a folder's) as [H, kernel]."""
    for name, tensor in weights:
        if name.endswith(".conv_weight") and tensor.dim() == 3:
            tensor = tensor.squeeze(1)
        yield name, tensor
