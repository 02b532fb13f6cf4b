"""Triton, imported the one way every kernel module of inflight needs it.

Without a GPU, importing this module turns on Triton's interpreter (`TRITON_INTERPRET=1`,
unless set otherwise) before Triton is first imported, so the kernels run on CPU tensors,
slowly: that is how the tests check them against the PyTorch reference on machines without
CUDA. Kernel modules import `triton` and `tl` from here, never directly.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read at Triton's first import

import triton
import triton.language as tl

__all__ = ["runs_here", "tl", "triton"]


def runs_here() -> bool:
    """Whether Triton kernels can run in this process: on a GPU, or under the interpreter, which
    works only if Triton was first imported with `TRITON_INTERPRET=1` (its own library functions
    are wrapped for the interpreter at import)."""
    return torch.cuda.is_available() or not isinstance(tl.sum, triton.JITFunction)
