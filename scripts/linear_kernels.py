"""Times the CPU linear kernels over a SmolLM2 step's 120 layer linears (30 layers of qkv
576 -> 960, o 576 -> 576, gate-up 576 -> 3,072, down 1,536 -> 576), each layer its own weights
so that they come from memory as in a real step: `gguf_int_linear` with 16-bit x over Q4_1
blocks (the 16-column layout where the CPU has AVX-512 VNNI, the 8-column one elsewhere), the
bf16 kernel, and oneDNN in bf16 and float32. Milliseconds per step for each batch size; the best
of 7 rounds, since a shared machine's speed drifts between rounds. Timing does not depend on the
weights' values, so they are random.

    .venv/bin/python scripts/linear_kernels.py [ROWS ...]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

from inflight.kernels import load_extension
from inflight.model.gguf_blocks import regroup_blocks
from inflight.model.packed_linear import _BATCH_HINT, can_pack
from inflight.platform import describe_device

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30  # (out, in) per linear
ext = load_extension()


def best_ms(call: Callable[[], object], rounds: int = 7) -> float:
    call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def q4_1_blocks(n: int, k: int) -> torch.Tensor:
    """Random Q4_1 blocks [n, k / 32, 20]: fp16 d and m in (0, 0.01), random nibbles."""
    blocks = torch.randint(0, 256, (n, k // 32, 20), dtype=torch.uint8)
    header = (torch.rand(n, k // 32, 2) * 0.01).half().view(torch.uint8)
    blocks[..., :4] = header.view(n, k // 32, 4)
    return blocks


Kernel = Callable[[dict[int, torch.Tensor]], object]  # x by in_features -> the 120 outputs


def main(rows: list[int]) -> None:
    columns = ext.gguf_int_linear_columns(16)
    kernels: dict[str, tuple[torch.dtype, Kernel]] = {}  # name: (x's dtype, kernel)
    if ext.gguf_int_linear_available():
        int16 = [(n, regroup_blocks(q4_1_blocks(n, k), columns)) for n, k in SHAPES]
        kernels[f"int16 over Q4_1 ({columns} columns)"] = (torch.bfloat16, lambda xs: [
            ext.gguf_int_linear(xs[p.shape[1] * 32], p, None, n, 16) for n, p in int16
        ])  # fmt: skip
    bf16 = [torch.randn(n, k).bfloat16() for n, k in SHAPES]
    if ext.bf16_linear_available():
        packed = [(w.shape[0], ext.pack_bf16_linear(w)) for w in bf16]
        kernels["bf16 kernel"] = (torch.bfloat16, lambda xs: [
            ext.bf16_linear(xs[p.shape[1] * 2], p, None, n) for n, p in packed
        ])  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32):
        if can_pack(dtype, torch.device("cpu")):
            onednn = [torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), _BATCH_HINT)
                      for w in bf16]  # fmt: skip
            kernels[f"oneDNN {str(dtype).removeprefix('torch.')}"] = (dtype, lambda xs, ws=onednn: [
                torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], w, None, "none", [], "")
                for w in ws
            ])  # fmt: skip
    print(f"120 layer linears of SmolLM2, ms per step, on {describe_device(torch.device('cpu'))}")
    print("| rows | " + " | ".join(kernels) + " |")
    print("|---" * (len(kernels) + 1) + "|")
    with torch.inference_mode():
        for m in rows:
            x = {k: torch.randn(m, k) for k in (576, 1536)}
            times = []
            for dtype, run in kernels.values():
                xs = {k: v.to(dtype) for k, v in x.items()}
                times.append(best_ms(lambda run=run, xs=xs: run(xs)))
            print(f"| {m} | " + " | ".join(f"{t:.2f}" for t in times) + " |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 2, 4, 8, 16, 32, 64, 256])
