"""Which slice of each weight a tensor-parallel rank holds.

Column-parallel (split by output rows): q/k/v by heads, gate/up by MLP columns (every expert's
alike, by its own columns), the embedding and the LM head by vocabulary entries. Row-parallel
(split by input columns, the ranks' outputs summed by an all-reduce): o and down (an expert's
too; a router is replicated, so every rank picks the same experts; a shared expert is split by
its own columns, and its gate replicated). A DeltaNet layer (Qwen3.5's) is split by its key
heads: each rank its key heads' q and k rows and the value heads they serve, out_proj by
those heads' columns (in a file's tiled order, several runs of them). A rank's model is the
family's own class built for its share (`shard_arch`: heads, KV heads, MLP columns and
vocabulary divided), so attention, the KV cache and every layer op run unchanged on it. Where
the ranks outnumber the KV heads, each KV head is held by `size / num_kv_heads` ranks, the
ones whose query heads read it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from inflight.model.arch import LlamaArchConfig


def check_tensor_parallel(arch: LlamaArchConfig, size: int) -> None:
    """Refuses a size that does not split the model evenly, naming the numbers (ValueError)."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise ValueError(f"tensor_parallel_size must be an integer, got {size!r}")
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    kv = arch.num_kv_heads
    parts = {
        "attention heads": arch.num_heads,
        "MLP columns (intermediate_size)": arch.intermediate_size,
        "vocabulary entries": arch.vocab_size,
    }
    if arch.num_experts:
        parts["experts' MLP columns (expert_intermediate_size)"] = arch.expert_intermediate_size
    if arch.shared_expert_intermediate_size:
        parts["shared expert's MLP columns"] = arch.shared_expert_intermediate_size
    if arch.delta_value_heads:  # (each rank its key heads and the value heads they serve)
        parts["DeltaNet key heads"] = arch.delta_key_heads
    elif arch.conv_layers:
        parts["short-convolution channels (hidden_size)"] = arch.hidden_size
    for what, count in parts.items():
        if count % size:
            raise ValueError(f"tensor_parallel_size {size} does not divide the model's {count} "
                             f"{what}")  # fmt: skip
    if kv % size and size % kv:
        raise ValueError(f"tensor_parallel_size {size} neither divides the model's {kv} KV "
                         f"heads nor is a multiple of them")  # fmt: skip


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size`, over a model of `arch` (the whole model's shape)."""

    arch: LlamaArchConfig
    rank: int
    size: int

    def _part(self, count: int) -> range:
        """This rank's equal share of `count` units (heads, columns, vocabulary rows)."""
        n = count // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    @property
    def heads(self) -> range:
        return self._part(self.arch.num_heads)

    @property
    def kv_heads(self) -> range:
        kv = self.arch.num_kv_heads
        if kv >= self.size:
            return self._part(kv)
        first = self.rank * kv // self.size  # the one KV head its query heads read
        return range(first, first + 1)

    @property
    def key_heads(self) -> range:
        """This rank's key heads of every DeltaNet layer (Qwen3.5's)."""
        return self._part(self.arch.delta_key_heads)

    @property
    def value_heads(self) -> list[range]:
        """The DeltaNet value heads this rank's key heads serve, as runs of the model's value
        heads in the rank's order: one run where value head v is served by key head
        v // (value heads / key heads) (the checkpoints'), one per pass over the key heads where
        it is v % key heads (`delta_heads_tiled`: llama.cpp's files), so each rank's heads keep
        that order among themselves."""
        a, keys = self.arch, self.key_heads
        per_key = a.delta_value_heads // a.delta_key_heads
        if a.delta_heads_tiled:
            n = a.delta_key_heads
            return [range(r * n + keys.start, r * n + keys.stop) for r in range(per_key)]
        return [range(keys.start * per_key, keys.stop * per_key)]

    @property
    def vocab(self) -> range:
        return self._part(self.arch.vocab_size)

    @property
    def channels(self) -> range:
        """This rank's channels of every short convolution (LFM2's): of its B, C and x rows,
        its kernels and its output projection's inputs."""
        return self._part(self.arch.conv_width)

    @property
    def columns(self) -> range:
        """This rank's MLP columns."""
        return self._part(self.arch.intermediate_size)

    @property
    def expert_columns(self) -> range:
        """This rank's columns of every expert's MLP."""
        return self._part(self.arch.expert_intermediate_size)

    @property
    def shared_expert_columns(self) -> range:
        return self._part(self.arch.shared_expert_intermediate_size)

    def mlp_columns(self, name: str) -> tuple[range, int]:
        """This rank's columns of the MLP the weight `name` belongs to, and that MLP's width:
        an expert's (every expert split alike), the shared expert's, or the dense one's."""
        if ".experts." in name:
            return self.expert_columns, self.arch.expert_intermediate_size
        if ".shared_expert" in name:  # (GLM-4.5's `shared_experts` too)
            return self.shared_expert_columns, self.arch.shared_expert_intermediate_size
        return self.columns, self.arch.intermediate_size


def shard_arch(shard: Shard) -> LlamaArchConfig:
    """The shape of one rank's model: heads, KV heads, MLP columns and vocabulary its share."""
    a = shard.arch
    return dataclasses.replace(
        a, num_heads=len(shard.heads), num_kv_heads=len(shard.kv_heads),
        intermediate_size=len(shard.columns), vocab_size=len(shard.vocab),
        expert_intermediate_size=len(shard.expert_columns),
        shared_expert_intermediate_size=len(shard.shared_expert_columns),
        latent_expansion_heads=a.num_heads if a.latent_expansion_per_head else 0,
        conv_channels=len(shard.channels) if a.conv_layers and not a.delta_value_heads else 0,
        delta_key_heads=len(shard.key_heads) if a.delta_value_heads else 0,
        delta_value_heads=sum(map(len, shard.value_heads)) if a.delta_value_heads else 0,
        qk_norm_heads=(a.num_heads, a.num_kv_heads) if a.qk_norms_span_heads else (0, 0),
    )  # fmt: skip


def _rows(tensor: torch.Tensor, units: range, unit: int) -> torch.Tensor:
    """Rows `units` of `tensor`, `unit` rows each (a head's head_dim, 1 for a column)."""
    return tensor[units.start * unit : units.stop * unit]


def _joined(parts: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """`parts` side by side along `dim`: a lone part as it is (a view, not a copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _runs(tensor: torch.Tensor, runs: list[range], unit: int) -> torch.Tensor:
    """Rows `runs` of `tensor` (each a range of units of `unit` rows), one after another."""
    return _joined([_rows(tensor, run, unit) for run in runs])


def _parts(tensor: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(tensor.split(sizes, dim=0))


def input_columns(shard: Shard, name: str) -> list[range] | None:
    """The input columns this rank holds of a row-parallel weight (o's, down's), as runs; None
    for every other tensor."""
    a = shard.arch
    if a.delta_value_heads and name.endswith("linear_attn.out_proj.weight"):  # (DeltaNet's:
        # its value heads' outputs)
        d = a.delta_value_dim
        return [range(run.start * d, run.stop * d) for run in shard.value_heads]
    if name.endswith(("o_proj.weight", "self_attn.out_proj.weight")):  # (LFM2's: out_proj;
        # a latent attention's heads: their values' width)
        d = a.v_head_dim if a.kv_lora_rank else a.head_dim
        return [range(shard.heads.start * d, shard.heads.stop * d)]
    if name.endswith("out_proj.weight") and a.conv_layers:  # a short convolution's
        return [shard.channels]
    if name.endswith(("down_proj.weight", ".w2.weight")):  # (Mixtral's experts: w2)
        return [shard.mlp_columns(name)[0]]
    return None


def splits_on_blocks(shard: Shard, name: str, block_width: int) -> bool:
    """Whether this rank's slice of the weight `name` is whole blocks of `block_width` weights
    along its input (always, except a row-parallel weight cut inside a block)."""
    runs = input_columns(shard, name)
    return runs is None or not any(r.start % block_width or r.stop % block_width for r in runs)


def shard_blocks(
    shard: Shard, name: str, blocks: torch.Tensor, block_width: int
) -> torch.Tensor | None:
    """This rank's slice of a GGUF weight's blocks ([rows, blocks per row, bytes], rows the
    output features): whole rows, or for a row-parallel weight whole blocks of each row; None
    where its input columns do not fall on block boundaries (the weight is then dequantized and
    cut as floats)."""
    if not splits_on_blocks(shard, name, block_width):
        return None
    runs = input_columns(shard, name)
    if runs is None:
        return shard_tensor(shard, name, blocks)
    return _joined([blocks[:, r.start // block_width : r.stop // block_width] for r in runs], 1)


def shard_tensor(shard: Shard, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's slice of the HF-named weight `tensor` (a view; replicated ones as they are)."""
    a, d = shard.arch, shard.arch.head_dim
    parts = name.rsplit(".", 2)
    module = parts[-2] if len(parts) >= 2 else ""
    q, kv = a.num_heads * d, a.num_kv_heads * d
    if a.kv_lora_rank and module in ("q_proj", "q_b_proj", "kv_b_proj"):  # DeepSeek's heads:
        # their queries' rows (qk_nope + rotated each), their expansions' (qk_nope + v each);
        # the latents are every rank's
        query = a.qk_nope_head_dim + a.rope_dim
        return _rows(tensor, shard.heads, a.qk_nope_head_dim + a.v_head_dim
                     if module == "kv_b_proj" else query)  # fmt: skip
    if module == "q_proj":  # (Qwen3.5's: each head's query rows, then its gate's)
        return _rows(tensor, shard.heads, 2 * d if a.attention_output_gate else d)
    if module in ("k_proj", "v_proj"):
        return _rows(tensor, shard.kv_heads, d)
    if a.delta_value_heads and ".linear_attn." in name and module != "out_proj":
        return _delta_net_rows(shard, name, tensor)
    if a.conv_layers and module == "in_proj":  # a short convolution's B, C and x rows
        return torch.cat([_rows(part, shard.channels, 1) for part in tensor.chunk(3)])
    if a.conv_layers and name.endswith("conv.conv.weight"):  # its kernels, a channel each
        return _rows(tensor, shard.channels, 1)
    if module == "qkv_proj":  # Phi-3's fused rows: q, then k, then v
        pq, pk, pv = _parts(tensor, [q, kv, kv])
        return torch.cat([_rows(pq, shard.heads, d), _rows(pk, shard.kv_heads, d),
                          _rows(pv, shard.kv_heads, d)])  # fmt: skip
    columns, width = shard.mlp_columns(name)
    if module in ("gate_proj", "up_proj", "w1", "w3"):  # (Mixtral's experts: w1, w3)
        return _rows(tensor, columns, 1)
    if module == "gate_up_proj":  # fused rows (Phi-3's, an expert's): gate, then up
        gate, up = _parts(tensor, [width] * 2)
        return torch.cat([_rows(gate, columns, 1), _rows(up, columns, 1)])
    if (stacked := _GPT_OSS_STACK.search(name)) is not None and a.architecture == "gpt_oss":
        return _gpt_oss_stack(shard, stacked[1], tensor)
    if stacked is not None:  # Qwen3-VL-MoE's, in either of its layouts
        return _stacked_experts(shard, stacked[1], tensor)
    if (fused := _GRANITE_FUSED.search(name)) is not None:
        return _fused_mlp(shard, fused[1] == "block_sparse_moe", fused[2] == "input", tensor)
    if (runs := input_columns(shard, name)) is not None:
        return _joined([tensor[:, r.start : r.stop] for r in runs], 1)
    if module in ("o_proj", "down_proj"):  # their biases join the sum once
        return tensor if shard.rank == 0 else torch.zeros_like(tensor)
    if module in ("embed_tokens", "lm_head"):
        return _rows(tensor, shard.vocab, 1)
    if name.endswith("self_attn.sinks"):
        return tensor[shard.heads.start : shard.heads.stop]
    return tensor


def _delta_net_rows(shard: Shard, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a DeltaNet layer's tensor: its key heads' q and k rows, the value
    heads they serve (v, z, b, a, decay rates, dt bias), the convolution's kernels for its q,
    k and v channels; Qwen3-Next's rows grouped by key head, its key heads' groups; the norm
    (one value head wide) every rank's; out_proj's columns by `input_columns`."""
    a, keys, values = shard.arch, shard.key_heads, shard.value_heads
    per_key = a.delta_value_heads // a.delta_key_heads
    module = name.removesuffix(".weight").rsplit(".", 1)[-1]  # (dt_bias has no `.weight`)
    if module in ("in_proj_qkv", "conv1d"):
        qk = a.delta_key_heads * a.delta_key_dim
        q, k, v = _parts(tensor, [qk, qk, a.delta_value_heads * a.delta_value_dim])
        return torch.cat([_rows(q, keys, a.delta_key_dim), _rows(k, keys, a.delta_key_dim),
                          _runs(v, values, a.delta_value_dim)])  # fmt: skip
    if module == "in_proj_z":
        return _runs(tensor, values, a.delta_value_dim)
    if module in ("in_proj_b", "in_proj_a", "dt_bias", "A_log", "decay_rate"):
        return _runs(tensor, values, 1)
    if module == "in_proj_qkvz":  # (grouped: q, k, then the key head's v and z)
        return _rows(tensor, keys, 2 * a.delta_key_dim + 2 * per_key * a.delta_value_dim)
    if module == "in_proj_ba":  # (grouped: the key head's b, then its a)
        return _rows(tensor, keys, 2 * per_key)
    return tensor


# gpt-oss's checkpoints stack every expert of a layer in one tensor
_GPT_OSS_STACK = re.compile(r"\.mlp\.experts\.(gate_up_proj|gate_up_proj_bias|down_proj|"
                            r"down_proj_bias)$")  # fmt: skip


# Granite's experts stacked per layer and its shared MLP, gate and up fused in `input_linear`
_GRANITE_FUSED = re.compile(r"\.(block_sparse_moe|shared_mlp)\.(input|output)_linear\.weight$")


def _fused_mlp(shard: Shard, experts: bool, gate_up: bool, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's slice of an MLP weight with gate and up fused, the experts' stacked ([E, 2I, H],
    [E, H, I]) or a shared MLP's ([2S, H], [H, S]): gate and up by their rows alike, down by its
    input columns."""
    columns = shard.expert_columns if experts else shard.shared_expert_columns
    if not gate_up:
        return tensor[..., columns.start : columns.stop]
    width = (
        shard.arch.expert_intermediate_size
        if experts
        else shard.arch.shared_expert_intermediate_size
    )
    gate, up = tensor.split(width, dim=-2)
    rows = slice(columns.start, columns.stop)
    return torch.cat([gate[..., rows, :], up[..., rows, :]], dim=-2)


def _stacked_experts(shard: Shard, part: str, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a layer's stacked experts, gate before up (Qwen3-VL-MoE's): in
    transformers' layout ([E, 2I, H], [E, H, I]), as Granite's, or the published one ([E, H, 2I],
    [E, I, H]), told apart by which dimension is the experts' width."""
    width, gate_up = shard.arch.expert_intermediate_size, part == "gate_up_proj"
    if tensor.shape[1 if gate_up else 2] == (2 * width if gate_up else width):
        return _fused_mlp(shard, True, gate_up, tensor)
    return _fused_mlp(shard, True, gate_up, tensor.transpose(1, 2)).transpose(1, 2)


def _gpt_oss_stack(shard: Shard, part: str, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a gpt-oss expert stack: gate_up [E, hidden, 2I] (and its bias
    [E, 2I]) with gate and up columns interleaved, so a rank's columns are one run; down
    [E, I, hidden] by its input rows; down's bias [E, hidden] joins the sum once."""
    columns = shard.expert_columns
    if part.startswith("gate_up_proj"):
        return tensor[..., 2 * columns.start : 2 * columns.stop]
    if part == "down_proj":
        return tensor[:, columns.start : columns.stop]
    return tensor if shard.rank == 0 else torch.zeros_like(tensor)


def shard_weights(
    shard: Shard, weights: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weight stream of a loader with each tensor cut to this rank's slice (copied, so the
    whole tensor's memory goes once it is read)."""
    for name, tensor in weights:
        part = shard_tensor(shard, name, tensor)
        yield name, (part.clone() if part is not tensor else tensor)
