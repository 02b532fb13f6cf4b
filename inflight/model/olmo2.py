"""OLMo 2 (`Olmo2ForCausalLM`, GGUF `olmo2`): EXAONE 4's layer (norms of the sublayers' outputs
alone) with its query and key norms each as wide as all their heads, not one head: each token's
queries are normalized together, then its keys. Split over tensor-parallel ranks, each rank's
heads are gathered with the others' for the norm (`Qwen3DecoderLayer._normalize_whole`).
OLMo 3 (`Olmo3ForCausalLM`, an `olmo2` file with a window) has the same layers, three windowed
with an unscaled RoPE of their own to each global one: config fields."""

from __future__ import annotations

from typing import ClassVar

from inflight.model.exaone4 import Exaone4DecoderLayer, Exaone4Model
from inflight.model.llama import DecoderLayer


class Olmo2DecoderLayer(Exaone4DecoderLayer):
    """EXAONE 4's layer (norms after the sublayers) with q/k norms as wide as all their heads
    (`cfg.qk_norms_span_heads`)."""


class Olmo2Model(Exaone4Model):
    layer_class: ClassVar[type[DecoderLayer]] = Olmo2DecoderLayer
