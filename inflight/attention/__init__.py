"""Paged attention backends behind one interface.

`TorchReferenceBackend` is pure PyTorch and is the oracle every faster backend is tested against;
`CpuKernelBackend` computes decodes and prompt chunks with C++ kernels over the paged cache, and
`triton_decode.TritonBackend` (imported on demand: it needs Triton) decodes with a Triton kernel
for CUDA GPUs; `make_backend` chooses.
"""

from inflight.attention.cpu_kernel import CpuKernelBackend, make_backend
from inflight.attention.torch_ref import AttentionMetadata, TorchReferenceBackend

__all__ = ["AttentionMetadata", "CpuKernelBackend", "TorchReferenceBackend", "make_backend"]
