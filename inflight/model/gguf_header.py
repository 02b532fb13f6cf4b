"""A GGUF file's metadata and tensor table, read straight from its header.

gguf's `GGUFReader` makes a numpy view of every element of every field, which for a large
vocabulary (Gemma 3's 262k tokens) takes many seconds, paid by every first load of a file.
Loading needs the metadata as values and where each tensor lies, which `struct` reads in a
fraction of that (docs/benchmarks.md, "Figures behind design decisions").

Layout (little-endian): magic `GGUF`, version, tensor count, field count; each field a string
key, a value type and its value (arrays: element type, count, elements); each tensor a string
name, its dims (fastest-varying first), GGML type and offset into the data section, which starts
at the next multiple of `general.alignment` (32 by default) after the table.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from inflight.errors import ModelLoadError

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# GGUF value type -> struct format of one value (string and array are read apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
# GGML types whose data gguf maps as plain numbers (the others as bytes of blocks)
_PLAIN_DTYPES = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: int  # GGML type number
    shape: tuple[int, ...]  # GGUF order: fastest-varying first
    offset: int  # of its data, from the start of the file

    def data_layout(self) -> tuple[str, tuple[int, ...]]:
        """The numpy dtype and shape gguf maps this tensor's data as (what its `dequantize`
        takes): plain numbers in numpy order, or rows of block bytes."""
        kind = GGMLQuantizationType(self.type)
        shape = tuple(reversed(self.shape))
        if kind in _PLAIN_DTYPES:
            return np.dtype(_PLAIN_DTYPES[kind]).str, shape
        return np.dtype(np.uint8).str, tuple(quant_shape_to_byte_shape(shape, kind))


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict[str, Any]  # numbers, bools, strings, and lists of them
    tensors: list[TensorInfo]


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.pos = buffer, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        end = self.pos + n
        if end > len(self.buffer):
            raise ValueError(f"a string of {n} bytes at offset {self.pos} runs past the end")
        text = self.buffer[self.pos : end].decode("utf-8", errors="replace")
        self.pos = end
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.take("I"), self.take("Q")
            if item == _STRING:
                return [self.string() for _ in range(n)]
            if item not in _SCALARS:
                raise ValueError(f"unknown array element type {item}")
            dtype = np.dtype("<" + _SCALARS[item])
            values = np.frombuffer(self.buffer, dtype, count=n, offset=self.pos)
            self.pos += n * dtype.itemsize
            return values.tolist()
        if kind not in _SCALARS:
            raise ValueError(f"unknown value type {kind}")
        return self.take(_SCALARS[kind])


def read_gguf_header(path: Path) -> GGUFHeader:
    """The file's fields and tensor table; a file that is not GGUF, or whose header is cut
    short or malformed, is a ModelLoadError naming it."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return _parse(buffer)
    except (ValueError, struct.error, OSError, OverflowError) as e:
        raise ModelLoadError(f"{path}: not a valid GGUF file ({e})") from None


def _parse(buffer: mmap.mmap) -> GGUFHeader:
    cursor = _Cursor(buffer)
    if buffer[:4] != _MAGIC:
        raise ValueError("no GGUF magic")
    cursor.pos = 4
    version, num_tensors, num_fields = cursor.take("I"), cursor.take("Q"), cursor.take("Q")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    fields = {}
    for _ in range(num_fields):
        key = cursor.string()
        fields[key] = cursor.value(cursor.take("I"))
    table = []
    for _ in range(num_tensors):
        name = cursor.string()
        dims = tuple(cursor.take("Q") for _ in range(cursor.take("I")))
        table.append((name, dims, cursor.take("I"), cursor.take("Q")))
    alignment = int(fields.get("general.alignment", 32))
    if alignment <= 0:
        raise ValueError(f"general.alignment is {alignment}")
    start = -(-cursor.pos // alignment) * alignment
    names = set()
    tensors = []
    for name, dims, kind, offset in table:
        if name in names:
            raise ValueError(f"tensor {name!r} appears twice")
        names.add(name)
        tensors.append(TensorInfo(name, kind, dims, start + offset))
    return GGUFHeader(fields, tensors)
