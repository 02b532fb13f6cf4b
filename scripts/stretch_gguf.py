"""Writes a GGUF file with more layers than its source by repeating the source's layers.

A large synthetic model (Qwen3-30B-A3B's 48 layers: 57 GiB of F16 before `llama-quantize`) needs
more disk on the way than its quantized file. Quantizing its first few layers
(`synthetic_gguf.py SHAPE --layers 8`) and repeating them here gives the whole model's shapes,
bytes and kernels at the disk cost of the file itself: layer i of the output is layer
i mod N of the source, bytes unchanged. Per-layer metadata arrays (one entry a layer) repeat
the same way; `block_count` becomes the new count. Random weights stay random noise, so memory
and speed figures are those of the real model's shape.

    python scripts/stretch_gguf.py /tmp/q3m/q4_k_m.gguf --layers 48 --out /tmp/q3/q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import gguf
from tqdm import tqdm

_LAYER = re.compile(r"blk\.(\d+)\.(.*)")


def stretch(source: Path, layers: int, out: Path) -> None:
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    have = int(reader.fields[count_key].contents())
    if layers < have:
        raise SystemExit(f"{source} has {have} layers; asked for {layers}, fewer")
    writer = gguf.GGUFWriter(out, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == count_key:
            value = layers
        elif sub_type is not None and isinstance(value, list) and len(value) == have:
            value = [value[i % have] for i in range(layers)]  # one entry a layer
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    layer_tensors: dict[int, list] = {}
    others = []
    for tensor in reader.tensors:
        match = _LAYER.fullmatch(tensor.name)
        if match is None:
            others.append((tensor.name, tensor))
        else:
            layer_tensors.setdefault(int(match[1]), []).append((match[2], tensor))
    order = others + [
        (f"blk.{i}.{suffix}", tensor)
        for i in range(layers)
        for suffix, tensor in layer_tensors[i % have]
    ]
    for name, tensor in order:
        writer.add_tensor_info(
            name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total = sum(int(tensor.n_bytes) for _, tensor in order)
    with tqdm(desc="writing", total=total, unit="B", unit_scale=True, file=sys.stderr) as bar:
        for _, tensor in order:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
            bar.update(int(tensor.n_bytes))
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--layers", type=int, required=True, help="the output's layer count")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    stretch(args.source, args.layers, args.out)


if __name__ == "__main__":
    main()
