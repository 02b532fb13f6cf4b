"""Paged attention backends behind one protocol (`backend.AttentionBackend`).

`TorchReferenceBackend` (`torch_ref.py`) is pure PyTorch and is the oracle every faster backend
is tested against; `paged_kernels.PagedKernelBackend` is the plumbing of backends whose kernels
read the cache in place: `cpu_kernel.CpuKernelBackend` (C++ kernels) and
`triton_backend.TritonBackend` (Triton, for CUDA GPUs; imported on demand). `selector.make_backend`
chooses.
"""

from inflight.attention.backend import AttentionBackend
from inflight.attention.selector import make_backend
from inflight.attention.torch_ref import AttentionMetadata, TorchReferenceBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "TorchReferenceBackend", "make_backend"]
