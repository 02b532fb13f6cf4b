"""Qwen3.5 (`Qwen3_5ForCausalLM`, or the language model of a `Qwen3_5ForConditionalGeneration`
folder; GGUF `qwen35`): three gated DeltaNet layers to every attention layer (by default), each
with a SwiGLU MLP; Qwen3.5-MoE (`Qwen3_5MoeForCausalLM`, `Qwen3_5MoeForConditionalGeneration`;
GGUF `qwen35moe`) the same layers with Qwen2-MoE's experts and gated shared expert for MLPs;
Qwen3-Next (`Qwen3NextForCausalLM`, GGUF `qwen3next`) Qwen3.5-MoE's, its projections' rows
grouped otherwise in its checkpoints and files.

A DeltaNet layer is linear attention with a memory that forgets and corrects itself. One
projection makes each token's q, k and v rows (which a causal depthwise convolution over the
last `conv_kernel` positions mixes, then SiLU), a gate z per value head, and two scalars per
value head: beta (how much of the token to write, a sigmoid) and g (how much of the memory to
keep, `-exp(A_log) * softplus(a + dt_bias)`, a log). Each value head's state S [key dim, value
dim] then takes each token in turn:

    S = exp(g) S;    S = S + k (beta (v - S^T k))^T;    o = S^T q

with q and k L2-normalized per head (q divided by sqrt(key dim)), each key head serving
`delta_value_heads / delta_key_heads` value heads (consecutive ones in a checkpoint, every
key-heads-th in a GGUF file: `arch.delta_heads_tiled`). The output is RMS-normalized per
value head, times SiLU(z), and projected back to the residual stream.

The attention layers are Qwen3's with two changes: the query projection makes a gate after
each query head's rows, whose sigmoid multiplies the attention's output before o_proj
(`arch.attention_output_gate`, `llama.split_query_gates`), and RoPE turns only the first
quarter of each head. Every RMSNorm but the DeltaNet output's multiplies by `1 + w`
(checkpoints hold w; the 1 is added at load, as for Gemma).

A DeltaNet layer holds no KV: its convolution's last inputs and its state matrices travel from
step to step in `runner/conv_state.py`'s slots (float32 matrices, as transformers keeps them),
as LFM2's convolutions do (`lfm2.ConvStateModel`). The recurrence runs token by token
(`gated_delta_rule`); where the C++ kernels are loaded, the whole layer between its projections
is one call (`gated_delta_net`: the same ops, rounding where they round, to float32 rounding),
and the layers run in the fused C++ layer loop (`fused_layers.py`; Qwen3.5-MoE's and
Qwen3-Next's where their experts multiply from a file's blocks in a float32 model).
Not built: tensor parallelism over the DeltaNet layers, the multi-token prediction layer
(`mtp.*`, skipped), images.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from inflight.attention import AttentionBackend
from inflight.model.arch import LlamaArchConfig
from inflight.model.gemma import offset_norms
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.lfm2 import ConvStateModel, conv_weights
from inflight.model.llama import DecoderLayer, RMSNorm, renamed_weights
from inflight.model.moe import MoEDecoderLayer, MoEModel
from inflight.model.packed_linear import Decodes, apply_linear
from inflight.model.qwen3 import Qwen3DecoderLayer

# the checkpoint's DeltaNet names -> ours: its input projections fused as attention's are
# (`qkvz_proj`, `ba_proj`), the rest the layer's own
_NAMES = {
    r"\.linear_attn\.conv1d\.weight$": ".conv_weight",
    r"\.linear_attn\.": ".self_attn.",
}
# the one RMSNorm that multiplies by w, not 1 + w
_PLAIN_NORM = ".linear_attn.norm.weight"


def l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each row of x (float32) over its last dimension, as transformers (and FLA) divide."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    states: torch.Tensor, step: Any,
) -> torch.Tensor:  # fmt: skip
    """The gated delta rule over each request's rows, token by token: q, k [T, value heads, key
    dim] (normalized, each key head repeated for its value heads), v [T, value heads, value
    dim], g (log decay) and beta [T, value heads], all float32. Each request's state matrices
    are read from `states` [rows, heads, key dim, value dim] at `step.read_rows` and its last
    written at `step.write_rows` (`runner.conv_state.ConvStep`), and after a token at its
    `step.snapshot_rows` entry where it names a row. Returns o [T, heads, value dim]. The
    requests at the same offset into their rows go together."""
    starts = step.starts
    lengths = torch.tensor([b - a for a, b in itertools.pairwise(starts)])
    first = torch.tensor(starts[:-1])
    state = states[step.read_rows]  # [R, H, K, V] (a copy)
    out = torch.empty_like(v)
    for offset in range(int(lengths.max())):
        live = (lengths > offset).nonzero().squeeze(1)
        rows = (first[live] + offset).to(q.device)
        live = live.to(q.device)
        s = state[live] * g[rows].exp()[..., None, None]
        key = k[rows][..., None]  # [n, H, K, 1]
        remembered = (s * key).sum(dim=-2)  # [n, H, V]
        s = s + key * ((v[rows] - remembered) * beta[rows][..., None])[..., None, :]
        out[rows] = (s * q[rows][..., None]).sum(dim=-2)
        state[live] = s
        if step.snapshot_rows.numel():  # (a speculating request's state after each token)
            snapshots = step.snapshot_rows[rows]
            states[snapshots[snapshots >= 0]] = s[snapshots >= 0]
    states[step.write_rows] = state
    return out


class Qwen3_5DecoderLayer(Qwen3DecoderLayer):
    """Qwen3's attention layer with its output gated, or (`is_conv`) a gated DeltaNet layer in
    its place."""

    # float32 in any model: transformers computes the decay from them in float32
    float32_parameters: ClassVar[tuple[str, ...]] = ("decay_rate", "dt_bias")

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__(cfg, attn, ops, index)
        self.is_conv = index in cfg.conv_layers
        if not self.is_conv:
            return
        del self.qkv_proj, self.o_proj, self.q_norm, self.k_norm
        self.state_index = cfg.conv_layers.index(index)  # (its matrices in `ConvStep.recurrent`)
        self.key_heads, self.key_dim = cfg.delta_key_heads, cfg.delta_key_dim
        self.value_heads, self.value_dim = cfg.delta_value_heads, cfg.delta_value_dim
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        # rows: q, k, v (convolved) and z; b and a (apart: a GGUF file's are often float32
        # beside the others' blocks)
        self.qkvz_proj = nn.Linear(cfg.hidden_size, cfg.conv_width + values, bias=False)
        self.ba_proj = nn.Linear(cfg.hidden_size, 2 * self.value_heads, bias=False)
        self.qkvz_split, self.qkv_split = (cfg.conv_width, values), (keys, keys, values)
        self.conv_weight = nn.Parameter(torch.zeros(cfg.conv_width, cfg.conv_kernel),
                                        requires_grad=False)  # fmt: skip
        self.tiled = cfg.delta_heads_tiled
        self.dt_bias = nn.Parameter(torch.ones(self.value_heads), requires_grad=False)
        # -exp(A_log), float32 (as transformers computes it at every step, as GGUF files hold it)
        self.decay_rate = nn.Parameter(torch.zeros(self.value_heads), requires_grad=False)
        self.norm = RMSNorm(self.value_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(values, cfg.hidden_size, bias=False)

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
        conv_state, step = kv_cache
        qkvz = apply_linear(self.qkvz_proj, x, decodes)
        ba = apply_linear(self.ba_proj, x, decodes)
        states = step.recurrent[self.state_index]
        ext = getattr(self.ops, "ext", None)  # (CpuLayerOps': the whole layer in one call)
        if ext is not None:
            gated = ext.gated_delta_net(
                qkvz, ba, self.conv_weight, conv_state, step.taps, step.keep, step.read_rows,
                step.write_rows, step.snapshot_rows, step.starts, states, self.decay_rate,
                self.dt_bias, self.norm.weight, self.norm.eps, self.key_heads, self.tiled,
            )  # fmt: skip
        else:
            gated = self.delta_net(qkvz, ba, conv_state, states, step)
        return apply_linear(self.out_proj, gated, decodes)

    def delta_net(
        self, qkvz: torch.Tensor, ba: torch.Tensor, conv_state: torch.Tensor,
        states: torch.Tensor, step: Any,
    ) -> torch.Tensor:  # fmt: skip
        """The layer between its projections, [T, q | k | v | z] and [T, b | a] -> [T, value
        heads x value dim] for out_proj, in PyTorch ops (csrc/gated_delta.cpp's
        `gated_delta_net` is this in one C++ call)."""
        t, dtype = qkvz.shape[0], qkvz.dtype
        qkv, z = qkvz.split(self.qkvz_split, dim=-1)
        b, a = ba.chunk(2, dim=-1)
        qkv = F.silu(self.ops.short_convolution(qkv, self.conv_weight, conv_state, step))
        q, k, v = qkv.split(self.qkv_split, dim=-1)
        repeats = self.value_heads // self.key_heads
        q = l2_normalized(q.float().reshape(t, self.key_heads, self.key_dim)) / self.key_dim**0.5
        k = l2_normalized(k.float().reshape(t, self.key_heads, self.key_dim))
        if repeats > 1 and self.tiled:
            q, k = q.repeat(1, repeats, 1), k.repeat(1, repeats, 1)
        elif repeats > 1:
            q, k = q.repeat_interleave(repeats, dim=1), k.repeat_interleave(repeats, dim=1)
        beta = torch.sigmoid(b).float()
        g = self.decay_rate.float() * F.softplus(a.float() + self.dt_bias.float())
        v = v.float().reshape(t, self.value_heads, self.value_dim)
        out = gated_delta_rule(q, k, v, g, beta, states, step).to(dtype)
        normed = self.ops.rms_norm(out.view(-1, self.value_dim), self.norm.weight, self.norm.eps)
        gated = (normed.float() * F.silu(z.float().reshape(-1, self.value_dim))).to(dtype)
        return gated.view(t, -1)


class Qwen3_5Model(ConvStateModel):
    layer_class: ClassVar[type[DecoderLayer]] = Qwen3_5DecoderLayer
    _PROJECTIONS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        **ConvStateModel._PROJECTIONS,
        "qkvz_proj": ("self_attn", ("in_proj_qkv", "in_proj_z")),
        "ba_proj": ("self_attn", ("in_proj_b", "in_proj_a")),
    }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        language = (w for w in weights if not w[0].removeprefix("model.").startswith("mtp."))
        offset = offset_norms(language, unless=_PLAIN_NORM)
        super().load_weights(conv_weights(renamed_weights(_decay_rates(offset), _NAMES)))

    def linear_sources(self) -> dict[str, list[str]]:
        """Each attention layer's q/k/v (the query's rows with its gates') and o, each DeltaNet
        layer's qkvz_proj, ba_proj and out_proj (the checkpoint's names), and the MLPs'."""
        sources = super().linear_sources()
        delta = {"qkvz_proj": ("in_proj_qkv", "in_proj_z"), "ba_proj": ("in_proj_b", "in_proj_a"),
                 "out_proj": ("out_proj",)}  # fmt: skip
        for i in range(self.cfg.num_layers):
            attends = i not in self.cfg.conv_layers
            for name, parts in delta.items():
                sources.pop(f"layers.{i}.{name}", None)
                if not attends:
                    layer = f"model.layers.{i}.linear_attn"
                    sources[f"layers.{i}.{name}"] = [f"{layer}.{p}.weight" for p in parts]
            if not attends:
                del sources[f"layers.{i}.qkv_proj"], sources[f"layers.{i}.o_proj"]
        return sources


class Qwen3_5MoeDecoderLayer(MoEDecoderLayer, Qwen3_5DecoderLayer):
    """Qwen3.5's layer (DeltaNet or gated attention) with Qwen2-MoE's experts for its MLP: a
    softmax router, the chosen renormalized, beside a shared expert under a sigmoid gate."""

    cast_router_weights = True


class Qwen3_5MoeModel(MoEModel, Qwen3_5Model):
    layer_class: ClassVar[type[DecoderLayer]] = Qwen3_5MoeDecoderLayer
    graph_capturable = False  # (each step picks its state rows on the host)


class Qwen3NextModel(Qwen3_5MoeModel):
    """Qwen3-Next (`Qwen3NextForCausalLM`, GGUF `qwen3next`): Qwen3.5-MoE's layers (dense MLPs
    where `mlp_only_layers` or `decoder_sparse_step` say), whose checkpoints group each key
    head's rows of the DeltaNet projections: q, k, its value heads' v and z
    (`in_proj_qkvz`), then their b and a (`in_proj_ba`). Loaded as Qwen3.5's."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_ungrouped_projections(weights, self.cfg))


def _ungrouped_projections(
    weights: Iterable[tuple[str, torch.Tensor]], cfg: LlamaArchConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """Qwen3-Next's `in_proj_qkvz` and `in_proj_ba` (rows grouped by key head: a GGUF file's
    `ssm_ba` too) as Qwen3.5's q/k/v, z, b and a apart, value heads in the same order."""
    heads, key_dim = cfg.delta_key_heads, cfg.delta_key_dim
    per_key = cfg.delta_value_heads // heads  # (value heads a key head serves)
    values = per_key * cfg.delta_value_dim
    for name, tensor in weights:
        if name.endswith(".in_proj_qkvz.weight"):
            prefix = name.removesuffix("qkvz.weight")
            groups = tensor.reshape(heads, 2 * key_dim + 2 * values, -1)
            q, k, v, z = groups.split([key_dim, key_dim, values, values], dim=1)
            rows = [part.reshape(-1, tensor.shape[-1]) for part in (q, k, v, z)]
            yield f"{prefix}qkv.weight", torch.cat(rows[:3])
            yield f"{prefix}z.weight", rows[3]
        elif name.endswith(".in_proj_ba.weight"):
            prefix = name.removesuffix("ba.weight")
            b, a = tensor.reshape(heads, 2 * per_key, -1).split([per_key, per_key], dim=1)
            yield f"{prefix}b.weight", b.reshape(-1, tensor.shape[-1])
            yield f"{prefix}a.weight", a.reshape(-1, tensor.shape[-1])
        else:
            yield name, tensor


def _decay_rates(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each DeltaNet layer's `A_log` as the decay rate -exp(A_log) it stands for (float32)."""
    for name, tensor in weights:
        if name.endswith(".linear_attn.A_log"):
            yield name.replace(".A_log", ".decay_rate"), -tensor.float().exp()
        else:
            yield name, tensor
