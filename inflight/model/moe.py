"""Mixture-of-experts families (`arch.EXPERT_ARCHS`; gpt-oss's and DeepSeek's modules subclass
these): Mixtral and Granite MoE (the Llama layer), Qwen3-MoE, Qwen2-MoE, GLM-4.5 and dots.llm1,
ERNIE 4.5, MiniMax-M2, Hunyuan and OLMoE, whose MLP is a set of experts in every sparse layer. A
router (`gate`) scores each token's experts; its softmax in float32 keeps the
`experts_per_token` best (renormalized with `norm_topk_prob`), and each chosen expert, a SiLU-
gated MLP, adds its output times that weight. GLM-4.5's (and dots.llm1's) and MiniMax-M2's
routers score each expert by a sigmoid instead; they and ERNIE 4.5's choose by their scores plus
a learned bias (within the best groups of experts) and keep their weights and bias in float32
whatever the model's dtype, as transformers and vLLM do (DeepSeek-V3's is GLM-4.5's;
DeepSeek-V2's a float32 softmax without the bias, within the groups whose best score is
highest). A shared expert (Qwen2-MoE's, under a sigmoid gate; GLM-4.5's, ERNIE 4.5's, Hunyuan's,
Granite MoE Shared's) runs on every token beside the routed ones and adds after them. A step's
(token, expert) pairs are grouped by expert (`route`): each expert's linears run once over its
rows, the activation once over all of them, and the outputs add into each token in expert order,
as transformers adds them, so a token's sum never depends on which other tokens share its step.

Each expert's gate and up projections are fused into one weight at load (transformers keeps
them as one [2I, H] slice per expert too); Mixtral's `block_sparse_moe.experts.*.w1/w3/w2` are
read as gate/up/down (MiniMax-M2's too), and Granite's stacks one expert at a time. From a GGUF
file (the families' llama.cpp architectures, or `llama` with experts: Mixtral), each layer's
stacked expert weights arrive one expert at a time (the index slices them), and where they are
blocks the kernels read, each expert's linears multiply from its blocks as any layer's do. Where a
sparse layer's router is float32, without groups, and every expert multiplies from its blocks
(`fused_routing`: LFM2-MoE's and MiniMax-M2's files; in a float32 model, the softmax routers'
families too, whose router is then float32 like the model: Qwen3-MoE, Mixtral, OLMoE, Granite,
Qwen2-MoE, Qwen3.5-MoE...), one C++ call routes and runs its experts (`gguf_routed_experts`: a
token's choice from its row alone, whatever its batch), in the Python layer loop as in the fused
C++ one, which computes only such models' layers (a shared expert's linears beside them).
With the Triton kernels (a GPU) the experts are stacked per layer and routed on the device
(`expert_kernels.py`), so CUDA graphs capture their decode steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from inflight.attention import AttentionBackend
from inflight.kernels import load_extension
from inflight.model.arch import LlamaArchConfig
from inflight.model.hunyuan import HunyuanDecoderLayer, HunyuanModel
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.llama import DecoderLayer, LlamaModel
from inflight.model.packed_linear import Decodes, apply_linear, integer_block_packings
from inflight.model.qwen3 import Qwen3DecoderLayer, Qwen3Model
from inflight.model.rotary_pairs import PairRotaryModel

if TYPE_CHECKING:  # Triton, which the kernels import, only where they run (~0.3 s a process)
    from inflight.model.expert_kernels import ExpertStack


# Tokens of a step that one host-routed pass over the experts takes. All of a 2,048-token prompt
# chunk's expert rows at once (gpt-oss: 4 a token, [gate | up] 5,760 floats each, gathered and
# concatenated) hold about 0.4 GiB; a pass of 256 holds an eighth of it. A token's pairs all fall
# in its pass and add up in the same order, and the GGUF kernels give a row the same bits in
# any batch, so the passes change no value there.
EXPERT_PASS_TOKENS = 256


class Expert(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)


class MoEDecoderLayer(DecoderLayer):
    """Mixtral's layer: Llama's, with experts for its MLP in its sparse layers."""

    # the router's weights cast to the model's dtype before they scale the experts (Qwen3-MoE)
    # or kept in float32 (Mixtral): transformers' order of roundings, each family's own
    cast_router_weights: ClassVar[bool] = False
    # parameters that stay float32 in a model of any dtype (`loader.materialize`): a router's
    # with a score bias, whose biased scores choose among experts by small margins
    float32_parameters: ClassVar[tuple[str, ...]] = ("router_weight", "router_bias")
    # how `route_tokens` scores the `gate`'s logits, as the float32 router (`route_in_float32`,
    # C++ `route_experts`) names it, and whether the gate has a bias (in its logits): what the
    # loader's switch to the float32 router keeps (`gate_routes_in_float32`)
    gate_scoring: ClassVar[str] = "softmax"
    gate_bias: ClassVar[bool] = False

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        self.sparse = index not in cfg.dense_layers
        if not self.sparse:
            return
        del self.gate_up_proj, self.down_proj  # the experts' instead
        self.top_k, self.norm_topk_prob = cfg.experts_per_token, cfg.norm_topk_prob
        self.float32_router = cfg.routes_in_float32
        if self.float32_router:  # float32 weights, and the bias of the scores that choose (the
            # gate's own, in its logits, where `route_tokens` is a softmax of the chosen)
            self.scoring = self.gate_scoring if cfg.router_scoring == "softmax" else "sigmoid"
            self.router_weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size),
                                              requires_grad=False)  # fmt: skip
            biased = cfg.router_score_bias or self.gate_bias
            self.router_bias = (nn.Parameter(torch.empty(cfg.num_experts), requires_grad=False)
                                if biased else None)  # fmt: skip
            self.groups, self.groups_used = cfg.expert_groups, cfg.expert_groups_used
            self.group_by_max = cfg.expert_group_by_max
            self.routed_scale = cfg.routed_scaling_factor
            self.norm_epsilon = cfg.router_norm_epsilon
        else:
            self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)  # the router
        self.experts = nn.ModuleList(
            Expert(cfg.hidden_size, cfg.expert_intermediate_size) for _ in range(cfg.num_experts)
        )
        self.shared_expert = (Expert(cfg.hidden_size, cfg.shared_expert_intermediate_size)
                              if cfg.shared_expert_intermediate_size else None)  # fmt: skip
        self.shared_expert_gate = (nn.Linear(cfg.hidden_size, 1, bias=False)
                                   if cfg.shared_expert_gate else None)  # fmt: skip
        # the experts' weights stacked, where they run on the device (`stack_experts`)
        self.stack: ExpertStack | None = None
        # every expert's packings for the C++ loop (`block_expert_packings`; False: they have
        # none; None: not looked at yet, before the loader has packed them)
        self.block_experts: tuple[list[torch.Tensor], list[torch.Tensor], int] | bool | None = None

    def mlp(self, x: torch.Tensor, decodes: Decodes) -> torch.Tensor:
        if not self.sparse:
            return super().mlp(x, decodes)
        routed = self._routed_experts(x, decodes)
        if self.shared_expert is None:
            return routed
        shared = apply_linear(self.shared_expert.gate_up_proj, x, decodes)
        shared = apply_linear(self.shared_expert.down_proj, self.activation(shared), decodes)
        if self.shared_expert_gate is not None:
            rows = self.shared_gate_rows
            if rows is None:
                gate = torch.sigmoid(apply_linear(self.shared_expert_gate, x, decodes))
            else:
                gate = load_extension().router_sigmoids(x.float().contiguous(), rows).to(x.dtype)
            shared = gate * shared
        return routed + shared

    @property
    def shared_gate_rows(self) -> torch.Tensor | None:
        """The shared expert's gate as a float32 [1, hidden] row for the C++ `router_sigmoids`,
        where the C++ ops run and the gate's weight is floats: a one-output linear through
        oneDNN or MKL sums over hidden in an order set by the batch's size, and ATen's sigmoid
        of a [T, 1] column rounds a row by where it falls (vector lanes or the scalar tail), so
        the gate would give a token other bits in company. None otherwise (on a GPU; a gate
        kept as blocks multiplies as its linear)."""
        rows = getattr(self, "_shared_gate_rows", None)
        if rows is not None or self.shared_expert_gate is None or self.ops.name != "cpu":
            return rows
        weight = getattr(self.shared_expert_gate, "weight", None)
        if weight is None or weight.is_meta or getattr(self.shared_expert_gate, "blocks_only", 0):
            return None
        rows = (weight.to_dense() if weight.is_mkldnn else weight).float().contiguous()
        self._shared_gate_rows: torch.Tensor | None = rows
        return rows

    def _routed_experts(self, x: torch.Tensor, decodes: Decodes) -> torch.Tensor:
        packings = self.expert_packings
        if packings is not None and fused_routing(self):  # the fused C++ loop's call
            gate_up, down, bits = packings
            return load_extension().gguf_routed_experts(
                x.contiguous(), self.router_weight, self.router_bias, self.top_k, self.scoring,
                self.norm_topk_prob, self.norm_epsilon, self.routed_scale, gate_up, down,
                self.experts[0].down_proj.in_features, bits, EXPERT_PASS_TOKENS,
                *self.expert_kernel_extras(),
            )  # fmt: skip
        if self.float32_router:
            weights, chosen = self.route_in_float32(x)
        else:
            weights, chosen = self.route_tokens(apply_linear(self.gate, x, decodes))
        if self.stack is not None:  # on the device, in one launch per linear
            return self._grouped_experts(x, weights, chosen)
        if x.shape[0] <= EXPERT_PASS_TOKENS:
            return self._host_routed_experts(x, weights, chosen)
        out = torch.empty_like(x)
        for a in range(0, x.shape[0], EXPERT_PASS_TOKENS):
            b = a + EXPERT_PASS_TOKENS
            out[a:b] = self._host_routed_experts(x[a:b], weights[a:b], chosen[a:b])
        return out

    @property
    def expert_packings(self) -> tuple[list[torch.Tensor], list[torch.Tensor], int] | None:
        """`block_expert_packings`, looked at once (after the loader has packed the experts)
        and kept in `block_experts`."""
        if self.block_experts is None:
            self.block_experts = block_expert_packings(self) or False
        return self.block_experts if isinstance(self.block_experts, tuple) else None

    def _host_routed_experts(
        self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor
    ) -> torch.Tensor:
        """The experts routed on the host: each chosen expert over its tokens' rows, and each
        token's outputs added in expert order (in one C++ call where every expert multiplies
        from its blocks with the integer kernel: `expert_packings`)."""
        packings = self.expert_packings
        if packings is not None and x.dtype == weights.dtype == torch.float32:
            gate_up, down, bits = packings
            return load_extension().gguf_int_experts(
                x.contiguous(), chosen.contiguous(), weights.contiguous(), gate_up, down,
                self.experts[0].down_proj.in_features, bits, *self.expert_kernel_extras(),
            )  # fmt: skip
        pairs, groups = route(chosen, len(self.experts))
        rows = pairs // self.top_k  # each pair's token
        h = self.activation(expert_linears(self.experts, "gate_up_proj", x[rows], groups))
        h = expert_linears(self.experts, "down_proj", h, groups) * weights.flatten()[pairs, None]
        return torch.zeros_like(x).index_add_(0, rows, h.to(x.dtype))

    def expert_kernel_extras(
        self,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], float, float]:
        """What `gguf_int_experts` takes beside the packings to compute these experts as
        `activation` and their linears do: every expert's [gate | up] and down biases (none
        here) and the clamped SwiGLU's limit and alpha (0: SiLU)."""
        return [], [], 0.0, 0.0

    def route_tokens(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The router's logits [T, E] -> each token's expert weights and experts [T, k]: the
        best `top_k` of a float32 softmax over all experts, renormalized where the family
        says."""
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        if self.cast_router_weights:
            weights = weights.to(logits.dtype)
        return weights, chosen

    def route_in_float32(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GLM-4.5's, ERNIE 4.5's and DeepSeek's router, in float32: each expert's score (a
        sigmoid, or a softmax over all); the `top_k` best scores plus the bias (where there is
        one), among the experts of the `groups_used` groups whose two best biased scores sum
        highest (whose best is highest: DeepSeek-V2's); their unbiased scores as weights
        (renormalized where the family says), times the routed scale. gpt-oss's gate as a
        float32 router (`softmax_of_chosen`): its biased logits' best, softmaxed among themselves.
        [T, hidden] -> weights and experts [T, k]."""
        x32, cpu = x.float().contiguous(), self.ops.name == "cpu"
        if cpu and self.scoring == "sigmoid":  # (ATen's sigmoid rounds a row by where it falls)
            scores = load_extension().router_sigmoids(x32, self.router_weight)
        else:
            # (on a CPU each token's logits in one order of sums, whatever its batch)
            logits = (load_extension().router_logits(x32, self.router_weight) if cpu
                      else x32 @ self.router_weight.t())  # fmt: skip
            if self.scoring == "softmax_of_chosen":
                best, chosen = torch.topk(logits + self.router_bias, self.top_k, dim=-1)
                return torch.softmax(best, dim=-1) * self.routed_scale, chosen
            # (a softmax takes each row alone, in one order)
            scores = (torch.sigmoid(logits) if self.scoring == "sigmoid"
                      else torch.softmax(logits, dim=-1))  # fmt: skip
        choice = scores if self.router_bias is None else scores + self.router_bias
        if self.groups > 1:
            grouped = choice.view(x.shape[0], self.groups, -1)
            group_scores = (grouped.amax(dim=-1) if self.group_by_max
                            else grouped.topk(2, dim=-1).values.sum(dim=-1))  # fmt: skip
            best = group_scores.topk(self.groups_used, dim=-1).indices
            kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
            choice = grouped.masked_fill(~kept[:, :, None], float("-inf")).view_as(choice)
        chosen = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        if self.norm_topk_prob:  # (ERNIE 4.5 clamps the sum at 1e-12: the same for any sum
            # of top-k scores above it; LFM2-MoE adds 1e-6)
            weights = weights / (weights.sum(dim=-1, keepdim=True) + self.norm_epsilon)
        weights = weights * self.routed_scale
        return (weights.to(x.dtype) if self.cast_router_weights else weights), chosen

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """An expert's gated activation of its [gate | up] rows."""
        return self.ops.silu_and_mul(gate_up)

    def _grouped_experts(
        self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor
    ) -> torch.Tensor:
        """The experts by `expert_kernels`: no host synchronisation, so a graph can hold it."""
        from inflight.model.expert_kernels import (
            expert_matmul,
            group_pairs,
            sum_in_expert_order,
            tile_rows,
        )

        stack, num_pairs = self.stack, chosen.numel()
        assert stack is not None
        rows, tile_expert = group_pairs(chosen, len(self.experts), tile_rows(num_pairs))
        h = expert_matmul(x, stack.gate_up, stack.gate_up_bias, rows, tile_expert, num_pairs,
                          self.top_k)  # fmt: skip
        h = expert_matmul(self.activation(h), stack.down, stack.down_bias, rows, tile_expert,
                          num_pairs, 1)  # fmt: skip
        return sum_in_expert_order(h * weights.reshape(-1, 1), chosen, x.dtype)


def block_expert_packings(
    layer: MoEDecoderLayer,
) -> tuple[list[torch.Tensor], list[torch.Tensor], int] | None:
    """Every expert's [gate | up] and down packings for `gguf_int_experts`, and their activation
    bits, where all multiply from their blocks alone with the integer kernel and the layer's
    activation is one the call computes (the C++ kernels' SiLU; gpt-oss's clamped SwiGLU, its
    biases beside: `expert_kernel_extras`); None otherwise (the Python loop runs them)."""
    extras = layer.expert_kernel_extras()
    silu = type(layer).activation is MoEDecoderLayer.activation
    if not (silu or extras[2]) or layer.ops.name != "cpu":
        return None
    biased = bool(extras[0] or extras[1])
    gate_up = integer_block_packings((e.gate_up_proj for e in layer.experts), biased)
    down = integer_block_packings((e.down_proj for e in layer.experts), biased)
    if gate_up is None or down is None or gate_up[1] != down[1]:
        return None
    return gate_up[0], down[0], gate_up[1]


ExpertRuns = list[tuple[int, int, int]]  # (expert, start, end) of each chosen expert's pairs


def route(chosen: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, ExpertRuns]:
    """A step's (token, rank) pairs grouped by expert: their flat indices `t * k + rank` in expert
    order (stable: ascending tokens within an expert), and each chosen expert's (expert, start,
    end) run of them. Adding the pairs' outputs in this order adds each token's in expert order."""
    flat = chosen.flatten()
    pairs = torch.argsort(flat, stable=True)
    groups: ExpertRuns = []
    start = 0
    for e, count in enumerate(torch.bincount(flat, minlength=num_experts).tolist()):
        if count:
            groups.append((e, start, start + count))
            start += count
    return pairs, groups


def expert_linears(
    experts: nn.ModuleList, projection: str, x: torch.Tensor, groups: ExpertRuns
) -> torch.Tensor:
    """Each expert's `projection` over its run of rows of `x` (pairs in `route`'s order), in one
    tensor. The rows are a subset of the step's: none of them is told apart as a decode."""
    parts = [apply_linear(getattr(experts[e], projection), x[a:b], False) for e, a, b in groups]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


class Qwen3MoeDecoderLayer(MoEDecoderLayer, Qwen3DecoderLayer):
    """Qwen3's layer (q/k norms) with experts."""

    cast_router_weights = True


class Qwen2MoeDecoderLayer(MoEDecoderLayer):
    """Qwen2's layer (q/k/v biases) with experts and a gated shared expert."""

    cast_router_weights = True


def gate_routes_in_float32(arch: LlamaArchConfig, layer: type[DecoderLayer]) -> bool:
    """Whether a family's router (`gate`, a linear of the model's dtype: Qwen3-MoE's, Mixtral's,
    OLMoE's, gpt-oss's...) is the float32 router without groups where the model is float32 (the
    loader's choice, for a file whose experts multiply from their blocks): the same scores of
    the same logits (to float32 rounding; `gate_scoring`, the gate's bias in them where it has
    one), so that `fused_routing` routes it in C++ (a token's choice from its own row, whatever
    its batch), and its layers join the fused loop. `layer`: the model's layer class; one that
    routes otherwise than `MoEDecoderLayer.route_tokens` says how in `gate_scoring`."""
    if not arch.num_experts or arch.routes_in_float32 or arch.router_scoring != "softmax":
        return False
    if not (arch.expert_groups == 1 and issubclass(layer, MoEDecoderLayer)):
        return False
    return layer.route_tokens is MoEDecoderLayer.route_tokens or layer.gate_scoring != "softmax"


def fused_routing(layer: MoEDecoderLayer) -> bool:
    """Whether one C++ call routes and runs this sparse layer's experts (`gguf_routed_experts`,
    in the Python layer loop and in the fused C++ one): a float32 router without expert groups
    (whose weights stay float32; a family that casts its router's weights to the model's
    dtype casts nothing in float32), every expert multiplying from its blocks
    (`block_expert_packings`), in a float32 model; a shared expert beside them runs in the
    layer's own linears (`mlp`, and the fused loop the same). Asked once the loader has packed
    the experts (`expert_packings` keeps them)."""
    if not (layer.float32_router and layer.groups == 1):
        return False
    if layer.input_layernorm.weight.dtype != torch.float32 or layer.stack is not None:
        return False
    return layer.expert_packings is not None


class MoEModel(LlamaModel):
    """What a model with experts loads differently: each expert's gate and up fused, and the
    sparse layers' linears (router, experts) in place of an MLP's."""

    @property
    def fusable(self) -> bool:  # type: ignore[override]
        """Whether the fused C++ layer loop computes every layer (`fused_routing`: the sparse
        layers' routing and experts; known once the loader has packed them); the Python loop
        otherwise."""
        return all(fused_routing(layer) for layer in self.layers if layer.sparse)

    @property
    def graph_capturable(self) -> bool:  # type: ignore[override]
        """Routing on the host reads which experts were chosen back (`nonzero().tolist()`),
        which a CUDA graph cannot capture; routing on the device (`stack_experts`) can be."""
        return all(layer.stack is not None for layer in self.layers if layer.sparse)

    def stack_experts(self) -> None:
        """Routes on the device from now on (the Triton kernels of `expert_kernels`)."""
        from inflight.model.expert_kernels import stack_experts

        for layer in self.layers:
            if layer.sparse:
                layer.stack = stack_experts(layer.experts)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_fused_experts(self._renamed(weights)))

    def _renamed(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's names as ours (GLM-4.5's and ERNIE 4.5's shared experts, a float32
        router's weights and score bias), without the multi-token-prediction weights that
        generation does not run: GLM-4.5's layers after the last, ERNIE 4.5's `mtp_*`."""
        n = len(self.layers)
        skipped = range(n, n + self.cfg.extra_checkpoint_layers)
        names = _ROUTER_NAMES if self.cfg.routes_in_float32 else {}
        for name, tensor in weights:
            layer = _LAYER_INDEX.match(name)
            if (layer is not None and int(layer[1]) in skipped) or name.startswith("model.mtp_"):
                continue
            for theirs, ours in _SHARED_AND_ROUTER_NAMES.items():
                name = name.replace(theirs, ours)
            stack = next((s for s in _STACKS if name.endswith(s)), None)
            if stack is not None:  # one expert at a time, each [out, in]
                projection = _STACKS[stack]
                out_rows = {"gate_up_proj": 2 * self.cfg.expert_intermediate_size,
                            "down_proj": self.cfg.hidden_size}[projection]  # fmt: skip
                if tensor.shape[1] != out_rows:  # (Qwen3-VL-MoE's published [E, in, out])
                    tensor = tensor.transpose(1, 2)
                layer_name = name.removesuffix(stack)
                for e, part in enumerate(tensor):
                    yield f"{layer_name}.mlp.experts.{e}.{projection}.weight", part
                continue
            for theirs, ours in names.items():
                if name.endswith(theirs):
                    name = name.removesuffix(theirs) + ours
                    if ours == ".mlp.router_bias":
                        tensor = tensor.flatten()  # (ERNIE 4.5's is [1, E])
            yield name, tensor

    def linear_sources(self) -> dict[str, list[str]]:
        sources = super().linear_sources()
        for i, layer in enumerate(self.layers):
            if not layer.sparse:
                continue
            mlp = f"model.layers.{i}.mlp"
            del sources[f"layers.{i}.gate_up_proj"], sources[f"layers.{i}.down_proj"]
            if not layer.float32_router:  # (a float32 router's weights are no linear's)
                sources[f"layers.{i}.gate"] = [f"{mlp}.gate.weight"]
            if layer.shared_expert is not None:
                shared = f"{mlp}.shared_expert"
                sources[f"layers.{i}.shared_expert.gate_up_proj"] = [
                    f"{shared}.gate_proj.weight",
                    f"{shared}.up_proj.weight",
                ]
                sources[f"layers.{i}.shared_expert.down_proj"] = [f"{shared}.down_proj.weight"]
            if layer.shared_expert_gate is not None:
                sources[f"layers.{i}.shared_expert_gate"] = [f"{mlp}.shared_expert_gate.weight"]
            for e in range(len(layer.experts)):
                expert = f"{mlp}.experts.{e}"
                sources[f"layers.{i}.experts.{e}.gate_up_proj"] = [
                    f"{expert}.gate_proj.weight",
                    f"{expert}.up_proj.weight",
                ]
                sources[f"layers.{i}.experts.{e}.down_proj"] = [f"{expert}.down_proj.weight"]
        return sources


class MixtralModel(MoEModel):
    layer_class = MoEDecoderLayer


class Qwen3MoeModel(MoEModel, Qwen3Model):
    layer_class = Qwen3MoeDecoderLayer


class Qwen2MoeModel(MoEModel):
    layer_class = Qwen2MoeDecoderLayer


class Glm4MoeDecoderLayer(MoEDecoderLayer):
    """GLM-4.5's layer: Llama's (q/k/v biases, RoPE over half of each head, in halves) with a
    sigmoid router and a shared expert in its sparse layers."""


class Glm4MoeQkNormDecoderLayer(Glm4MoeDecoderLayer, Qwen3DecoderLayer):
    """GLM-4.5's layer with per-head q/k norms (`use_qk_norm`: the 355B's)."""


class Glm4MoeModel(MoEModel):
    layer_class = Glm4MoeDecoderLayer


class Glm4MoeQkNormModel(Glm4MoeModel):
    """GLM-4.5 with q/k norms (`registry.model_class` picks it by `use_qk_norm`)."""

    layer_class = Glm4MoeQkNormDecoderLayer


class MiniMaxM2DecoderLayer(MoEDecoderLayer, Qwen3DecoderLayer):
    """MiniMax-M2's layer: Llama's with q/k norms each as wide as all their heads (OLMo 2's, but
    before the sublayers), RoPE over part of each head, and a sigmoid router with a score bias
    in every layer."""


class MiniMaxM2Model(MoEModel, Qwen3Model):
    layer_class = MiniMaxM2DecoderLayer


class OlmoeDecoderLayer(MoEDecoderLayer, Qwen3DecoderLayer):
    """OLMoE's layer: Llama's with q/k norms each as wide as all their heads, and experts in
    every layer."""

    cast_router_weights = True


class OlmoeModel(MoEModel, Qwen3Model):
    layer_class = OlmoeDecoderLayer


class GraniteMoeDecoderLayer(MoEDecoderLayer):
    """Granite's layer (its multipliers are config fields) with experts in every layer, and
    GraniteMoeShared's shared MLP beside them."""

    cast_router_weights = True


class GraniteMoeModel(MoEModel):
    layer_class = GraniteMoeDecoderLayer


class HunyuanMoeDecoderLayer(MoEDecoderLayer, HunyuanDecoderLayer):
    """Hunyuan's layer (q/k norms after RoPE) with experts beside a shared one in every layer."""


class HunyuanMoeModel(MoEModel, HunyuanModel):
    layer_class = HunyuanMoeDecoderLayer


class Ernie45MoeDecoderLayer(MoEDecoderLayer):
    """ERNIE 4.5's layer: Llama's, rotating pairs (reordered at load), with a float32 softmax
    router whose score bias chooses, and shared experts."""

    cast_router_weights = True


class Ernie45MoeModel(MoEModel, PairRotaryModel):
    layer_class = Ernie45MoeDecoderLayer


_MIXTRAL_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MIXTRAL_EXPERT = re.compile(r"(.*\.)block_sparse_moe\.(experts\.\d+)\.(w[123])\.weight")
_EXPERT_PART = re.compile(
    r"(.*\.mlp\.(?:experts\.\d+|shared_expert))\.(gate|up)_proj\.(weight|bias)"
)
_LAYER_INDEX = re.compile(r"(?:model\.)?layers\.(\d+)\.")
# other families' names of a shared expert (GLM-4.5's and ERNIE 4.5's, Hunyuan's) and of a
# router (Hunyuan's) -> Qwen2-MoE's
_SHARED_AND_ROUTER_NAMES = {".mlp.shared_experts.": ".mlp.shared_expert.",
                            ".mlp.shared_mlp.": ".mlp.shared_expert.",
                            ".mlp.gate.wg.": ".mlp.gate.",
                            # Granite's: a fused shared MLP, and its router
                            ".shared_mlp.input_linear.": ".mlp.shared_expert.gate_up_proj.",
                            ".shared_mlp.output_linear.": ".mlp.shared_expert.down_proj.",
                            ".block_sparse_moe.router.layer.": ".mlp.gate."}  # fmt: skip
# experts stacked per layer, gate rows (or columns) first -> one expert's projection: Granite's
# ([E, 2I, H], [E, H, I]) and Qwen3-VL-MoE's (transformers' layout as Granite's, the published
# checkpoints' transposed: [E, H, 2I], [E, I, H])
_STACKS = {".block_sparse_moe.input_linear.weight": "gate_up_proj",
           ".block_sparse_moe.output_linear.weight": "down_proj",
           ".mlp.experts.gate_up_proj": "gate_up_proj",
           ".mlp.experts.down_proj": "down_proj"}  # fmt: skip
# a float32 router's weights and score bias (GLM-4.5's; ERNIE 4.5's bias [1, E]; MiniMax-M2's
# under Mixtral's names) -> ours
_ROUTER_NAMES = {".mlp.gate.weight": ".mlp.router_weight",
                 ".mlp.gate.bias": ".mlp.router_bias",  # (gpt-oss's gate, as the float32 one)
                 ".block_sparse_moe.gate.weight": ".mlp.router_weight",  # (MiniMax-M2's)
                 ".mlp.gate.e_score_correction_bias": ".mlp.router_bias",
                 ".mlp.moe_statics.e_score_correction_bias": ".mlp.router_bias",
                 ".block_sparse_moe.e_score_correction_bias": ".mlp.router_bias"}  # fmt: skip


def _fused_experts(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each expert's gate and up weights (and biases: gpt-oss's) as one `gate_up_proj` (gate
    rows first), under Qwen3-MoE's names (`mlp.gate`, `mlp.experts.E.*`), which the Llama loader
    maps onto the layer as it maps `mlp.*`."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        mixtral = _MIXTRAL_EXPERT.fullmatch(name)
        if mixtral is not None:
            prefix, expert, part = mixtral.groups()
            name = f"{prefix}mlp.{expert}.{_MIXTRAL_NAMES[part]}.weight"
        name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
        if name.endswith(".mlp.shared_expert_gate.weight") and tensor.dim() == 1:
            tensor = tensor[None]  # (a GGUF's holds the gate's one row as a vector)
        match = _EXPERT_PART.fullmatch(name)
        if match is None:
            yield name, tensor
            continue
        expert, part, kind = match.groups()
        parts = pending.setdefault(f"{expert}.gate_up_proj.{kind}", {})
        parts[part] = tensor
        if len(parts) == 2:
            fused = f"{expert}.gate_up_proj.{kind}"
            del pending[fused]
            yield fused, torch.cat([parts["gate"], parts["up"]])
    if pending:
        raise KeyError(f"experts with a gate or an up weight alone: {sorted(pending)}")
