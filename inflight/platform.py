"""Device and dtype choice: bfloat16 where the hardware computes it natively, else float32."""

from __future__ import annotations

import functools

import torch

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags in /proc/cpuinfo (x86 `flags`, Arm `Features`), or none."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith(("flags", "Features"))), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 instructions (AVX512-BF16 or AMX)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def describe_device(device: torch.device) -> str:
    """What a benchmark ran on, for its report: the GPU's name, or the CPU's model and threads."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return f"cpu: {model} ({torch.get_num_threads()} threads)"
