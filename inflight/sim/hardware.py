"""Hardware profiles for the cost model: memory, bandwidth, peak dense compute per dtype.

GPU figures are the vendors' published peaks (dense, i.e. without 2:4 sparsity), so a simulation
with the default efficiencies of 1.0 is a roofline: a lower bound on time. The local CPU is
measured on the spot (`measure_local`), and `inflight bench calibrate` fits efficiencies and
per-step overheads to this engine's measured steps, saved as a profile JSON file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

TB = 1e12
GB = 1e9


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    memory_bytes: int  # device memory for weights + KV + activations
    memory_bw: float  # bytes/s
    flops: dict[str, float]  # dtype ("bf16", "fp8", "fp32") -> dense FLOP/s
    host_link_bw: float  # bytes/s one way, device <-> host (swap preemption)
    source: str
    is_cpu: bool = False
    # Fractions of the peaks a real engine reaches (1.0 = roofline) and host time per step.
    weight_bw_efficiency: float = 1.0
    kv_bw_efficiency: float = 1.0
    compute_efficiency: float = 1.0
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0  # per scheduled sequence (input preparation, sampling, output)
    # "max": memory and compute overlap (a roofline); "sum": they run one after the other, as
    # in an engine whose kernels are each memory- or compute-bound (the calibrated CPU).
    combine: str = "max"
    notes: dict[str, float] = field(default_factory=dict)  # fit quality and the like

    def peak_flops(self, compute_dtype: str) -> float:
        """Peak for `compute_dtype`, falling back to bf16 (e.g. fp8 weights on an A100 run as
        bf16 matmuls after dequantization)."""
        return self.flops.get(compute_dtype) or self.flops["bf16"]

    def with_overrides(self, **changes: float | None) -> HardwareProfile:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> HardwareProfile:
        return cls(**json.loads(path.read_text()))


_NVIDIA = "NVIDIA datasheet, dense (non-sparse) Tensor Core peaks"
PROFILES: dict[str, HardwareProfile] = {
    "h100-sxm": HardwareProfile(
        "h100-sxm", 80 * GB, 3.35 * TB, {"bf16": 989e12, "fp8": 1979e12}, 64 * GB,
        f"{_NVIDIA} (H100 SXM5 80GB: HBM3 3.35 TB/s, BF16 989 TFLOPS, FP8 1979 TFLOPS, "
        "PCIe Gen5 x16)",
    ),
    "h200": HardwareProfile(
        "h200", 141 * GB, 4.8 * TB, {"bf16": 989e12, "fp8": 1979e12}, 64 * GB,
        f"{_NVIDIA} (H200 SXM 141GB: HBM3e 4.8 TB/s, compute as H100 SXM, PCIe Gen5 x16)",
    ),
    "a100-80gb": HardwareProfile(
        "a100-80gb", 80 * GB, 2.039 * TB, {"bf16": 312e12}, 32 * GB,
        f"{_NVIDIA} (A100 80GB SXM: HBM2e 2,039 GB/s, BF16 312 TFLOPS, no FP8 units, "
        "PCIe Gen4 x16)",
    ),
    "l40s": HardwareProfile(
        "l40s", 48 * GB, 864 * GB, {"bf16": 362e12, "fp8": 733e12}, 32 * GB,
        f"{_NVIDIA} (L40S: GDDR6 864 GB/s, BF16 362 TFLOPS, FP8 733 TFLOPS, PCIe Gen4 x16)",
    ),
    # A node like this project's 2-core CPU VMs, for tensor parallelism across CPU nodes: the
    # Zen 3 VM's DRAM read rate while decoding from GGUF blocks, and the rate of its 16-bit
    # activations over 4-bit blocks (the path quantized weights take; "bf16" here stands for
    # it), both in docs/benchmarks.md. Its step times add memory and compute, as the
    # calibrated CPU's do.
    "cpu-node-2c": HardwareProfile(
        "cpu-node-2c", 24 * 2**30, 18 * GB, {"bf16": 140e9, "fp32": 140e9}, 9 * GB,
        "a 2-core AMD EPYC (Zen 3) VM of 24 GiB: 18 GB/s DRAM reads, 140 GFLOP/s of int16 "
        "activations over 4-bit blocks (docs/benchmarks.md)", is_cpu=True, combine="sum",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Link:
    """What joins the ranks of a tensor-parallel group: each device's bandwidth one way, and the
    fixed cost of one collective call (launch, synchronisation, the first hop)."""

    name: str
    bandwidth: float  # bytes/s, per device, one way
    latency_s: float
    source: str


_ASSUMED = "latency assumed, not measured here"
LINKS: dict[str, Link] = {
    "nvlink4": Link("nvlink4", 450 * GB, 8e-6,
                    f"H100 SXM NVLink 4: 900 GB/s per GPU both ways together; NCCL-class "
                    f"all-reduce of small messages ({_ASSUMED})"),
    "pcie5": Link("pcie5", 50 * GB, 20e-6,
                  f"PCIe Gen5 x16 between GPUs: 64 GB/s raw, ~50 effective ({_ASSUMED})"),
    "eth100": Link("eth100", 12.5 * GB, 50e-6,
                   f"100 Gb/s Ethernet between CPU nodes (gloo over TCP; {_ASSUMED})"),
    "eth25": Link("eth25", 3.125 * GB, 50e-6,
                  f"25 Gb/s Ethernet between CPU nodes (gloo over TCP; {_ASSUMED})"),
    "eth10": Link("eth10", 1.25 * GB, 100e-6,
                  f"10 Gb/s Ethernet between CPU nodes (gloo over TCP; {_ASSUMED})"),
}  # fmt: skip


def resolve_link(name: str) -> Link:
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r}: one of {', '.join(LINKS)}")
    return LINKS[name]


def _best_rate(fn, work: float, repeats: int, sync=lambda: None) -> float:
    """Work per second of the fastest of `repeats` timed calls (after one warm-up); `sync` waits
    for the device, whose work is asynchronous."""
    fn()
    sync()
    return work / min(_timed(fn, sync) for _ in range(repeats))


def measure_local(memory_bytes: int | None = None, device: str = "cpu") -> HardwareProfile:
    """Measures this machine's `device` ("cpu" or "cuda") now: read bandwidth (a sum over an
    array far beyond the caches) and matmul throughput in bf16 and fp32. Takes a few seconds."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return _measure_cuda(dev, memory_bytes)
    big = torch.ones(128 * 2**20, dtype=torch.float32)  # 512 MiB
    bandwidth = _best_rate(lambda big=big: big.sum(), big.numel() * 4, 5)
    del big
    flops = {name: _cpu_matmul_rate(dtype)
             for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))}  # fmt: skip
    if memory_bytes is None:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return HardwareProfile(
        name="local-cpu",
        memory_bytes=memory_bytes,
        memory_bw=bandwidth,
        flops=flops,
        host_link_bw=bandwidth / 2,  # swap is a copy within the same memory
        source=f"measured on this machine ({torch.get_num_threads()} threads)",
        is_cpu=True,
    )


def _cpu_matmul_rate(dtype, largest: int = 2048, slow_s: float = 0.05) -> float:
    """Square matmul FLOP/s. The size doubles from 256 up to `largest` while a product takes
    under `slow_s`: a CPU without native bf16 emulates it at ~1 GFLOP/s, where 2048-cubed
    products would take minutes to time instead of a second."""
    import torch

    n = 256
    while True:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        took = min(_timed(lambda a=a, b=b: a @ b) for _ in range(2))  # the first may warm up
        if n >= largest or took > slow_s:
            return _best_rate(lambda a=a, b=b: a @ b, 2.0 * n**3, 5)
        n *= 2


def _timed(fn, sync=lambda: None) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _measure_cuda(dev, memory_bytes: int | None) -> HardwareProfile:
    """The GPU's HBM read bandwidth (sum over 2 GiB), bf16/fp32 matmul rates (8192-cubed, random
    data: zeros run faster) and pinned host -> device copy rate (swap)."""
    import torch

    def sync() -> None:
        torch.cuda.synchronize(dev)

    big = torch.ones(512 * 2**20, dtype=torch.float32, device=dev)  # 2 GiB
    bandwidth = _best_rate(lambda big=big: big.sum(), big.numel() * 4, 10, sync)
    del big
    flops = {}
    n = 8192
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        flops[name] = _best_rate(lambda a=a, b=b: a @ b, 2.0 * n**3, 10, sync)
        del a, b
    host = torch.ones(64 * 2**20, dtype=torch.float32, pin_memory=True)  # 256 MiB
    on_device = torch.empty_like(host, device=dev)
    copy = lambda d=on_device, h=host: d.copy_(h, non_blocking=True)  # noqa: E731
    link = _best_rate(copy, host.numel() * 4, 5, sync)
    del host, on_device
    props = torch.cuda.get_device_properties(dev)
    return HardwareProfile(
        name="local-cuda",
        memory_bytes=memory_bytes or props.total_memory,
        memory_bw=bandwidth,
        flops=flops,
        host_link_bw=link,
        source=f"measured on this machine ({props.name})",
    )


def resolve_hardware(name: str) -> HardwareProfile:
    """A named profile, `local-cpu` (measured now), or a profile JSON file."""
    if name in PROFILES:
        return PROFILES[name]
    if name == "local-cpu":
        return measure_local()
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        return HardwareProfile.load(path)
    raise ValueError(
        f"unknown hardware {name!r}: one of {', '.join(PROFILES)}, local-cpu, or a profile "
        "JSON file (written by `inflight bench calibrate`)"
    )
