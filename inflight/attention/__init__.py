"""Paged attention backends behind one interface.

`TorchReferenceBackend` is pure PyTorch and is the oracle every faster backend is tested against;
`CpuKernelBackend` computes decodes with a C++ kernel over the paged cache (`make_backend`
chooses).
"""

from inflight.attention.cpu_kernel import CpuKernelBackend, make_backend
from inflight.attention.torch_ref import AttentionMetadata, TorchReferenceBackend

__all__ = ["AttentionMetadata", "CpuKernelBackend", "TorchReferenceBackend", "make_backend"]
