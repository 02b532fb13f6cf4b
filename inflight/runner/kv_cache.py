"""Per-layer paged K/V tensors, laid out as the attention backend asks (`cache_shapes`; how many
blocks: `core/sizing.py`), in the model's dtype or the one `kv_cache_dtype` names. Block `b` is
index `b` of dim 0 in every layout. With `scratch_block` one block more is allocated, past the
pool's: the start-up warm-up and CUDA graphs' padding rows write there (engines always ask for
it), and windowed groups' null blocks name it.

With several KV groups (`core/kv_groups.py`) a block is a page of `layers_per_page` layers:
there are that many tensors, and each layer uses its slot's, over its group's pages.

Where a layer's values are its keys (latent attention) and the backend's kernels read them
there (`values_in_keys`), a slot holds the keys alone: its value tensor is a view of the same
memory, which halves the pool's bytes per token."""

from __future__ import annotations

from collections.abc import Callable

import torch

from inflight.attention import AttentionBackend
from inflight.attention.backend import SCALE_BYTES, is_scaled
from inflight.core.kv_groups import KVLayout
from inflight.errors import ConfigError
from inflight.huge_pages import zeros_on_huge_pages
from inflight.model.arch import LlamaArchConfig

KVPair = tuple[torch.Tensor, torch.Tensor]  # a layer's (keys, values)

# `kv_cache_dtype` names: bf16 halves a float32 engine's cache, the 8-bit ones (a float32 scale
# per position and head beside each row of keys or values) quarter it
KV_CACHE_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}


def resolve_kv_cache_dtype(asked: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type: the model's own for `auto`; another only under a float32 or
    bfloat16 model (the kernels read float16 caches with float16 queries alone)."""
    if asked == "auto":
        return model_dtype
    dtype = KV_CACHE_DTYPES[asked]
    if dtype != model_dtype and model_dtype not in (torch.float32, torch.bfloat16):
        raise ConfigError(
            f"kv_cache_dtype {asked} needs a float32 or bfloat16 model, not {model_dtype}"
        )
    return dtype


def values_in_keys(arch: LlamaArchConfig, attn: AttentionBackend, dtype: torch.dtype) -> bool:
    """Whether each layer's cache holds its keys alone, its values read out of them."""
    return arch.values_are_keys and attn.values_from_keys(arch.head_dim, dtype)


def kv_bytes_per_token(arch: LlamaArchConfig, dtype: torch.dtype, keys_alone: bool = False) -> int:
    """Key and value bytes of one token in every layer that attends, scales included
    (`keys_alone`: the keys' alone, where the values are read out of them)."""
    row = arch.head_dim * torch.empty((), dtype=dtype).element_size()
    row += SCALE_BYTES if is_scaled(dtype) else 0
    return (1 if keys_alone else 2) * len(arch.kv_layers) * arch.num_kv_heads * row


def kv_bytes_per_page_token(
    arch: LlamaArchConfig, dtype: torch.dtype, layout: KVLayout | None = None,
    keys_alone: bool = False,
) -> int:  # fmt: skip
    """Key and value bytes of one token in one page's layers: every layer's without groups."""
    kv_layers = len(arch.kv_layers)
    layers = layout.layers_per_page if layout is not None else kv_layers
    return kv_bytes_per_token(arch, dtype, keys_alone) // kv_layers * layers


class KVCache:
    def __init__(
        self,
        arch: LlamaArchConfig,
        attn: AttentionBackend,
        num_blocks: int,
        dtype: torch.dtype,
        device: torch.device,
        num_cpu_blocks: int = 0,
        scratch_block: bool = False,
        layout: KVLayout | None = None,
    ) -> None:
        block_size = attn.block_size
        allocated = num_blocks + scratch_block
        k_shape, v_shape = attn.cache_shapes(
            allocated, arch.num_kv_heads, arch.head_dim, scaled=is_scaled(dtype)
        )
        self.num_blocks = num_blocks  # the pool's; the scratch block is not among them
        self.scratch_block: int | None = num_blocks if scratch_block else None
        self.block_size = block_size

        # NOTE: zeroed, not left uninitialised: attention gathers whole blocks, so it reads
        # slots past a sequence's end, masked out; masked garbage could still be NaN, and
        # 0 * NaN = NaN. (The zeroing is mostly first-touch page faults paid here, not later.)
        # On the CPU, on huge pages where the OS offers them (huge_pages.py says why).
        def zeros(shape: tuple[int, ...]) -> torch.Tensor:
            if device.type == "cpu":
                return zeros_on_huge_pages(shape, dtype)
            return torch.zeros(shape, dtype=dtype, device=device)

        self.values_in_keys = values_in_keys(arch, attn, dtype)

        def pair(keys: torch.Tensor, values: Callable[[], torch.Tensor]) -> KVPair:
            return (keys, keys.view(keys.shape[:1] + v_shape[1:]) if self.values_in_keys
                    else values())  # fmt: skip

        kv_layers = len(arch.kv_layers)
        num_slots = layout.layers_per_page if layout is not None else kv_layers
        self.slots: list[KVPair] = [
            pair(zeros(k_shape), lambda: zeros(v_shape)) for _ in range(num_slots)
        ]
        slot_of = layout.layer_slot if layout is not None else range(kv_layers)
        # what each layer that attends (`arch.kv_layers`) reads and writes
        self.layers = [self.slots[slot] for slot in slot_of]
        self.num_bytes = (kv_bytes_per_page_token(arch, dtype, layout, self.values_in_keys)
                          * block_size * num_blocks)  # fmt: skip
        # Swap space in host memory (pinned when the device is a GPU, for fast copies). Left
        # unwritten: a block is read back only after it was swapped out, so its pages cost
        # neither time at start (zeroing 1 GiB: ~1 s a rank) nor memory until swapping uses them.
        pin = device.type == "cuda"

        def host(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.empty((num_cpu_blocks, *shape[1:]), dtype=dtype, pin_memory=pin)

        self.cpu_slots: list[KVPair] = [
            pair(host(k_shape), lambda: host(v_shape))
            for _ in range(num_slots if num_cpu_blocks else 0)
        ]

    def swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copies blocks device -> CPU, then CPU -> device (the order the scheduler relies on)."""
        for copies, to_cpu in ((swap_out, True), (swap_in, False)):
            if not copies:
                continue
            tensors = 1 if self.values_in_keys else 2  # (values in keys move with them)
            src = torch.tensor([a for a, _ in copies])
            dst = torch.tensor([b for _, b in copies])
            for device_kv, cpu_kv in zip(self.slots, self.cpu_slots, strict=True):
                for dev, host in zip(device_kv[:tensors], cpu_kv[:tensors], strict=True):
                    if to_cpu:
                        host[dst] = dev[src.to(dev.device)].to("cpu")
                    else:
                        dev[dst.to(dev.device)] = host[src].to(dev.device)
