"""Llama-family decoder over a flat batch: RMSNorm, RoPE, GQA attention over paged KV, gated MLP.

One forward takes every scheduled token of every request as one `[T]` row (no padding, no batch
dimension); attention reads earlier tokens through the KV cache. Logits are computed only at
`logits_indices`, the last token of each request that samples this step.

Weights arrive with Hugging Face names (`load_weights`); q/k/v and gate/up are fused into one
matmul each at load time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from inflight.attention import AttentionBackend
from inflight.errors import ConfigError
from inflight.model.arch import LlamaArchConfig
from inflight.model.layer_ops import TorchLayerOps
from inflight.model.packed_linear import Decodes, apply_linear
from inflight.parallel.group import TPGroup


def decode_rows(meta: Any) -> Decodes:
    """Which of the step's rows are decodes, by the attention metadata of the paged kernels
    (the only backends whose linears tell decodes apart)."""
    batch = getattr(meta, "decode_batch", None)
    if batch is None:
        return False
    return True if batch.all_rows else batch.rows


def rope_inv_freq(cfg: LlamaArchConfig, local: bool = False, long: bool = False) -> torch.Tensor:
    """Inverse frequencies [rope_dim / 2], with llama3, linear, YaRN or LongRoPE scaling applied
    (its long factors with `long`); `local`: those of the sliding-window layers where their base
    differs (`local_rope_theta`, never scaled)."""
    d = cfg.rope_dim
    # NOTE: float32 throughout, exactly as transformers computes it, for token-level parity.
    # on the CPU even while the model is built on the meta device (whose versions of these ops
    # import torch._dynamo, seconds of start-up); the device's copy is made once loaded
    exponents = torch.arange(0, d, 2, dtype=torch.int64, device="cpu").float() / d
    if local:
        assert cfg.local_rope_theta is not None
        return 1.0 / (cfg.local_rope_theta**exponents)
    scaling = cfg.rope_scaling_dict
    kind = scaling.get("rope_type", "default")
    if kind == "longrope":  # (transformers' order of operations, for its roundings)
        factors = cfg.rope_long_factors if long else cfg.rope_freq_factors
        divisors = torch.tensor(factors, dtype=torch.float32, device="cpu")
        return 1.0 / (divisors * cfg.rope_theta**exponents)
    if kind == "yarn":
        return _yarn_inv_freq(cfg.rope_theta, d, scaling)
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    if cfg.rope_freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(cfg.rope_freq_factors, dtype=torch.float32, device="cpu")
    return inv_freq


def _yarn_inv_freq(base: float, d: int, scaling: dict[str, Any]) -> torch.Tensor:
    """YaRN: each frequency between its extrapolated (as trained) and interpolated (divided by
    `factor`) value, by a linear ramp over the dimensions whose wavelengths fit between
    `beta_fast` and `beta_slow` rotations of the original context (transformers' arithmetic,
    for its roundings)."""
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]

    def dimension(rotations: float) -> float:
        return (d * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = dimension(scaling["beta_fast"]), dimension(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # (no zero width)
    ramp = (torch.arange(d // 2, dtype=torch.float32, device="cpu") - low) / (high - low)
    extrapolation = 1 - ramp.clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, d, 2, device="cpu").to(torch.float) / d)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    return interpolated * (1 - extrapolation) + extrapolated * extrapolation


def _rotation(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, rope_dim / 2] in `dtype` of each position's angles, times `scale`
    (LongRoPE's attention factor) in float32 first, as transformers rounds them."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def gated_mlp(
    mlp: nn.Module, x: torch.Tensor, decodes: Decodes, ops: TorchLayerOps, gelu: bool = False
) -> torch.Tensor:
    """SiLU (or tanh-GELU) of the gate times up, projected down: `mlp`'s `gate_up_proj` (rows
    [gate | up]) and `down_proj`, a layer's or an expert's."""
    gate_up = apply_linear(mlp.gate_up_proj, x, decodes)
    x = ops.gelu_tanh_and_mul(gate_up) if gelu else ops.silu_and_mul(gate_up)
    return apply_linear(mlp.down_proj, x, decodes)


class RMSNorm(nn.Module):
    """Holds the weight and eps; the arithmetic is the layer ops' (`rms_norm`, `add_rms_norm`)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps


class DecoderLayer(nn.Module):
    gelu: ClassVar[bool] = False  # the MLP's gate: tanh-GELU (Gemma's) rather than SiLU
    # RMSNorms before attention and before the MLP (Llama's); a family that normalizes only
    # their outputs (`output_norms`: EXAONE 4's) has none, and each sublayer reads the residual
    # stream as it is
    pre_norms: ClassVar[bool] = True
    # an MLP without a gate: ReLU squared of the up projection (Arcee's), which then holds only
    # up's rows in `gate_up_proj`
    squared_relu: ClassVar[bool] = False
    # the q/k norms (`normalize_qk`) applied to the rotated queries and keys (Hunyuan's), not
    # before RoPE (Qwen3's)
    qk_norm_after_rope: ClassVar[bool] = False
    # the ranks this layer is split over (parallel/): o's and down's outputs are partial sums
    tp: TPGroup | None = None

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps, index: int
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.window = cfg.layer_window(index)  # None: attends to every earlier position
        self.scale = cfg.attention_scale  # None: head_dim ** -0.5
        self.softcap = cfg.attn_logit_softcapping  # of the scores (Gemma 2's); None: none
        # what attention's and the MLP's outputs are multiplied by before each joins the
        # residual stream (Granite's residual_multiplier; 1 elsewhere)
        self.residual_scale = cfg.residual_multiplier
        self.rotary = cfg.layer_rotary(index)  # False: no RoPE at all (SmolLM3's NoPE layers)
        # rotated by the sliding-window layers' own RoPE (the model's `local_inv_freq`)
        self.local_rope = cfg.local_rope_theta is not None and self.window is not None
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        # the attention's output multiplied by the sigmoid of a gate, whose rows follow each
        # query head's in the fused projection (Qwen3.5's)
        self.output_gate = cfg.attention_output_gate
        rows = q_size * (2 if self.output_gate else 1) + 2 * kv_size
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv_proj = nn.Linear(cfg.hidden_size, rows, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=cfg.o_bias)
        # gpt-oss's learned logit per head in each softmax's denominator; None: no sink
        self.sinks = (nn.Parameter(torch.zeros(cfg.num_heads), requires_grad=False)
                      if cfg.attention_sinks else None)  # fmt: skip
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.attn = attn
        self.ops = ops

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]: the previous layer's output (or the embeddings)
        residual: torch.Tensor | None,  # [T, hidden]: the residual stream before `hidden`
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: Any,  # the attention backend's own
        query_scale: torch.Tensor | None = None,  # [T, 1]: each query's temperature, or none
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream it is to be added to): each
        residual add is fused into the RMSNorm that follows it (without pre-norms, done in
        place), the last into the model's."""
        ops = self.ops
        decodes = decode_rows(meta)
        if not self.pre_norms:
            residual = hidden if residual is None else residual.add_(hidden)
            x = residual
        elif residual is None:
            residual = hidden
            x = ops.rms_norm(hidden, self.input_layernorm.weight, self.input_layernorm.eps)
        else:
            norm = self.input_layernorm
            x = ops.add_rms_norm(hidden, residual, norm.weight, norm.eps)
        x = self.attention(x, cos, sin, kv_cache, meta, query_scale, decodes)
        if self.tp is not None:
            x = self.tp.all_reduce(x)
        after_attention, after_mlp = self.output_norms or (None, None)
        if after_attention is not None:
            x = ops.rms_norm(x, after_attention.weight, after_attention.eps)
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        if self.pre_norms:
            norm = self.mlp_norm
            x = self.mlp(ops.add_rms_norm(x, residual, norm.weight, norm.eps), decodes)
        else:
            x = self.mlp(residual.add_(x), decodes)
        if self.tp is not None:
            x = self.tp.all_reduce(x)
        if after_mlp is not None:
            x = ops.rms_norm(x, after_mlp.weight, after_mlp.eps)
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        return x, residual

    def attention(
        self,
        x: torch.Tensor,  # [T, hidden]: the normalized input
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: Any,
        query_scale: torch.Tensor | None,
        decodes: Decodes,
    ) -> torch.Tensor:
        """The attention sublayer through its output projection [T, hidden] (a rank's partial
        sum under tensor parallelism): q/k/v, RoPE, attention over the paged KV (times the
        sigmoid of its gate, where it has one), o. A family whose attention is another kind
        (DeepSeek's latent attention) overrides it."""
        t, ops = x.shape[0], self.ops
        qkv = apply_linear(self.qkv_proj, x, decodes)
        gate = None
        if self.output_gate:
            qkv, gate = split_query_gates(qkv, self.num_heads, self.head_dim)
        if not self.qk_norm_after_rope:
            qkv = self.normalize_qk(qkv)
        if self.rotary:  # q and k
            ops.rope_(qkv, cos, sin, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.qk_norm_after_rope:
            qkv = self.normalize_qk(qkv)
        if query_scale is not None:  # (the C++ loop multiplies by the same op)
            qkv[:, : self.split[0]].mul_(query_scale)
        q, k, v = qkv.split(self.split, dim=-1)
        attn = self.attn.forward(
            q.view(t, self.num_heads, self.head_dim),
            k.view(t, self.num_kv_heads, self.head_dim),
            v.view(t, self.num_kv_heads, self.head_dim),
            kv_cache[0],
            kv_cache[1],
            meta,
            self.window,
            self.scale,
            self.softcap,
            self.sinks,
        )  # [T, H, D]
        out = attn.reshape(t, -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return apply_linear(self.o_proj, out, decodes)

    def mlp(self, x: torch.Tensor, decodes: Decodes) -> torch.Tensor:
        """The layer's gated MLP (or ReLU squared without a gate); a family with experts routes
        each token through its own (`moe.py`)."""
        if self.squared_relu:
            up = apply_linear(self.gate_up_proj, x, decodes)
            return apply_linear(self.down_proj, torch.square(torch.relu(up)), decodes)
        return gated_mlp(self, x, decodes, self.ops, self.gelu)

    @property
    def mlp_norm(self) -> RMSNorm:
        """The RMSNorm before the MLP (Llama's checkpoints name it post_attention_layernorm)."""
        return self.post_attention_layernorm

    @property
    def output_norms(self) -> tuple[RMSNorm, RMSNorm] | None:
        """RMSNorms of the attention's and the MLP's outputs, before each joins the residual
        stream, where the family has them (Gemma); None."""
        return None

    def normalize_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        """The fused q/k/v projection before RoPE: as it is here; a family that normalizes its
        query and key heads does it in its override."""
        return qkv


def split_query_gates(
    qkv: torch.Tensor, num_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated attention's projection [T, heads x (query, gate) | k | v] (the checkpoint's
    rows, a GGUF file's blocks, as they are) as q/k/v [T, q | k | v] and the gates [T, q]."""
    t, q_size = qkv.shape[0], num_heads * head_dim
    pairs = qkv[:, : 2 * q_size].view(t, num_heads, 2, head_dim)
    gate = pairs[:, :, 1].reshape(t, q_size)
    return torch.cat([pairs[:, :, 0].reshape(t, q_size), qkv[:, 2 * q_size :]], dim=1), gate


def renamed_weights(
    weights: Iterable[tuple[str, torch.Tensor]], names: dict[str, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights with each of a family's checkpoint names (regular expressions, applied in
    order) replaced by ours."""
    rules = [(re.compile(theirs), ours) for theirs, ours in names.items()]
    for name, tensor in weights:
        for pattern, ours in rules:
            name = pattern.sub(ours, name)
        yield name, tensor


# an image-and-text folder's parts that are not its language model
_VISION_PARTS = ("vision_tower.", "multi_modal_projector.", "visual.")


def language_model_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights under a text-only model's names: an image-and-text folder's (Gemma 3's,
    Mistral 3's) `language_model.` ones with that prefix taken off, its vision parts left out;
    any other folder's as they are."""
    for name, tensor in weights:
        if name.removeprefix("model.").startswith(_VISION_PARTS):
            continue
        yield (
            name.removeprefix("language_model.").replace("model.language_model.", "model."),
            tensor,
        )


def _fused_parts(
    projections: dict[str, tuple[str, tuple[str, ...]]],
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """`LlamaModel._FUSED` of a `_PROJECTIONS` table."""
    return {
        part: (fused, parts)
        for fused, (_, parts) in projections.items()
        if parts != (fused,)
        for part in parts
    }


class LlamaModel(nn.Module):
    layer_class: ClassVar[type[DecoderLayer]] = DecoderLayer
    # the C++ layer loop (model/fused_layers.py) computes this family's layers; where it does
    # not, what of theirs it lacks (for the log)
    fusable: ClassVar[bool] = True
    unfused_because: ClassVar[str] = "their experts"
    # a forward pass with no host synchronisation, so a CUDA graph can capture its decode steps
    graph_capturable: ClassVar[bool] = True
    # a family's checkpoint names (regular expressions, applied in order) -> Llama's, which the
    # loader renames before a rank cuts its share (`parallel/shard.py` knows Llama's names)
    checkpoint_names: ClassVar[dict[str, str]] = {}
    # the ranks the model is split over (parallel/): this one holds a slice of every
    # vocabulary row, head and MLP column (`cfg` is its share's shape)
    tp: TPGroup | None = None

    def __init__(
        self, cfg: LlamaArchConfig, attn: AttentionBackend, ops: TorchLayerOps | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.ops = ops or TorchLayerOps()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            self.layer_class(cfg, attn, self.ops, i) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.local_inv_freq: torch.Tensor | None = None  # set in finish_init where it differs
        self.long_rope: bool | None = None  # LongRoPE's side, once an engine fixed it
        self.rope_attention_factor = cfg.rope_attention_factor  # (read once, not every step)
        # The same layers as one C++ call (model/fused_layers.py), set by the loader when the
        # C++ kernels are in use; None runs the Python loop below.
        self.fused_layers: Callable | None = None
        self.finish_init()

    def finish_init(self) -> None:
        """(Re)ties embeddings and rebuilds buffers; needed again once the loader has replaced the
        meta tensors (`loader.materialize`)."""
        if self.cfg.tie_word_embeddings and self.lm_head.weight is not None:  # else: blocks
            self.lm_head.weight = self.embed_tokens.weight
        device = self.norm.weight.device
        self.inv_freq = rope_inv_freq(self.cfg, long=self.long_rope is True).to(device)
        if self.cfg.local_rope_theta is not None:
            self.local_inv_freq = rope_inv_freq(self.cfg, local=True).to(device)
        for p in self.parameters():
            p.requires_grad_(False)

    def fit_rope_to(self, max_model_len: int) -> None:
        """LongRoPE's long factors where sequences may run past the original context, its short
        ones otherwise: llama.cpp's choice by context size, which rotates every position of
        every sequence one way, whatever its batch (transformers switches a whole sequence to
        the long factors once it passes the original context; vLLM a whole batch). Engines
        sharing the loaded model must agree (ConfigError otherwise)."""
        original = self.cfg.rope_scaling_dict.get("original_max_position_embeddings")
        if self.cfg.rope_long_factors is None or original is None:
            return
        long = max_model_len > original
        if self.long_rope is not None and self.long_rope != long:
            raise ConfigError(f"this loaded model rotates with LongRoPE's "
                              f"{'long' if self.long_rope else 'short'} factors, fixed by an "
                              f"engine beside this one; max_model_len {max_model_len} needs the "
                              f"other ones (the original context is {original})")  # fmt: skip
        self.long_rope = long
        self.inv_freq.copy_(rope_inv_freq(self.cfg, long=long))  # in place: graphs read it

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: Any,  # the attention backend's own
        logits_indices: torch.Tensor,  # [S]
        layer_metas: list[Any] | None = None,  # each layer's, where KV groups differ
    ) -> torch.Tensor:
        """Returns logits [S, vocab] in the model's dtype for the tokens at `logits_indices`
        (the sampler converts to float32 only when it needs more than an argmax); an embedding
        model (`cfg.pooling`), its final hidden states there [S, hidden] instead."""
        hidden = self.embed(input_ids)
        cos, sin = _rotation(positions, self.inv_freq, hidden.dtype, self.rope_attention_factor)
        local = None  # the windowed layers' own rotation, where their base differs
        if self.local_inv_freq is not None:
            local = _rotation(positions, self.local_inv_freq, hidden.dtype)
        query_scale = self.query_temperature(positions, hidden.dtype)
        residual = None
        metas = layer_metas or [meta] * len(self.layers)
        if self.fused_layers is not None:
            hidden, residual = self.fused_layers(hidden, cos, sin, local, kv_caches, meta,
                                                 layer_metas, query_scale)  # fmt: skip
        else:
            for layer, kv_cache, layer_meta in zip(self.layers, kv_caches, metas, strict=True):
                rotation = local if layer.local_rope and local is not None else (cos, sin)
                hidden, residual = layer(hidden, residual, *rotation, kv_cache, layer_meta,
                                         query_scale)  # fmt: skip
        hidden, w, eps = hidden[logits_indices], self.norm.weight, self.norm.eps
        if residual is None:
            hidden = self.ops.rms_norm(hidden, w, eps)
        else:
            hidden = self.ops.add_rms_norm(hidden, residual[logits_indices], w, eps)
        if self.cfg.pooling is not None:  # an embedding model: its final hidden states
            return hidden
        # one row per sampling request: every row as a decode, so that a token's logits never
        # depend on whether its request is still in its prompt beside it
        logits = apply_linear(self.lm_head, hidden, True)
        if self.cfg.logits_scaling != 1.0:  # Granite's
            logits = logits / self.cfg.logits_scaling
        if (cap := self.cfg.final_logit_softcapping) is not None:  # Gemma 2's
            logits = torch.tanh(logits / cap) * cap
        if self.tp is not None:  # each rank's vocabulary slice, side by side on rank 0
            gathered = self.tp.gather_columns(logits)
            return logits[:, :0] if gathered is None else gathered
        return logits

    def query_temperature(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """Each query's multiplier [T, 1] where the family tempers them (Ministral 3's Llama 4
        scaling: 1 + beta ln(1 + floor(position / interval)), as transformers computes it, in
        float32 and then the model's dtype); None elsewhere."""
        beta = self.cfg.query_temperature_beta
        if not beta:
            return None
        steps = torch.floor(positions / self.cfg.query_temperature_interval)
        return (1 + beta * torch.log(1 + steps)).to(dtype)[:, None]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, hidden], the first layer's input (Granite's multiplied)."""
        hidden = self.lookup(input_ids)
        if self.cfg.embedding_multiplier != 1.0:
            hidden = hidden * self.cfg.embedding_multiplier
        return hidden

    def lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of `input_ids`; split over ranks, each looks up the ids of its
        vocabulary slice (zeros for the others) and the rows are summed."""
        if self.tp is None:
            return self.embed_tokens(input_ids)
        local = input_ids - self.tp.rank * self.cfg.vocab_size
        outside = (local < 0) | (local >= self.cfg.vocab_size)
        hidden = self.embed_tokens(local.masked_fill(outside, 0))
        return self.tp.all_reduce(hidden.masked_fill(outside[:, None], 0))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named tensors in, fusing q/k/v and gate/up; every parameter must be set."""
        pending: dict[str, torch.Tensor] = {}
        loaded: set[str] = set()
        params = dict(self.named_parameters())
        for name, tensor in language_model_weights(weights):
            name = name.removeprefix("model.")
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            if name.startswith("layers."):
                prefix, _, leaf = name.partition(".self_attn.")
                if not leaf:
                    prefix, _, leaf = name.partition(".mlp.")
                if leaf:
                    if leaf.partition(".")[0] in self._FUSED:
                        pending[name] = tensor
                        loaded.update(self._try_fuse(prefix, leaf, pending, params))
                        continue
                    name = f"{prefix}.{leaf}"
            if name not in params:
                raise KeyError(f"unexpected weight {name!r}")
            self._copy(params[name], tensor, name)
            loaded.add(name)
        missing = set(params) - loaded
        if self.cfg.tie_word_embeddings:
            missing.discard("lm_head.weight")
        if missing or pending:
            raise KeyError(f"missing weights: {sorted(missing) or sorted(pending)}")

    # our projection -> (its HF section, the HF projections it is made of, in concatenation order)
    _PROJECTIONS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        "qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")),
        "o_proj": ("self_attn", ("o_proj",)),
        "gate_up_proj": ("mlp", ("gate_proj", "up_proj")),
        "down_proj": ("mlp", ("down_proj",)),
    }
    # HF projection -> (our fused projection, its parts in concatenation order), for every
    # projection the checkpoint holds under other names than ours (several parts, or one part
    # renamed: Arcee's up_proj as gate_up_proj); derived from each class's _PROJECTIONS
    _FUSED: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = _fused_parts(_PROJECTIONS)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._FUSED = _fused_parts(cls._PROJECTIONS)

    def linear_sources(self) -> dict[str, list[str]]:
        """Each linear layer's module name -> the HF weights its weight is made of, in
        concatenation order (a tied LM head's is the embedding's)."""
        sources = {
            f"layers.{i}.{fused}": [f"model.layers.{i}.{section}.{p}.weight" for p in parts]
            for i in range(len(self.layers))
            for fused, (section, parts) in self._PROJECTIONS.items()
        }
        tied = self.cfg.tie_word_embeddings
        sources["lm_head"] = ["model.embed_tokens.weight" if tied else "lm_head.weight"]
        return sources

    def _try_fuse(
        self, prefix: str, leaf: str, pending: dict[str, torch.Tensor], params: dict
    ) -> list[str]:
        part, _, kind = leaf.partition(".")  # kind: weight | bias
        fused, members = self._FUSED[part]
        section = self._PROJECTIONS[fused][0]
        names = [f"{prefix}.{section}.{m}.{kind}" for m in members]
        if not all(n in pending for n in names):
            return []
        target = f"{prefix}.{fused}.{kind}"
        self._copy(params[target], torch.cat([pending.pop(n) for n in names]), target)
        return [target]

    @staticmethod
    def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
        if param.shape != tensor.shape:
            raise ValueError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        param.data.copy_(tensor)
