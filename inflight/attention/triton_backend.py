"""TritonBackend: the reference backend's cache layout (token-major, `torch_ref.py`), with
decodes (`triton_decode.py`) and prompt chunks (`triton_prefill.py`) computed by Triton kernels
that read it in place, one launch per layer for each; 8-bit caches written by one Triton launch
(`triton_kv_rows.py`). For CUDA GPUs; without one, under Triton's interpreter."""

from __future__ import annotations

import logging

import torch

from inflight.attention.backend import is_scaled
from inflight.attention.paged_kernels import PagedKernelBackend
from inflight.attention.triton_decode import check_block_size, paged_decode_attention
from inflight.attention.triton_kv_rows import write_scaled_rows
from inflight.attention.triton_prefill import paged_prefill_attention
from inflight.attention.triton_runtime import runs_here

logger = logging.getLogger(__name__)


class TritonBackend(PagedKernelBackend):
    """The reference backend's cache layout, with decodes and prompt chunks computed by Triton
    kernels that read it in place (one launch per layer for each)."""

    name = "triton"
    triton_kernels = True
    takes_sinks = True
    decode_kernel = staticmethod(paged_decode_attention)
    prefill_kernel = staticmethod(paged_prefill_attention)

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        if not runs_here():
            raise RuntimeError(
                "no GPU, and Triton was imported before its interpreter was turned on: set "
                "TRITON_INTERPRET=1 before the process starts to run the Triton kernel on a CPU"
            )
        check_block_size(block_size)
        self.interpreted = not torch.cuda.is_available()
        if self.interpreted:
            logger.warning("no GPU: the Triton attention kernels run under Triton's interpreter")

    def write_cache(self, k_cache, v_cache, key, value, slot_mapping) -> None:
        if is_scaled(k_cache.dtype):
            write_scaled_rows(k_cache, v_cache, key, value, slot_mapping)
        else:
            super().write_cache(k_cache, v_cache, key, value, slot_mapping)
