"""KV groups: which layers' keys and values share a block table, so that sliding-window layers can
give back the blocks that fall out of their window while full-attention layers keep every one.

A model whose layers all attend alike (every Llama, Qwen, SmolLM2) is one group: a block holds a
block of tokens in every layer, as always. A model that mixes windowed and full layers (Gemma 2
and 3, gpt-oss) or windows every layer (Mistral) is split into groups of equal size, each of
layers with one window, and a page of the pool holds one block of tokens for one group's layers:

    Gemma 3 270M, 18 layers, every sixth global: 3 global + 15 windowed, groups of 3 layers
    group 0 (window None): layers 5, 11, 17      groups 1-5 (window 512): 0-2, 3-4-6, 7-9, ...

Each group has its own block table per request. A windowed group's table names, for the
positions before the window of the step's first query, the null block (`NULL_BLOCK`): those
pages went back to the pool. Full groups come first, so group 0 covers every position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NULL_BLOCK = -1  # a windowed group's entry for a page it gave back


@dataclass(frozen=True)
class KVLayout:
    group_windows: tuple[int | None, ...]  # group g's window in positions (None: every position)
    layer_group: tuple[int, ...]  # each layer's group
    layer_slot: tuple[int, ...]  # each layer's place among its page's layers

    @property
    def layers_per_page(self) -> int:
        return self.layer_group.count(0)

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)


def plan_kv_layout(layer_windows: Sequence[int | None]) -> KVLayout:
    """Groups of equal size (the greatest common divisor of the counts of layers of each
    window), full-attention layers first, each window's layers in order."""
    if not layer_windows:
        raise ValueError("a model has at least one layer")
    by_window: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        if window is not None and window < 1:
            raise ValueError(f"layer {layer}'s window must be positive, got {window}")
        by_window.setdefault(window, []).append(layer)
    size = math.gcd(*(len(layers) for layers in by_window.values()))
    windows = sorted(by_window, key=lambda w: (w is not None, w or 0))
    group_windows: list[int | None] = []
    layer_group = [0] * len(layer_windows)
    layer_slot = [0] * len(layer_windows)
    for window in windows:
        layers = by_window[window]
        for start in range(0, len(layers), size):
            for slot, layer in enumerate(layers[start : start + size]):
                layer_group[layer], layer_slot[layer] = len(group_windows), slot
            group_windows.append(window)
    return KVLayout(tuple(group_windows), tuple(layer_group), tuple(layer_slot))
