"""Times `gguf_int_linear` with 8-bit x per block format on a 3B-shaped model's square
projection (3,072 x 3,072) and its down projection (3,072 outputs of 8,192), at several batch
sizes: on AMX tiles where the CPU has them (this process) and on vector registers (a child
process with INFLIGHT_NO_AMX=1). Milliseconds per call, the best of 5; timing does not depend
on the weights' values, so they are random bytes with small fp16 scales.

    .venv/bin/python scripts/tile_kernels.py [ROWS ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from inflight.kernels import load_extension
from inflight.model.gguf_blocks import regroup_blocks
from inflight.platform import describe_device

# format: (weights per block, bytes per block, byte offsets of its fp16 scales)
FORMATS = {"Q4_K": (256, 144, (0, 2)), "Q6_K": (256, 210, (208,)), "Q8_0": (32, 34, (0,)),
           "Q5_0": (32, 22, (0,))}  # fmt: skip
SHAPES = [(3072, 3072), (3072, 8192)]  # (out, in)


def random_blocks(name: str, n: int, k: int) -> torch.Tensor:
    weights, size, scales = FORMATS[name]
    blocks = torch.randint(0, 256, (n, k // weights, size), dtype=torch.uint8)
    for at in scales:
        half = (torch.rand(n, k // weights) * 0.01).half().view(torch.uint8)
        blocks[..., at : at + 2] = half.view(n, k // weights, 2)
    return blocks


def timings(rows: list[int]) -> dict[str, float]:
    """ms per call for each (format, shape, rows), in this process."""
    ext = load_extension()
    torch.manual_seed(0)
    out = {}
    for name in FORMATS:
        for n, k in SHAPES:
            packed = regroup_blocks(random_blocks(name, n, k), 8)
            for m in rows:
                x = torch.randn(m, k)
                ext.gguf_int_linear(x, packed, None, n, 8)
                best = float("inf")
                for _ in range(5):
                    start = time.perf_counter()
                    ext.gguf_int_linear(x, packed, None, n, 8)
                    best = min(best, time.perf_counter() - start)
                out[f"{name} {n}x{k} {m}"] = best * 1e3
    return out


def main(rows: list[int]) -> None:
    tiles = load_extension().gguf_int_linear_tile_rows()
    env = {**os.environ, "INFLIGHT_NO_AMX": "1"}
    child = subprocess.run([sys.executable, __file__, "--child", *map(str, rows)], env=env,
                           check=True, capture_output=True, text=True)  # fmt: skip
    vector = json.loads(child.stdout.strip().splitlines()[-1])
    tiled = timings(rows) if tiles else {}
    print(f"8-bit x, ms per call, on {describe_device(torch.device('cpu'))}; "
          f"AMX tiles from {tiles or 'never'} rows")  # fmt: skip
    print("| format | shape | rows | vector | AMX tiles | speed-up |")
    print("|---|---|---|---|---|---|")
    for key, ms in vector.items():
        name, shape, m = key.split()
        if key in tiled and int(m) >= tiles:
            t = tiled[key]
            print(f"| {name} | {shape} | {m} | {ms:.2f} | {t:.2f} | {ms / t:.2f}x |")
        else:
            print(f"| {name} | {shape} | {m} | {ms:.2f} | - | - |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # the vector path's timings, for the parent
        print(json.dumps(timings([int(a) for a in sys.argv[2:]])))
    else:
        main([int(a) for a in sys.argv[1:]] or [1, 16, 64, 512])
