"""GGUF's block formats as the CPU kernels read them: unpacked to integers, dequantized, and
regrouped into `kernels/csrc/gguf_int_linear.cpp`'s layout.

A block holds 32 weights (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, MXFP4) or a 256-weight super-block of eight
32-weight sub-blocks (Q4_K, Q5_K, Q6_K: what Q4_K_M, Q5_K_M and Q6_K files are made of). Every
weight is a scale times an unsigned quant, less a zero point or plus an offset:

| format | file bytes | weight |
|---|---|---|
| Q4_0, Q5_0 | 18, 22 | d (q - 8), d (q - 16) |
| Q4_1, Q5_1 | 20, 24 | d q + m |
| Q8_0 | 34 | d q (q signed) |
| Q4_K, Q5_K | 144, 176 | (d sc) q - (dmin min), a 6-bit sc and min per sub-block |
| Q6_K | 210 | (d sc) (q - 32), an int8 sc per 16 weights |
| MXFP4 | 17 | d v[q], d = 2^(e - 128) from an exponent byte e, v the FP4 values doubled |

`dequantize` computes those float32 operations in the `gguf` package's order, so its values are
gguf's bit for bit (the embedding's lookups, and the reference the kernels are tested against).
The kernel layout keeps the quants' bits and the header's fields as they are, every format at its
file size (a K-quant's 6-bit sc and min re-laid in their 12 bytes), re-laid so that eight columns
share each instruction: csrc/gguf_regroup.cpp writes it for the 5-bit and K-quant formats, and
csrc/gguf_int_linear.cpp and csrc/gguf_blocks.h say how it is read.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from inflight.huge_pages import empty_on_huge_pages
from inflight.kernels import load_extension

GROUP = 8  # columns that gguf_int_linear computes together, one per float32 lane
WIDE = 16  # columns of the wide layout (16-bit x on AVX-512 VNNI; the legacy formats)


@dataclass(frozen=True)
class BlockFormat:
    name: str
    file_bytes: int  # one block's bytes in the file
    weights: int  # per block
    bits: int  # per quant

    @property
    def super_blocks(self) -> bool:
        """Q4_K, Q5_K, Q6_K: 256 weights in sub-blocks with scales of their own."""
        return self.weights == 256

    @property
    def legacy(self) -> bool:
        """Q4_0, Q4_1, Q8_0: the formats every kernel reads (the exact one, 8-bit x, the
        16-column layout)."""
        return self.name in ("Q4_0", "Q4_1", "Q8_0")


FORMATS = {
    f.file_bytes: f
    for f in (
        BlockFormat("Q4_0", 18, 32, 4),
        BlockFormat("Q4_1", 20, 32, 4),
        BlockFormat("Q8_0", 34, 32, 8),
        BlockFormat("Q5_0", 22, 32, 5),
        BlockFormat("Q5_1", 24, 32, 5),
        BlockFormat("Q4_K", 144, 256, 4),
        BlockFormat("Q5_K", 176, 256, 5),
        BlockFormat("Q6_K", 210, 256, 6),
        BlockFormat("MXFP4", 17, 32, 4),
    )
}
BY_NAME = {f.name: f for f in FORMATS.values()}


def format_of(blocks: torch.Tensor) -> BlockFormat:
    """The format of uint8 blocks [..., blocks, block bytes], told by their size."""
    if blocks.dtype != torch.uint8 or blocks.dim() < 2 or blocks.shape[-1] not in FORMATS:
        raise ValueError(f"GGUF blocks of a known format expected, got {tuple(blocks.shape)} "
                         f"{blocks.dtype}")  # fmt: skip
    return FORMATS[blocks.shape[-1]]


@dataclass
class Unpacked:
    """A tensor's blocks [..., n, bytes] as integers, each field as the file holds it."""

    q: torch.Tensor  # [..., n, weights] the quants: uint8 (Q8_0, MXFP4's values: int8), in order
    d: torch.Tensor  # [..., n] fp16 (MXFP4: float32)
    m: torch.Tensor | None = None  # [..., n] fp16: Q4_1 / Q5_1's m, a K-quant's dmin
    scales: torch.Tensor | None = None  # [..., n, 8] uint8 (Q4_K, Q5_K); [..., n, 16] int8 (Q6_K)
    mins: torch.Tensor | None = None  # [..., n, 8] uint8 (Q4_K, Q5_K)


def _half(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).squeeze(-1)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """32-weight blocks' 16 bytes: byte i holds weight i (low nibble) and i + 16 (high)."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _bits(packed: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """The `count` fields of `width` bits in each row of bytes, lowest bits first."""
    shifts = torch.arange(0, 8, width, dtype=torch.uint8)
    fields = (packed.unsqueeze(-1) >> shifts) & ((1 << width) - 1)
    return fields.flatten(-2)[..., :count]


def _k_scales(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes -> 8 6-bit scales and 8 6-bit mins: bytes 0-3 hold scales 0-3
    (low 6 bits) and the top 2 bits of scales 4-7; 4-7 the same for the mins; 8-11 the low 4
    bits of scales 4-7 (low nibble) and mins 4-7 (high)."""
    d, m, md = raw[..., 0:4], raw[..., 4:8], raw[..., 8:12]
    scales = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=-1)
    mins = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=-1)
    return scales, mins


# MXFP4's FP4 (E2M1) values by code, doubled to integers (ggml's `kvalues_mxfp4`)
MXFP4_VALUES = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                            dtype=torch.int8)  # fmt: skip


def _e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """An E8M0 exponent byte e -> 2^(e - 128) in float32 (half the block's scale, the values
    being doubled), exactly: subnormal for e of 0 and 1."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def unpack(blocks: torch.Tensor) -> Unpacked:
    """Blocks [..., n, bytes] -> their integer fields (the file's layouts, per ggml)."""
    fmt, b = format_of(blocks), blocks
    lead = b.shape[:-1]
    if fmt.name == "Q8_0":
        return Unpacked(b[..., 2:].contiguous().view(torch.int8), _half(b[..., 0:2]))
    if fmt.name == "MXFP4":
        return Unpacked(MXFP4_VALUES[_nibbles(b[..., 1:]).long()], _e8m0_half(b[..., 0]))
    if fmt.name in ("Q4_0", "Q4_1"):
        start = 2 if fmt.name == "Q4_0" else 4
        m = _half(b[..., 2:4]) if fmt.name == "Q4_1" else None
        return Unpacked(_nibbles(b[..., start:]), _half(b[..., 0:2]), m)
    if fmt.name in ("Q5_0", "Q5_1"):  # a uint32 (little-endian) of 5th bits, weight i's at bit i
        start = 2 if fmt.name == "Q5_0" else 4
        m = _half(b[..., 2:4]) if fmt.name == "Q5_1" else None
        high = _bits(b[..., start : start + 4], 32, 1)
        return Unpacked(_nibbles(b[..., start + 4 :]) | (high << 4), _half(b[..., 0:2]), m)
    if fmt.name in ("Q4_K", "Q5_K"):
        scales, mins = _k_scales(b[..., 4:16])
        qs = b[..., -128:].reshape(*lead, 4, 1, 32)
        # 32-byte chunk c: low nibbles are sub-block 2c, high ones 2c + 1
        q = torch.cat([qs & 15, qs >> 4], dim=-2).reshape(*lead, 256)
        if fmt.name == "Q5_K":  # 32 bytes: bit s of byte i is sub-block s's weight i's 5th bit
            high = _bits(b[..., 16:48], 256, 1).reshape(*lead, 32, 8).transpose(-1, -2)
            q = q | (high.reshape(*lead, 256) << 4)
        return Unpacked(q, _half(b[..., 0:2]), _half(b[..., 2:4]), scales, mins)
    # Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16 d. Each half of
    # 128 weights: nibble byte l (of 64) holds weights l (low) and 64 + l (high); 2-bit byte l
    # (of 32) holds weights l, 32 + l, 64 + l and 96 + l (bits 0-1, 2-3, 4-5, 6-7).
    ql = b[..., :128].reshape(*lead, 2, 1, 64)
    low = torch.cat([ql & 15, ql >> 4], dim=-2).reshape(*lead, 2, 128)
    high = _bits(b[..., 128:192].reshape(*lead, 2, 32), 128, 2)
    high = high.reshape(*lead, 2, 32, 4).transpose(-1, -2).reshape(*lead, 2, 128)
    q = (low | (high << 4)).reshape(*lead, 256)
    return Unpacked(q, _half(b[..., 208:210]), scales=b[..., 192:208].contiguous().view(torch.int8))


def dequantize(blocks: torch.Tensor) -> torch.Tensor:
    """uint8 blocks [..., n, bytes] -> float32 [..., n * weights]: gguf's values, bit for bit
    (the same float32 operations in the same order)."""
    fmt, u = format_of(blocks), unpack(blocks)
    d = u.d.float().unsqueeze(-1)
    if fmt.name in ("Q4_0", "Q5_0"):
        w = d * (u.q.to(torch.int8) - (8 if fmt.name == "Q4_0" else 16)).float()
    elif fmt.name in ("Q8_0", "MXFP4"):
        w = d * u.q.float()
    elif fmt.name in ("Q4_1", "Q5_1"):
        assert u.m is not None
        w = d * u.q.float() + u.m.float().unsqueeze(-1)
    elif fmt.name == "Q6_K":
        assert u.scales is not None
        dl = (d * u.scales.float()).unsqueeze(-1)  # per 16 weights
        w = dl * (u.q.to(torch.int8) - 32).float().unflatten(-1, (16, 16))
    else:  # Q4_K, Q5_K
        assert u.scales is not None and u.m is not None and u.mins is not None
        dl = (d * u.scales.float()).unsqueeze(-1)
        dm = (u.m.float().unsqueeze(-1) * u.mins.float()).unsqueeze(-1)
        w = dl * u.q.float().unflatten(-1, (8, 32)) - dm
    return w.reshape(*blocks.shape[:-2], -1)


# --- gguf_int_linear's layout -------------------------------------------------------------


def regrouped_shape(blocks: torch.Tensor, columns: int = GROUP) -> tuple[int, int, int]:
    """`regroup_blocks(blocks, columns)`'s shape."""
    n, per_row, _ = blocks.shape
    return -(-n // columns), per_row, columns * format_of(blocks).file_bytes


def regroup_blocks(
    blocks: torch.Tensor, columns: int = GROUP, out: torch.Tensor | None = None
) -> torch.Tensor:
    """A weight's GGUF blocks [N, blocks per row, block bytes] in `gguf_int_linear`'s layout,
    `columns` (8 or 16: `gguf_int_linear_columns`; 16 for the legacy formats only) columns at a
    time: [ceil(N / columns), blocks per row, columns x layout bytes] (`regrouped_shape`),
    written into `out` where given, else on huge pages (`empty_on_huge_pages`: the kernels
    stream it). Columns past N are zero blocks. The 5-bit and K-quant formats are re-laid by
    `csrc/gguf_regroup.cpp`, which says where each bit goes; the legacy ones here, their bytes
    reordered."""
    fmt = format_of(blocks)
    shape = regrouped_shape(blocks, columns)
    if out is None:
        out = empty_on_huge_pages(shape, torch.uint8)
    elif out.shape != shape or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"out: contiguous uint8 {list(shape)}, got {out.dtype} {list(out.shape)}")
    if fmt.legacy:
        return _regroup_legacy(blocks, columns, out)
    if columns != GROUP:
        raise ValueError(f"{fmt.name} blocks have the 8-column layout only")
    return load_extension().gguf_regroup_blocks(blocks.contiguous(), out)


# A legacy block's bytes before its quants, by block size: fp16 d (Q4_0, Q8_0), d and m (Q4_1).
_LEGACY_HEADER_BYTES = {18: 2, 20: 4, 34: 2}


def _regroup_legacy(blocks: torch.Tensor, columns: int, out: torch.Tensor) -> torch.Tensor:
    """Q4_0 / Q4_1 / Q8_0: the same bytes reordered."""
    n, num_blocks, block_bytes = blocks.shape
    header = _LEGACY_HEADER_BYTES[block_bytes]
    if n % columns:
        blocks = torch.cat([blocks, blocks.new_zeros(-n % columns, num_blocks, block_bytes)])
    # [G, B, columns, bytes]
    groups = blocks.view(-1, columns, num_blocks, block_bytes).transpose(1, 2)
    lead = groups.shape[:2]
    scales = [groups[..., i : i + 2].reshape(*lead, 2 * columns) for i in range(0, header, 2)]
    quants = groups[..., header:]
    if columns == GROUP:  # chunks of 4 bytes from each column in turn
        chunks = quants.reshape(*lead, GROUP, -1, 4).transpose(2, 3).reshape(*lead, -1)
    else:
        chunks = _wide_quants(quants)
    return torch.cat([*scales, chunks], dim=-1, out=out)


def regrouped_rows(
    layout: torch.Tensor, rows: torch.Tensor, block_bytes: int, columns: int = GROUP
) -> torch.Tensor:
    """Rows [R] of a legacy format's layout of `columns` (8 or 16) columns (`regroup_blocks`)
    as the file's blocks [R, blocks per row, block_bytes]: `_regroup_legacy`'s byte order
    undone for them, so that a tied embedding looks its rows up in its LM head's layout rather
    than in a copy."""
    header = _LEGACY_HEADER_BYTES[block_bytes]
    picked = layout[rows // columns]  # [R, B, columns x block bytes]
    r, b = picked.shape[:2]
    column = (rows % columns).view(r, 1, 1, 1)
    fields = []  # each 2-byte header field: the columns' in turn
    for start in range(0, header * columns, 2 * columns):
        field = picked[..., start : start + 2 * columns].view(r, b, columns, 2)
        fields.append(field.gather(2, column.expand(r, b, 1, 2)).view(r, b, 2))
    if columns == GROUP:
        quants = picked[..., header * GROUP :].view(r, b, -1, GROUP, 4)  # 4-byte chunks, by column
        chunks = quants.gather(3, column.view(r, 1, 1, 1, 1).expand(r, b, quants.shape[2], 1, 4))
        return torch.cat([*fields, chunks.view(r, b, -1)], dim=-1)
    return torch.cat([*fields, _wide_rows(picked[..., header * columns :], rows % columns)], -1)


@functools.cache
def _wide_order(four_bit: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """For each byte of a 16-column block in the wide layout: its column and the k of its value
    (of its low nibble, for 4 bits; the high nibble holds k + 4)."""
    chunks = 4 if four_bit else 8
    q, lane, i = torch.meshgrid(torch.arange(chunks), torch.arange(4), torch.arange(16),
                                indexing="ij")  # fmt: skip
    column = 4 * lane + (i % 8) // 2
    k = (8 if four_bit else 4) * q + 2 * (i // 8) + i % 2
    return column.flatten(), k.flatten()


@functools.cache
def _wide_places(four_bit: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`_wide_order` inverted: for each column and value of a 16-column block in the wide layout,
    the byte that holds it and (4 bits) the shift of its nibble there, [16, values] each."""
    column, k = _wide_order(four_bit)
    byte = torch.arange(len(column))
    values = 32 if four_bit else len(column) // 16
    place = torch.empty(16, values, dtype=torch.long)
    shift = torch.zeros(16, values, dtype=torch.long)
    place[column, k] = byte
    if four_bit:  # the high nibble holds value k + 4
        place[column, k + 4] = byte
        shift[column, k + 4] = 4
    return place, shift


def _wide_rows(quants: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """[R, B, the wide layout's quant bytes] -> row r's column `columns[r]` as the file's quant
    bytes [R, B, quant bytes]: `_wide_quants` undone for it."""
    r, b, n = quants.shape
    four_bit = n == 16 * 16
    place, shift = _wide_places(four_bit)
    index = place[columns].view(r, 1, -1).expand(r, b, -1)
    picked = quants.gather(2, index)
    if not four_bit:
        return picked
    # value i of 32 (its byte's nibble), and the file's byte i: value i low, value i + 16 high
    values = (picked.long() >> shift[columns].view(r, 1, -1)) & 15
    return (values[..., :16] | (values[..., 16:] << 4)).to(torch.uint8)


def _wide_quants(quants: torch.Tensor) -> torch.Tensor:
    """[G, B, 16 columns, quant bytes] -> [G, B, the wide layout's quant bytes]."""
    four_bit = quants.shape[-1] == 16
    # a 4-bit block's byte i holds element i (low nibble) and element i + 16 (high)
    values = torch.cat([quants & 15, quants >> 4], dim=-1) if four_bit else quants
    column, k = _wide_order(four_bit)
    if not four_bit:
        return values[..., column, k]
    return values[..., column, k] | (values[..., column, k + 4] << 4)


def mixed_packing(parts: list[torch.Tensor]) -> torch.Tensor:
    """One packing for a fused weight whose parts came in different formats (a Q4_K_M file's
    Q4_K q and k beside a Q6_K v): each part's GGUF blocks, in column order, regrouped
    (`regroup_blocks`) straight into uint8 [header | each part's layout, at offsets aligned to
    64 bytes], on huge pages; the header is int64 [parts, then per part: columns, blocks per
    row, group block bytes, offset]."""
    header_bytes = 8 * (1 + 4 * len(parts))
    offset = -(-header_bytes // 64) * 64
    fields, places = [len(parts)], []
    for blocks in parts:
        shape = regrouped_shape(blocks)
        fields += [blocks.shape[0], shape[1], shape[2], offset]
        places.append((offset, shape))
        offset += -(-math.prod(shape) // 64) * 64
    packing = empty_on_huge_pages((offset,), torch.uint8)
    packing[:header_bytes] = torch.tensor(fields, dtype=torch.int64).view(torch.uint8)
    for blocks, (at, shape) in zip(parts, places, strict=True):  # the padding stays zeros
        regroup_blocks(blocks, out=packing[at : at + math.prod(shape)].view(shape))
    return packing
