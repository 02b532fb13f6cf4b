"""The decoder layers' forward as one C++ call (`kernels/csrc/decoder_layers.cpp`).

`DecoderLayer.forward` stays the definition; this runs the same op sequence over all layers
without returning to Python between ops. At a few tokens per step the Python-level calls of each
layer (module calls, views, cache writes, row gathers) cost about as much as all attention on a
small model (docs/benchmarks.md, "Figures behind design decisions"). Used only with the C++
kernels (`attention_backend` cpu/auto on a CPU); tested bit for bit against the Python loop.
Beside Llama's layers it runs LFM2's short convolutions, Qwen3.5's gated DeltaNet layers and
gated attention, gpt-oss's attention sinks and biased output projection, and experts a float32
router picks from their blocks (gpt-oss's biased, their SwiGLU clamped), beside a shared expert
where a layer has one.
"""

from __future__ import annotations

from typing import Any

import torch

from inflight.attention.paged_kernels import KernelMetadata
from inflight.kernels import load_extension
from inflight.model.moe import EXPERT_PASS_TOKENS, fused_routing
from inflight.model.packed_linear import PackedLinear
from inflight.parallel.group import TPGroup

_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# a short-convolution layer's (LFM2's) in their places: in_proj for q/k/v, out_proj for o; a
# DeltaNet layer's (Qwen3.5's) q/k/v/z rows for q/k/v (its [b | a] rows passed apart)
_CONV_PROJECTIONS = ("in_proj", "out_proj", "gate_up_proj", "down_proj")
_DELTA_PROJECTIONS = ("qkvz_proj", "out_proj", "gate_up_proj", "down_proj")


def _is_conv(layer: torch.nn.Module) -> bool:
    return getattr(layer, "is_conv", False)


def _is_delta(layer: torch.nn.Module) -> bool:
    return _is_conv(layer) and hasattr(layer, "qkvz_proj")


def _is_sparse(layer: torch.nn.Module) -> bool:
    return getattr(layer, "sparse", False)


def _projections(layer: torch.nn.Module) -> list[torch.nn.Module]:
    """The layer's linears, in the loop's order (a sparse layer's two first alone: its experts
    take the MLP's place)."""
    names = (_DELTA_PROJECTIONS if _is_delta(layer) else _CONV_PROJECTIONS if _is_conv(layer)
             else _PROJECTIONS)  # fmt: skip
    return [getattr(layer, p) for p in names[: 2 if _is_sparse(layer) else 4]]


def _shared_linears(layer: torch.nn.Module) -> tuple[torch.nn.Module | None, ...]:
    """A sparse layer's shared expert's [gate | up] and down, and its output's gate (None where
    it has none); none of them for another layer."""
    if not _is_sparse(layer):
        return ()
    expert = layer.shared_expert
    pair = (None, None) if expert is None else (expert.gate_up_proj, expert.down_proj)
    return (*pair, layer.shared_expert_gate)


def _shared_tensors(
    layer: torch.nn.Module, linear: torch.nn.Module | None
) -> tuple[torch.Tensor | None, ...]:
    """One of a shared expert's linears as the loop takes it: its weight, small-batch and decode
    weights; a gate of float weights as its float32 row alone (`shared_gate_rows`, which the
    loop scores as the Python layer does); nothing where the layer has no such linear."""
    if linear is None:
        return (None, None, None)
    if linear is layer.shared_expert_gate and layer.shared_gate_rows is not None:
        return (layer.shared_gate_rows, None, None)
    return (linear.weight, _small(linear, "small_weight"), _small(linear, "decode_weight"))


def _indices_among(layers: torch.nn.ModuleList, chosen: list[bool]) -> list[int]:
    """Each layer's index among the chosen ones (-1 for the others); none where none is."""
    if not any(chosen):
        return []
    count = iter(range(len(layers)))
    return [next(count) if c else -1 for c in chosen]


def _small(linear: torch.nn.Module | None, name: str) -> torch.Tensor | None:
    return None if linear is None else getattr(linear, name, None)


class FusedDecoderLayers:
    """Flat lists of every layer's weights (taken after packing: build it last) and the C++
    `DecoderLayers` built from them once (`run`); each call passes a step's inputs alone."""

    def __init__(self, layers: torch.nn.ModuleList, tp: TPGroup | None = None) -> None:
        """`tp`: the ranks a split model's layers sum their output and down projections over."""
        deltas = [layer for layer in layers if _is_delta(layer)]
        projections = [p for layer in layers for p in _projections(layer)]
        projections += [layer.ba_proj for layer in deltas]
        projections += [m for layer in layers for m in _shared_linears(layer) if m is not None]
        kinds = {type(m) for m in projections}
        if len(kinds) != 1:
            raise ValueError(f"projections must be all packed or all plain, got {kinds}")
        self.packed = kinds == {PackedLinear}
        # every layer's four slots (a sparse layer's MLP slots empty)
        slots = [[*_projections(layer), None, None][:4] for layer in layers]
        # the small-batch kernels' weights (bf16 packings or GGUF blocks), used up to
        # `small_batch_rows` rows as PackedLinear does
        self.small_weights = [_small(m, "small_weight") for four in slots for m in four]
        rows = {
            m.small_batch_rows for m in projections if getattr(m, "small_weight", None) is not None
        }
        if len(rows) > 1:
            raise ValueError(f"projections must share one small-batch row limit, got {rows}")
        self.small_batch_rows = rows.pop() if rows else 0
        # the layers' GGUF blocks for the decode rows (see PackedLinear), or none at all
        decode = [_small(m, "decode_weight") for four in slots for m in four]
        self.decode_weights = decode if any(w is not None for w in decode) else []
        self.activation_bits = max(getattr(m, "activation_bits", 0) for m in projections)
        first = layers[0]
        self.pre_norms = first.pre_norms  # (a model's layers share their class)
        unread = torch.empty(0)  # where a layer has no pre-norms
        self.weights = [
            w
            for layer in layers
            for w in (
                layer.input_layernorm.weight if self.pre_norms else unread,
                _projections(layer)[0].weight,
                _projections(layer)[1].weight,
                layer.mlp_norm.weight if self.pre_norms else unread,
                unread if _is_sparse(layer) else layer.gate_up_proj.weight,
                unread if _is_sparse(layer) else layer.down_proj.weight,
            )
        ]
        self._experts(layers)
        # LFM2's short convolutions: each layer's index among them (-1: it attends), their
        # kernels; a convolution layer's q/k norms and caches are placeholders, never read
        self.conv_index = _indices_among(layers, [_is_conv(layer) for layer in layers])
        self.conv_weights = [layer.conv_weight for layer in layers if _is_conv(layer)]
        # Qwen3.5's DeltaNet layers (their index among the convolutions'): each one's [b | a]
        # projection, decay rates, dt bias and output norm, [b | a]'s small-batch and decode
        # weights; its attention's output gate
        self.delta_tensors = [t for layer in deltas for t in (layer.ba_proj.weight,
                              layer.decay_rate, layer.dt_bias, layer.norm.weight)]  # fmt: skip
        self.delta_small = [_small(layer.ba_proj, name) for layer in deltas
                            for name in ("small_weight", "decode_weight")]  # fmt: skip
        if deltas and len(deltas) != len(self.conv_weights):
            raise ValueError("the fused layer loop takes convolution or DeltaNet layers, not both")
        first_delta = deltas[0] if deltas else None
        self.delta_heads = {
            "delta_key_heads": first_delta.key_heads if first_delta else 0,
            "delta_tiled": first_delta.tiled if first_delta else False,
        }
        attending = next(layer for layer in layers if not _is_conv(layer))
        self.output_gate = attending.output_gate
        self.qkv_biases = [None if _is_conv(layer) else layer.qkv_proj.bias for layer in layers]
        self.o_biases = [_projections(layer)[1].bias for layer in layers]
        self.sinks = [None if _is_conv(layer) else layer.sinks for layer in layers]  # (gpt-oss)
        # a family's per-head query and key norms (Qwen3's), in layer order, or none
        self.qk_norms = [
            norm.weight
            for layer in layers
            if hasattr(attending, "q_norm")
            for norm in (
                (attending.q_norm, attending.k_norm) if _is_conv(layer)
                else (layer.q_norm, layer.k_norm)
            )
        ]  # fmt: skip
        self.shape = (first.num_heads, first.num_kv_heads, first.head_dim)
        # a model's layers share their class and config: its activation and its score scale
        self.gelu, self.squared_relu = first.gelu, first.squared_relu
        self.qk_norm_after_rope = first.qk_norm_after_rope
        self.scale = first.head_dim**-0.5 if first.scale is None else first.scale
        self.residual_scale = first.residual_scale
        self.softcap = first.softcap or 0.0  # of the scores; 0: none
        self.eps = first.post_attention_layernorm.eps  # (every norm of a model shares it)
        # a family's norms of the attention's and the MLP's outputs (Gemma 3's), or none
        self.output_norms = [
            norm.weight for layer in layers if layer.output_norms for norm in layer.output_norms
        ]
        self.windows = [layer.window or 0 for layer in layers]  # 0: none
        # each layer's RoPE: -1 none, 0 the model's tables, 1 the windowed layers' own (`local`)
        self.rotations = [-1 if not layer.rotary else int(layer.local_rope) for layer in layers]
        self.all_reduce = None if tp is None else tp.all_reduce
        # q/k norms over every head of a split model (OLMo 2's): the whole model's query and KV
        # heads and this rank's place, to gather the ranks' heads (`Qwen3DecoderLayer`'s)
        whole = getattr(attending, "norm_heads", (0, 0))
        self.whole_qk_norms = [*whole, tp.rank, tp.size] if whole[0] and tp is not None else []
        self.run = load_extension().DecoderLayers(**self.model_args())

    def model_args(self) -> dict[str, Any]:
        """The keywords `DecoderLayers` (csrc/decoder_layers.h) is built from: the lists above."""
        num_heads, num_kv_heads, head_dim = self.shape
        return dict(
            weights=self.weights, small_weights=self.small_weights,
            decode_weights=self.decode_weights, small_rows=self.small_batch_rows,
            qkv_biases=self.qkv_biases, o_biases=self.o_biases, sinks=self.sinks,
            qk_norms=self.qk_norms, output_norms=self.output_norms, num_heads=num_heads,
            num_kv_heads=num_kv_heads, head_dim=head_dim, eps=self.eps, scale=self.scale,
            windows=self.windows, rotations=self.rotations, pre_norms=self.pre_norms,
            qk_norm_after_rope=self.qk_norm_after_rope, gelu=self.gelu,
            squared_relu=self.squared_relu, packed=self.packed,
            activation_bits=self.activation_bits, residual_scale=self.residual_scale,
            softcap=self.softcap, all_reduce=self.all_reduce, conv_index=self.conv_index,
            conv_weights=self.conv_weights, expert_index=self.expert_index,
            routers=self.routers, router_biases=self.router_biases,
            expert_gate_up=self.expert_gate_up, expert_down=self.expert_down,
            expert_gate_up_bias=self.expert_biases[0], expert_down_bias=self.expert_biases[1],
            **self.routing, shared_experts=self.shared_experts, output_gate=self.output_gate,
            delta_tensors=self.delta_tensors, delta_small=self.delta_small, **self.delta_heads,
            whole_qk_norms=self.whole_qk_norms,
        )  # fmt: skip

    def _experts(self, layers: torch.nn.ModuleList) -> None:
        """The sparse layers' routers and expert packings (`moe.fused_routing` says which layers
        the loop can route), and their shared settings."""
        sparse = [layer for layer in layers if _is_sparse(layer)]
        self.expert_index = _indices_among(layers, [_is_sparse(layer) for layer in layers])
        self.routers = [layer.router_weight for layer in sparse]
        self.router_biases = [layer.router_bias for layer in sparse]
        if not all(fused_routing(layer) for layer in sparse):
            raise ValueError("the fused layer loop routes experts through a float32 router, "
                             "each multiplying from its blocks (`moe.fused_routing`)")  # fmt: skip
        shared = [(layer, m) for layer in sparse for m in _shared_linears(layer)]
        self.shared_experts = [
            t for layer, m in shared for t in _shared_tensors(layer, m)
        ] if any(m is not None for _, m in shared) else []  # fmt: skip
        packings = [layer.expert_packings for layer in sparse]
        self.expert_gate_up = [p[0] for p in packings]
        self.expert_down = [p[1] for p in packings]
        # gpt-oss's: each expert's biases, and the clamped SwiGLU's limit and alpha (0: SiLU)
        extras = [layer.expert_kernel_extras() for layer in sparse]
        self.expert_biases = [[e[0] for e in extras], [e[1] for e in extras]]
        first = sparse[0] if sparse else None  # (a model's sparse layers share their config)
        self.routing = {
            "top_k": first.top_k if first else 1,
            "router_scoring": first.scoring if first else "softmax",
            "renormalize": first.norm_topk_prob if first else False,
            "router_eps": first.norm_epsilon if first else 0.0,
            "routed_scale": first.routed_scale if first else 1.0,
            "expert_intermediate": first.experts[0].down_proj.in_features if first else 0,
            "expert_bits": packings[0][2] if first else 0,
            "expert_pass_tokens": EXPERT_PASS_TOKENS,
            "swiglu_limit": extras[0][2] if first else 0.0,
            "swiglu_alpha": extras[0][3] if first else 0.0,
        }

    def __call__(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        local: tuple[torch.Tensor, torch.Tensor] | None,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: KernelMetadata,
        layer_metas: list[KernelMetadata] | None = None,
        query_scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(last layer's MLP output, residual stream), as the Python loop returns them;
        `local`: the windowed layers' cos and sin where their RoPE is their own; `layer_metas`:
        each layer's, where KV groups give layers other tables than `meta`'s (group 0's);
        `query_scale`: each query's temperature [T, 1] (`LlamaModel.query_temperature`)."""
        decode, prefill = meta.decode_batch, meta.prefill_batch
        local_cos, local_sin = local or (None, None)
        groups: list[KernelMetadata] = []  # the groups after the first, in order
        number = {id(meta): 0}
        for layer_meta in layer_metas or ():
            if id(layer_meta) not in number:
                number[id(layer_meta)] = len(groups) + 1
                groups.append(layer_meta)
        layer_groups = [number[id(layer_meta)] for layer_meta in layer_metas or ()]
        conv_states: list[torch.Tensor] = []
        conv_rows: list[torch.Tensor] = []
        delta_states: list[torch.Tensor] = []
        starts: list[int] = []
        if self.conv_index:  # (a convolution layer's "cache" is its state and the step)
            pairs = list(zip(self.conv_index, kv_caches, strict=True))
            step = next(kv for c, kv in pairs if c >= 0)[1]
            conv_states = step.states
            conv_rows = [step.taps, step.keep, step.read_rows, step.write_rows,
                         step.snapshot_rows]  # fmt: skip
            delta_states, starts = step.recurrent, step.starts
            placeholder = next(kv for c, kv in pairs if c < 0)
            kv_caches = [placeholder if c >= 0 else kv for c, kv in pairs]
        hidden, residual = self.run(
            hidden, residual=None, cos=cos, sin=sin, local_cos=local_cos,
            local_sin=local_sin, query_scale=query_scale, k_caches=[k for k, _ in kv_caches],
            v_caches=[v for _, v in kv_caches], slot_mapping=meta.slot_mapping,
            decode_rows=decode and decode.rows, decode_tables=decode and decode.block_tables,
            decode_lens=decode and decode.seq_lens,
            decode_all_rows=decode is not None and decode.all_rows,
            prefill_chunks=prefill and prefill.chunks,
            prefill_tables=prefill and prefill.block_tables, layer_groups=layer_groups,
            group_slots=[g.slot_mapping for g in groups],
            group_decode_tables=[g.decode_batch.block_tables for g in groups
                                 if g.decode_batch is not None],
            group_prefill_tables=[g.prefill_batch.block_tables for g in groups
                                  if g.prefill_batch is not None],
            conv_states=conv_states, conv_rows=conv_rows, delta_states=delta_states,
            delta_starts=starts,
        )  # fmt: skip
        return hidden, residual
