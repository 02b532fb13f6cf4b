"""Per-layer paged K/V tensors, laid out as the attention backend asks (`cache_shapes`; how many
blocks: `core/sizing.py`), in the model's dtype or the one `kv_cache_dtype` names. Block `b` is
index `b` of dim 0 in every layout. With `scratch_block` one block more is allocated, past the
pool's: the start-up warm-up and CUDA graphs' padding rows write there (engines always ask for
it), and windowed groups' null blocks name it.

With several KV groups (`core/kv_groups.py`) a block is a page of `layers_per_page` layers:
there are that many tensors, and each layer uses its slot's, over its group's pages."""

from __future__ import annotations

import torch

from inflight.attention import AttentionBackend
from inflight.attention.backend import SCALE_BYTES, is_scaled
from inflight.core.kv_groups import KVLayout
from inflight.errors import ConfigError
from inflight.huge_pages import zeros_on_huge_pages
from inflight.model.arch import LlamaArchConfig

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


def kv_bytes_per_token(arch: LlamaArchConfig, dtype: torch.dtype) -> int:
    """Key and value bytes of one token in every layer, scales included."""
    row = arch.head_dim * torch.empty((), dtype=dtype).element_size()
    row += SCALE_BYTES if is_scaled(dtype) else 0
    return 2 * arch.num_layers * arch.num_kv_heads * row


def kv_bytes_per_page_token(
    arch: LlamaArchConfig, dtype: torch.dtype, layout: KVLayout | None = None
) -> int:
    """Key and value bytes of one token in one page's layers: every layer's without groups."""
    layers = layout.layers_per_page if layout is not None else arch.num_layers
    return kv_bytes_per_token(arch, dtype) // arch.num_layers * layers


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

        num_slots = layout.layers_per_page if layout is not None else arch.num_layers
        self.slots: list[tuple[torch.Tensor, torch.Tensor]] = [
            (zeros(k_shape), zeros(v_shape)) for _ in range(num_slots)
        ]
        slot_of = layout.layer_slot if layout is not None else range(arch.num_layers)
        self.layers = [self.slots[slot] for slot in slot_of]  # what each layer reads and writes
        self.num_bytes = kv_bytes_per_page_token(arch, dtype, layout) * block_size * num_blocks
        # Swap space in host memory (pinned when the device is a GPU, for fast copies). Left
        # unwritten: a block is read back only after it was swapped out, so its pages cost
        # neither time at start (zeroing 1 GiB: ~1 s a rank) nor memory until swapping uses them.
        pin = device.type == "cuda"
        self.cpu_slots: list[tuple[torch.Tensor, torch.Tensor]] = [
            (
                torch.empty((num_cpu_blocks, *k_shape[1:]), dtype=dtype, pin_memory=pin),
                torch.empty((num_cpu_blocks, *v_shape[1:]), dtype=dtype, pin_memory=pin),
            )
            for _ in range(num_slots if num_cpu_blocks else 0)
        ]

    def swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copies blocks device -> CPU, then CPU -> device (the order the scheduler relies on)."""
        for copies, to_cpu in ((swap_out, True), (swap_in, False)):
            if not copies:
                continue
            src = torch.tensor([a for a, _ in copies])
            dst = torch.tensor([b for _, b in copies])
            for device_kv, cpu_kv in zip(self.slots, self.cpu_slots, strict=True):
                for dev, host in zip(device_kv, cpu_kv, strict=True):
                    if to_cpu:
                        host[dst] = dev[src.to(dev.device)].to("cpu")
                    else:
                        dev[dst.to(dev.device)] = host[src].to(dev.device)
