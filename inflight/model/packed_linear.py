"""Linear layers with weights packed once at load time (CPU; float32 and bfloat16).

`F.linear` hands oneDNN a plain row-major weight, which it re-packs into its blocked layout on
every call: at decode batch sizes that copy costs as much as the multiply (packing once nearly
halves the linears' time at 1-4 tokens; docs/history/benchmark-rounds.md, "round 2").
So each weight is packed once for oneDNN, bit-identical to `F.linear` in bfloat16 (same kernel,
same accumulation). With inflight's CPU kernels, a bf16 weight instead multiplies every batch
through `kernels/csrc/bf16_linear.cpp` over a packing of its own, and keeps no oneDNN copy: that
kernel sums each row over k in one order whatever the batch, where oneDNN picks its kernel and
its split of k by the batch's size (a lone row, or any number past the small-batch kernel's
limit, rounds otherwise), so a token's values would depend on what shares its step. It also
reads a decode step's weights at the machine's bandwidth, where oneDNN's small-batch kernels
read about half of it; its prompts run at about 0.9x oneDNN's rate on Zen 4 (`mixed64` too).
`INFLIGHT_ONEDNN_BF16=1` trades the invariance back for oneDNN's speed on batches of more than
64 rows (AMX tiles, on CPUs that have them): both packings, the kernel picked by the batch's size.

float32 is packed too: its `F.linear` is MKL's sgemm, which on an AMD CPU without AVX-512 reads a
skinny batch's weights at a small fraction of the memory's bandwidth, and packing doubled a
float32 engine's decode throughput there (docs/benchmarks.md, "Figures behind design
decisions"). The sums then differ from `F.linear`'s (and transformers') in the last bits;
greedy parity with transformers still holds.

A float32 weight dequantized from a GGUF file's Q4_0, Q4_1 or Q8_0 blocks keeps those blocks too,
and batches of up to `GGUF_SMALL_BATCH_ROWS` rows multiply straight from them
(`kernels/csrc/gguf_linear.cpp`, AVX2): the same weights in 0.16-0.27 of the bytes, which is what
a decode step's time is made of (about half the linears' time at one row). With
`quantized_activations` (int16 or int8; `auto` picks by the file's formats), batches are instead
rounded to 16 or 8 bits per block of 32 and multiplied in integers over the blocks regrouped
eight columns at a time (`kernels/csrc/gguf_int_linear.cpp`; int8 is llama.cpp's way), up to
`GGUF_INT_SMALL_BATCH_ROWS` rows: not exact, and docs/benchmarks.md has how far each moves greedy
output. With either, the 5-bit and K-quant formats (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) take that
path too (`block_formats`); elsewhere they are dequantized to float like any other type. This
8-column layout serves every AVX2 CPU, AVX-512 ones included (there `vpdpwssd` and `vpdpbusd`
on 32-byte registers fuse each multiply with its add).

In a bf16 engine, where 16-bit x has the 16-column layout (AVX-512 VNNI: `vpdpwssd` on
64-byte registers), a weight of a legacy format (Q4_0, Q4_1, Q8_0; one format a weight) takes
every batch from that regrouping and keeps no bf16 copy: the loader never builds one (a 1B
Q4_0 file's engine peaked at 5.8 GiB with it, 3.0 without). A decode step reads about a quarter
of bf16's bytes, a row rounds alike whatever it is and whatever shares its batch, and prompt
rows run at about 0.85x their rate through a bf16 copy (Zen 4: each block of 32 pays its
scale). With `INFLIGHT_ONEDNN_BF16=1` (oneDNN for batches of more than 64 rows, on AMX tiles)
the weight keeps its bf16 copies beside the blocks instead, as `decode_weight`: the step's
decode rows, however many, multiply from the blocks, its prompt rows through bf16 (`auto`
keeps bf16 engines of many seats off the blocks there: model/loader.py); which path a row
takes depends on what the row is, not on its batch, so a draft verified beside others rounds
exactly as the token decoded alone would.

The packings inflight's kernels stream (block layouts, the bf16 packing) are copied onto
transparent huge pages where the OS offers them (`inflight/huge_pages.py` says why).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from typing import Protocol, TypeAlias

import torch
from torch import nn

from inflight.huge_pages import empty_on_huge_pages
from inflight.kernels import load_extension
from inflight.model.gguf_blocks import (
    BY_NAME,
    FORMATS,
    WIDE,
    format_of,
    mixed_packing,
    regroup_blocks,
)

logger = logging.getLogger(__name__)


class BlockSource(Protocol):
    """Linears' GGUF blocks by module name, each taken out (`pop`) as its linear is packed."""

    def pop(
        self, name: str, default: None = None, /
    ) -> torch.Tensor | list[torch.Tensor] | None: ...


# The batch size oneDNN is told to expect (its speed did not depend on it from 1 to 2048 rows).
_BATCH_HINT = 64
# A small-batch row limit that every batch is under.
EVERY_BATCH = 2**31 - 1
# Batches of at most this many rows use inflight's bf16 kernel where it is built: every batch
# (see the module's docstring), unless `INFLIGHT_ONEDNN_BF16=1` sends those of more than
# `ONEDNN_BF16_ABOVE_ROWS` to oneDNN.
SMALL_BATCH_ROWS = EVERY_BATCH
ONEDNN_BF16_ABOVE_ROWS = 64


def bf16_small_batch_rows() -> int:
    """The row limit of a bf16 weight's small-batch kernel here: `SMALL_BATCH_ROWS`, or
    `ONEDNN_BF16_ABOVE_ROWS` with `INFLIGHT_ONEDNN_BF16=1` (faster prompts where oneDNN runs on
    AMX tiles; a token's values then depend on its batch)."""
    if os.environ.get("INFLIGHT_ONEDNN_BF16") == "1":
        return ONEDNN_BF16_ABOVE_ROWS
    return SMALL_BATCH_ROWS


# Batches of at most this many rows multiply from GGUF blocks when a float32 weight has them: it
# beats oneDNN's float32 up to 8 rows and loses at 16, where converting the quants (once per 8
# rows) costs more than the bytes it saves.
GGUF_SMALL_BATCH_ROWS = 8
# Batches of at most this many rows go to `gguf_int_linear` with quantized activations, by bits
# (a float32 weight's, over the 8-column layout; a bf16 engine's 16-column one serves its
# decode rows instead, see above). Every batch: then the weight is kept as its blocks alone, no
# float copy beside them (a sixth to a quarter of the memory), and a row's value never depends
# on its batch. With 8-bit x the integer dot products beat oneDNN's float32 at every batch size;
# with 16-bit x they win at decode sizes and run at about its rate at prompt sizes (each block
# of 32 pays its scales, and each `vpmaddwd` its `vpaddd`), a loss taken for the memory and the
# invariance (docs/benchmarks.md, "Quantized weights").
GGUF_INT_SMALL_BATCH_ROWS = {8: EVERY_BATCH, 16: EVERY_BATCH}
# A warm-up call slower than this is mostly multiply, which outweighs the build it saves.
WARM_UP_MAX_CALL_S = 0.005


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (
        dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def gguf_kernel_applies(dtype: torch.dtype, activation_bits: int = 0) -> bool:
    """Whether weights of `dtype` multiply from GGUF blocks on this CPU, with x rounded to
    `activation_bits` (0: exact) (the loader keeps blocks only then): float32 batches, exactly
    or in integers, and bf16 decode rows with 16-bit x over the 16-column layout."""
    ext = load_extension()
    if dtype == torch.float32:
        return ext.gguf_linear_available()
    return decode_rows_from_blocks(dtype, activation_bits)


def blocks_serve_every_batch(dtype: torch.dtype, activation_bits: int) -> bool:
    """Whether a weight with GGUF blocks multiplies every batch from them (x rounded to
    `activation_bits`), so that its float copy is never needed (the loader then never builds
    it): a float32 engine's quantized activations, over the 8-column layout on every AVX2 CPU,
    AVX-512 ones included; a bf16 engine's 16-bit ones over the 16-column layout (AVX-512
    VNNI: the legacy formats, one a weight), unless oneDNN is to take its large batches
    (`INFLIGHT_ONEDNN_BF16=1`): a quarter of a bf16 copy's bytes, prompt rows at about 0.85x
    its rate (see the module's docstring)."""
    every_batch = (activation_bits in GGUF_INT_SMALL_BATCH_ROWS
                   and GGUF_INT_SMALL_BATCH_ROWS[activation_bits] >= EVERY_BATCH
                   and load_extension().gguf_int_linear_available())  # fmt: skip
    if dtype == torch.bfloat16:
        return (every_batch and decode_rows_from_blocks(dtype, activation_bits)
                and bf16_small_batch_rows() >= EVERY_BATCH)  # fmt: skip
    return every_batch and dtype == torch.float32


def mixed_blocks(dtype: torch.dtype, activation_bits: int) -> bool:
    """Whether blocks serve every batch over the 8-column layout, which reads every format
    (K-quants too) and packs a fused weight's parts of different formats together: a float32
    engine's. The 16-column layout reads the legacy formats, one a weight."""
    return dtype == torch.float32 and blocks_serve_every_batch(dtype, activation_bits)


def eight_bit_tiles() -> bool:
    """Whether the block kernel multiplies batches of 8-bit x on AMX tiles here (batches of
    `gguf_int_linear_tile_rows()` rows or more; `INFLIGHT_NO_AMX=1` turns them off)."""
    ext = load_extension()
    return ext.gguf_int_linear_available() and ext.gguf_int_linear_tile_rows() > 0


def eight_bits_are_faster() -> bool:
    """Whether 8-bit x multiplies faster than 16-bit over every block format here: on AMX
    tiles, or with AVX-512 VNNI's byte dot products (`vpdpbusd`, four products summed in one
    instruction, from quants unpacked once per batch). Elsewhere (AVX2 alone) only over
    K-quant blocks."""
    ext = load_extension()
    return ext.gguf_int_linear_available() and (
        ext.gguf_int_linear_byte_dots() or ext.gguf_int_linear_tile_rows() > 0
    )


def block_formats(dtype: torch.dtype, activation_bits: int) -> frozenset[str]:
    """The GGUF block formats (`gguf_blocks.FORMATS` names) whose weights multiply from their
    blocks here: every format where quantized x takes every batch over the 8-column layout, the
    legacy three (Q4_0, Q4_1, Q8_0) wherever any block kernel applies, none elsewhere."""
    if not gguf_kernel_applies(dtype, activation_bits):
        return frozenset()
    if mixed_blocks(dtype, activation_bits):
        return frozenset(BY_NAME)
    return frozenset(f.name for f in FORMATS.values() if f.legacy)


def decode_rows_from_blocks(dtype: torch.dtype, activation_bits: int) -> bool:
    """Whether a `dtype` engine's rows multiply from a 16-column regrouping of GGUF blocks,
    with x of that many bits: a bf16 engine with 16 bits (AVX-512 VNNI). Its blocks then serve
    every row (`blocks_serve_every_batch`), or with oneDNN for large batches its decode rows
    alone, beside its prompt rows' bf16 weights. A float32 engine's 8-column blocks serve every
    row."""
    ext = load_extension()
    return (dtype == torch.bfloat16 and activation_bits == 16
            and ext.gguf_int_linear_available()
            and ext.gguf_int_linear_columns(16) == 16)  # fmt: skip


Decodes: TypeAlias = "torch.Tensor | bool"
"""Which rows of a batch are decodes (a request's newest token or its drafts): their flat
indices, True for all rows, False for none."""


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward over weights packed once: oneDNN's layout, plus a small-batch
    kernel's (`small_weight`) for batches of at most `small_batch_rows` rows when one applies:
    GGUF blocks given for a float32 weight (`gguf_linear`, or `gguf_int_linear` when
    `activation_bits` asks for quantized activations: 8 or 16; blocks of a format not in
    `block_formats` are ignored; a list is a fused weight's parts in column order, one format
    each, which only `gguf_int_linear`'s mixed packing takes), or
    inflight's bf16 layout for a bf16 weight (`bf16_linear`, up to the `small_batch_rows` asked
    for).

    A bf16 weight with GGUF blocks of one legacy format and 16-bit activations, where they have
    the 16-column layout (AVX-512 VNNI), takes every batch from them; where oneDNN is to take
    large batches (`small_batch_rows` below `EVERY_BATCH`) it keeps them as `decode_weight`
    instead, for the decode rows the caller names (see the module's docstring).
    `activation_bits` is its small-batch kernel's (0: exact)."""

    def __init__(
        self,
        linear: nn.Linear,
        small_batch_rows: int = 0,
        gguf_blocks: torch.Tensor | list[torch.Tensor] | None = None,
        activation_bits: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """`dtype`: the engine's, for a linear whose float weight the loader never built."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        parts = [] if gguf_blocks is None else (
            list(gguf_blocks) if isinstance(gguf_blocks, (list, tuple)) else [gguf_blocks]
        )  # fmt: skip
        if parts and (
            sum(p.shape[0] for p in parts) != self.out_features
            or any(p.dim() != 3 or p.shape[1] * format_of(p).weights != self.in_features
                   for p in parts)
        ):  # fmt: skip
            raise ValueError(
                f"GGUF blocks {', '.join(str(tuple(p.shape)) for p in parts)} do not fit a "
                f"[{self.out_features}, {self.in_features}] weight"
            )
        # a weight whose blocks take every batch keeps no float copy: `weight` is then its
        # shape alone (meta), and the loader may not have built the float weight at all
        dtype = dtype if linear.weight is None else linear.weight.dtype
        formats = {format_of(p).name for p in parts}
        usable = bool(small_batch_rows > 0 and parts
                      and formats <= block_formats(dtype, activation_bits))  # fmt: skip
        # parts in different formats: only the 8-column layout's mixed packing takes them
        usable = usable and (len(parts) == 1 or mixed_blocks(dtype, activation_bits))
        # (a bf16 engine's: unless its large batches are to go through oneDNN)
        onednn_batches = dtype == torch.bfloat16 and small_batch_rows < EVERY_BATCH
        self.blocks_only = (usable and not onednn_batches
                            and blocks_serve_every_batch(dtype, activation_bits))  # fmt: skip
        if linear.weight is None and not self.blocks_only:
            raise ValueError("a linear without its float weight needs GGUF blocks that take "
                             "every batch")  # fmt: skip
        ext = load_extension()
        # inflight's bf16 kernel (it reads k in pairs); taking every batch, it needs no oneDNN copy
        bf16_kernel = (small_batch_rows > 0 and dtype == torch.bfloat16
                       and self.in_features % 2 == 0 and ext.bf16_linear_available())  # fmt: skip
        # whether `weight` is oneDNN's packing (else its shape alone, on the meta device)
        self.dense_copy = not (
            self.blocks_only or (bf16_kernel and small_batch_rows >= EVERY_BATCH)
        )
        dense = None if linear.weight is None else linear.weight.detach()
        if self.dense_copy:
            self.register_buffer(
                "weight", torch.ops.mkldnn._reorder_linear_weight(dense, _BATCH_HINT)
            )
        else:
            weight = torch.empty(self.out_features, self.in_features, dtype=dtype, device="meta")
            self.register_buffer("weight", weight)
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)
        self.small_batch_rows = 0
        self.small_kernel = ""
        self.activation_bits = 0  # only the GGUF kernel has integer paths
        self.register_buffer("small_weight", None)
        self.register_buffer("decode_weight", None)
        if small_batch_rows <= 0:
            return
        if usable and not self.blocks_only and decode_rows_from_blocks(dtype, activation_bits):
            self.decode_weight = regroup_blocks(parts[0], WIDE)  # (beside bf16 for prompts)
        if self.blocks_only or (usable and dtype == torch.float32 and activation_bits):
            # the integer kernel (every batch, or up to its limit); a bf16 weight's 16 columns
            wide = dtype == torch.bfloat16
            self.small_weight = regroup_blocks(parts[0], WIDE) if wide else _regrouped(parts)
            self.small_batch_rows = GGUF_INT_SMALL_BATCH_ROWS[activation_bits]
            self.small_kernel = f"gguf-int{activation_bits}"
            self.activation_bits = activation_bits
            self._small_linear = functools.partial(ext.gguf_int_linear,
                                                   activation_bits=activation_bits)  # fmt: skip
        elif usable and dtype == torch.float32:  # exact
            self.small_weight = parts[0]
            self.small_batch_rows = GGUF_SMALL_BATCH_ROWS
            self.small_kernel, self._small_linear = "gguf", ext.gguf_linear
        elif bf16_kernel:
            self.small_weight = _bf16_packing(dense)
            self.small_batch_rows = small_batch_rows
            self.small_kernel, self._small_linear = "bf16", ext.bf16_linear

    def forward(self, x: torch.Tensor, decodes: Decodes = False) -> torch.Tensor:
        """`decodes`: which rows of x are decodes, where the caller knows (they matter only
        with a `decode_weight`)."""
        if self.decode_weight is None or x.dim() != 2 or decodes is False:
            return self._dense(x)
        if decodes is True or decodes.numel() == x.shape[0]:  # every row, in order
            return self._decode(x)
        prompts = torch.ones(x.shape[0], dtype=torch.bool)
        prompts[decodes] = False
        if int(prompts.sum()) <= self.small_batch_rows:  # the prompt rows as their own batch
            out = x.new_empty(x.shape[0], self.out_features)
            out[prompts] = self._dense(x[prompts])
        else:  # oneDNN over the whole step (cheaper than copying out its prompt rows' results)
            out = self._dense(x)
        out[decodes] = self._decode(x[decodes])
        return out

    def _decode(self, x: torch.Tensor) -> torch.Tensor:
        ext = load_extension()
        return ext.gguf_int_linear(x, self.decode_weight, self.bias, self.out_features, 16)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dense_copy:  # the small-batch kernel takes every batch, of any shape
            rows = x.reshape(-1, self.in_features)
            out = self._small_linear(rows, self.small_weight, self.bias, self.out_features)
            return out.view(*x.shape[:-1], self.out_features)
        if x.dim() == 2 and 0 < x.shape[0] <= self.small_batch_rows:
            return self._small_linear(x, self.small_weight, self.bias, self.out_features)
        if x.dim() == 2 and x.shape[0] == 1:
            # oneDNN splits a lone row's sum over k between threads, which rounds otherwise
            # than any batch of 2 or more rows (those agree with each other): a lone row goes
            # as two, at no cost where that one row reads the weights anyway
            return self._onednn(x.expand(2, -1).contiguous())[:1]
        return self._onednn(x)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        small = ""
        if self.blocks_only:
            small = f", every batch through its GGUF blocks ({self.small_kernel}), no float copy"
        elif not self.dense_copy:
            small = f", every batch through the {self.small_kernel} kernel, no oneDNN copy"
        elif self.small_kernel:
            small = f", {self.small_kernel} kernel up to {self.small_batch_rows} rows"
        if self.decode_weight is not None:
            small += ", decode rows through its GGUF blocks (16-bit x)"
        return f"in_features={self.in_features}, out_features={self.out_features}, packed{small}"


def _regrouped(parts: list[torch.Tensor]) -> torch.Tensor:
    """`gguf_int_linear`'s 8-column packing of a weight's blocks: one format's, or a fused
    weight's parts in different formats as one mixed packing."""
    return regroup_blocks(parts[0]) if len(parts) == 1 else mixed_packing(parts)


# bf16_linear.cpp's packed block: 32 columns, pair-major (the kernel checks the shape)
BF16_BLOCK_COLUMNS = 32


def _bf16_packing(weight: torch.Tensor) -> torch.Tensor:
    """`bf16_linear`'s packing of a [N, K] bf16 weight, written straight onto huge pages (the
    kernel streams it)."""
    n, k = weight.shape
    shape = (-(-n // BF16_BLOCK_COLUMNS), k // 2, BF16_BLOCK_COLUMNS, 2)
    return load_extension().pack_bf16_linear(weight, empty_on_huge_pages(shape, torch.bfloat16))


def apply_linear(linear: nn.Module, x: torch.Tensor, decodes: Decodes) -> torch.Tensor:
    """`linear(x)`, telling a `PackedLinear` which rows of x are decodes."""
    return linear(x, decodes) if isinstance(linear, PackedLinear) else linear(x)


def integer_block_packings(
    linears: Iterable[nn.Module], biased: bool = False
) -> tuple[list[torch.Tensor], int] | None:
    """The `gguf_int_linear` packings of `linears` and their activation bits, where every one
    multiplies from its blocks alone with the integer kernel, unbiased (`biased`: the caller
    adds their biases itself), at one width of activations, so that one C++ call can run them
    all (DeepSeek's heads, a layer's experts); None otherwise (they run one by one)."""
    linears = list(linears)
    if not all(isinstance(m, PackedLinear) and m.blocks_only and m.activation_bits
               and m.weight.dtype == torch.float32  # (the 8-column layout)
               and (biased or m.bias is None) for m in linears):  # fmt: skip
        return None
    bits = {m.activation_bits for m in linears}
    return ([m.small_weight for m in linears], bits.pop()) if len(bits) == 1 else None


def pack_linears(
    model: nn.Module,
    small_batch_rows: int = 0,
    gguf_blocks: BlockSource | None = None,
    activation_bits: int = 0,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Replaces every `nn.Linear` under `model` with a `PackedLinear`; returns how many.
    `gguf_blocks` maps module names to their weights' GGUF blocks, where they have them;
    `activation_bits` (8 or 16) asks their kernel to round x to that many bits; `dtype` is the
    engine's (that of the linears left without a float weight). Each entry of
    `gguf_blocks` is taken out as its linear is packed, so that its memory goes with it.

    A tied LM head gets its own packed copy; the embedding keeps the plain weight it indexes.
    """
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    packed = []
    for name, linear in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        blocks = None if gguf_blocks is None else gguf_blocks.pop(name, None)
        packed.append(PackedLinear(linear, small_batch_rows, blocks, activation_bits, dtype))
        setattr(parent, leaf, packed[-1])
    kernels = Counter(
        f"{m.small_kernel} kernel (every batch, no oneDNN copy)" if not m.dense_copy
        else f"{m.small_kernel} kernel (<= {m.small_batch_rows} rows)"
        for m in packed if m.small_kernel
    )  # fmt: skip
    kernels.update("decode rows through gguf-int16" for m in packed if m.decode_weight is not None)
    logger.info(
        "packed %d linear layers for oneDNN; small batches: %s",
        len(packed),
        ", ".join(f"{n} through {k}" for k, n in kernels.items()) or "oneDNN too",
    )
    return len(targets)


def warm_up(model: nn.Module, batch_sizes: Iterable[int]) -> None:
    """Runs every packed weight shape once at each batch size that oneDNN serves, so it builds
    its kernel for it now: a shape it has not seen costs extra on its first call, which would
    otherwise land on the first requests' steps, once per new decode batch size. inflight's own
    bf16 kernel has nothing to build.

    Once a shape's call takes over `WARM_UP_MAX_CALL_S`, it is mostly multiply, not build (a
    float32 LM head on a small CPU), and warming it at larger sizes would cost more than it
    saves: that shape stops there.

    Kernels are cached per shape, not per weight, so one layer's projections stand for all."""
    by_shape: dict[tuple[int, int, bool], PackedLinear] = {}
    for m in model.modules():
        if isinstance(m, PackedLinear):
            by_shape.setdefault((m.in_features, m.out_features, m.bias is not None), m)
    start, calls = time.perf_counter(), 0
    with torch.inference_mode():
        for m in by_shape.values():
            for n in sorted(n for n in set(batch_sizes) if n > m.small_batch_rows):
                call_start = time.perf_counter()
                m(torch.zeros(n, m.in_features, dtype=m.weight.dtype))
                calls += 1
                if time.perf_counter() - call_start > WARM_UP_MAX_CALL_S:
                    break
    if calls:
        logger.info("warmed %d oneDNN kernels in %.2f s", calls, time.perf_counter() - start)
