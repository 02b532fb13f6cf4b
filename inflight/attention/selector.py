"""Which attention backend a model gets: `make_backend` picks by name and device."""

from __future__ import annotations

import logging

import torch

from inflight.attention.backend import AttentionBackend
from inflight.attention.torch_ref import TorchReferenceBackend
from inflight.errors import ConfigError

logger = logging.getLogger(__name__)


def make_backend(name: str, block_size: int, device: torch.device) -> AttentionBackend:
    """`torch` (the reference), `cpu` (the C++ kernels), `triton` (the Triton decode kernel) or
    `auto` (the C++ kernels on a CPU, Triton on a GPU, each when it can run, else the reference
    with a warning). A kernel named outright that cannot run is an error."""
    if name == "torch":
        return TorchReferenceBackend(block_size)
    if name == "cpu" and device.type != "cpu":
        raise ConfigError(
            f"the cpu attention backend (C++ kernels) reads host memory; the model is on "
            f"{device.type}: use triton or torch there"
        )
    if name == "auto":
        name = "cpu" if device.type == "cpu" else "triton"
        strict = False
    else:
        strict = True
    try:
        if name == "triton":  # Triton is imported only for it
            from inflight.attention.triton_backend import TritonBackend

            return TritonBackend(block_size)
        from inflight.attention.cpu_kernel import CpuKernelBackend

        return CpuKernelBackend(block_size)
    except Exception as e:
        if strict:
            raise
        logger.warning("%s attention kernel unavailable (%s); using the PyTorch reference", name, e)
        return TorchReferenceBackend(block_size)
