"""Paged attention backends behind one interface.

`TorchReferenceBackend` is pure PyTorch and is the oracle every faster backend is tested against.
"""

from inflight.attention.torch_ref import AttentionMetadata, TorchReferenceBackend

__all__ = ["AttentionMetadata", "TorchReferenceBackend"]
