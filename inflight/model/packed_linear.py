"""Linear layers with weights packed once at load time (CPU; float32 and bfloat16).

`F.linear` hands oneDNN a plain row-major weight, which it re-packs into its blocked layout on
every call: at decode batch sizes that copy costs as much as the multiply (packing once nearly
halves the linears' time at 1-4 tokens; docs/history/benchmark-rounds.md, "round 2").
So each weight is packed once for oneDNN, bit-identical to `F.linear` in bfloat16 (same kernel,
same accumulation). With inflight's CPU kernels, decode-sized bf16 batches (up to
`SMALL_BATCH_ROWS` rows) go instead through `kernels/csrc/bf16_linear.cpp` over a second packing
of the same weight: oneDNN's small-batch kernels read the weights well below the machine's
bandwidth (about half of it at 1-16 rows).
Larger batches (prefill) stay on oneDNN, which uses AMX where the CPU has it.

float32 is packed too: its `F.linear` is MKL's sgemm, which on an AMD CPU without AVX-512 reads a
skinny batch's weights at 2-4 GB/s (SmolLM2's LM head at 4 rows: 42 ms; oneDNN: 8.4 ms), so a
float32 engine decoding 8 sequences ran at 38 tok/s, and 84 packed. The sums then differ from
`F.linear`'s (and transformers') in the last bits; greedy parity with transformers still holds.

A float32 weight dequantized from a GGUF file's Q4_0, Q4_1 or Q8_0 blocks keeps those blocks too,
and batches of up to `GGUF_SMALL_BATCH_ROWS` rows multiply straight from them
(`kernels/csrc/gguf_linear.cpp`, AVX2): the same weights in 0.16-0.27 of the bytes, which is what
a decode step's time is made of (about half the linears' time at one row). With
`quantized_activations` (int16, the default where it applies, or int8), batches are instead
rounded to 16 or 8 bits per block of 32 and multiplied in integers over the blocks regrouped
eight columns at a time (`kernels/csrc/gguf_int_linear.cpp`; int8 is llama.cpp's way), up to
`GGUF_INT_SMALL_BATCH_ROWS` rows: not exact, and docs/benchmarks.md has how far each moves greedy
output.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Iterable

import torch
from torch import nn

from inflight.kernels import load_extension

logger = logging.getLogger(__name__)

# The batch size oneDNN is told to expect; measured insensitive between 1 and 2048 tokens.
_BATCH_HINT = 64
# Batches of at most this many rows use inflight's bf16 kernel when it is built: it is faster
# than oneDNN up to a few hundred rows and level with it at 2048; oneDNN keeps
# the prefill-sized ones, where AMX (on CPUs that have it) should be far ahead of AVX-512.
SMALL_BATCH_ROWS = 64
# Batches of at most this many rows multiply from GGUF blocks when a float32 weight has them: it
# beats oneDNN's float32 up to 8 rows and loses at 16, where converting the quants (once per 8
# rows) costs more than the bytes it saves.
GGUF_SMALL_BATCH_ROWS = 8
# Batches of at most this many rows go to `gguf_int_linear` with quantized activations, by bits:
# with 8-bit x its integer dot products beat oneDNN's float32 at every size measured on an AVX2
# Zen 3 (1.4x at 512 rows, 4-9x at one row), so every batch goes there; with 16-bit x it is ~3x
# faster at one row and level with oneDNN at 16.
GGUF_INT_SMALL_BATCH_ROWS = {8: 2**31 - 1, 16: 16}
# A warm-up call slower than this is mostly multiply, which outweighs the ~1 ms build it saves.
WARM_UP_MAX_CALL_S = 0.005


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (
        dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def gguf_kernel_applies(dtype: torch.dtype) -> bool:
    """Whether weights of `dtype` can multiply small batches from GGUF blocks on this CPU (the
    loader keeps blocks only then)."""
    return dtype == torch.float32 and load_extension().gguf_linear_available()


# A GGUF block's bytes before its quants, by block size: fp16 d (Q4_0, Q8_0), d and m (Q4_1).
_BLOCK_HEADER_BYTES = {18: 2, 20: 4, 34: 2}
_GROUP = 8  # columns that gguf_int_linear computes together, one per float32 lane


def regroup_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """A weight's GGUF blocks [N, K / 32, block bytes] in `gguf_int_linear`'s layout, eight
    columns at a time: [ceil(N / 8), K / 32, 8 fp16 d | 8 fp16 m (Q4_1) | quants], the quants in
    chunks of 4 bytes from each of the 8 columns in turn (csrc/gguf_int_linear.cpp says why).
    The same bytes reordered; columns past N are zero blocks."""
    n, num_blocks, block_bytes = blocks.shape
    header = _BLOCK_HEADER_BYTES[block_bytes]
    if n % _GROUP:
        blocks = torch.cat([blocks, blocks.new_zeros(-n % _GROUP, num_blocks, block_bytes)])
    groups = blocks.view(-1, _GROUP, num_blocks, block_bytes).transpose(1, 2)  # [G, B, 8, bytes]
    lead = groups.shape[:2]
    scales = [groups[..., i : i + 2].reshape(*lead, 2 * _GROUP) for i in range(0, header, 2)]
    chunks = groups[..., header:].reshape(*lead, _GROUP, -1, 4).transpose(2, 3)
    return torch.cat([*scales, chunks.reshape(*lead, -1)], dim=-1).contiguous()


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward over weights packed once: oneDNN's layout, plus a small-batch
    kernel's (`small_weight`) for batches of at most `small_batch_rows` rows when one applies:
    GGUF blocks given for a float32 weight (`gguf_linear`, or `gguf_int_linear` when
    `activation_bits` asks for quantized activations: 8 or 16), or
    inflight's bf16 layout for a bf16 weight (`bf16_linear`, up to the `small_batch_rows` asked
    for)."""

    def __init__(
        self,
        linear: nn.Linear,
        small_batch_rows: int = 0,
        gguf_blocks: torch.Tensor | None = None,
        activation_bits: int = 0,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT))
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)
        self.small_batch_rows = 0
        self.small_kernel = ""
        self.activation_bits = 0  # only the GGUF kernel has integer paths
        self.register_buffer("small_weight", None)
        if small_batch_rows <= 0:
            return
        ext = load_extension()
        bf16_pairs = weight.dtype == torch.bfloat16 and self.in_features % 2 == 0
        if gguf_blocks is not None and gguf_kernel_applies(weight.dtype):
            if tuple(gguf_blocks.shape[:2]) != (self.out_features, self.in_features // 32):
                raise ValueError(
                    f"GGUF blocks {tuple(gguf_blocks.shape)} do not fit a "
                    f"[{self.out_features}, {self.in_features}] weight"
                )
            if activation_bits:
                self.small_weight = regroup_blocks(gguf_blocks)
                self.small_batch_rows = GGUF_INT_SMALL_BATCH_ROWS[activation_bits]
                self.small_kernel = f"gguf-int{activation_bits}"
                self.activation_bits = activation_bits
                self._small_linear = functools.partial(ext.gguf_int_linear,
                                                       activation_bits=activation_bits)  # fmt: skip
            else:
                self.small_weight = gguf_blocks
                self.small_batch_rows = GGUF_SMALL_BATCH_ROWS
                self.small_kernel, self._small_linear = "gguf", ext.gguf_linear
        # inflight's bf16 kernel reads k in pairs
        elif bf16_pairs and ext.bf16_linear_available():
            self.small_weight = ext.pack_bf16_linear(weight)
            self.small_batch_rows = small_batch_rows
            self.small_kernel, self._small_linear = "bf16", ext.bf16_linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and 0 < x.shape[0] <= self.small_batch_rows:
            return self._small_linear(x, self.small_weight, self.bias, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        small = ""
        if self.small_kernel:
            small = f", {self.small_kernel} kernel up to {self.small_batch_rows} rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, packed{small}"


def pack_linears(
    model: nn.Module,
    small_batch_rows: int = 0,
    gguf_blocks: dict[str, torch.Tensor] | None = None,
    activation_bits: int = 0,
) -> int:
    """Replaces every `nn.Linear` under `model` with a `PackedLinear`; returns how many.
    `gguf_blocks` maps module names to their weights' GGUF blocks, where they have them;
    `activation_bits` (8 or 16) asks their kernel to round x to that many bits.

    A tied LM head gets its own packed copy; the embedding keeps the plain weight it indexes.
    """
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    gguf_blocks = gguf_blocks or {}
    packed = []
    for name, linear in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        packed.append(
            PackedLinear(linear, small_batch_rows, gguf_blocks.get(name), activation_bits)
        )
        setattr(parent, leaf, packed[-1])
    kernels = Counter(
        f"{m.small_kernel} kernel (<= {m.small_batch_rows} rows)" for m in packed if m.small_kernel
    )
    logger.info(
        "packed %d linear layers for oneDNN; small batches: %s",
        len(packed),
        ", ".join(f"{n} through {k}" for k, n in kernels.items()) or "oneDNN too",
    )
    return len(targets)


def warm_up(model: nn.Module, batch_sizes: Iterable[int]) -> None:
    """Runs every packed weight shape once at each batch size that oneDNN serves, so it builds
    its kernel for it now: a shape it has not seen costs ~1 ms extra on its first call, which
    would otherwise land on the first requests' steps (~5 ms per new decode batch size for a
    Llama layer). inflight's own bf16 kernel has nothing to build.

    Once a shape's call takes over `WARM_UP_MAX_CALL_S`, it is mostly multiply, not build (a
    float32 LM head on a small CPU), and warming it at larger sizes would cost more than it
    saves: that shape stops there.

    Kernels are cached per shape, not per weight, so one layer's projections stand for all."""
    by_shape = {}
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
