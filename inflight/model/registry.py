"""The model class of each architecture (`LlamaArchConfig.architecture`): the Llama decoder
serves Llama, Mistral, Ministral 3, Qwen2, Granite, SmolLM3 and Seed-OSS (their differences
are config fields); a family with layers or checkpoint weights of its own has a module that
subclasses it. How a family is added: docs/architecture.md, "Adding a model family"."""

from __future__ import annotations

from inflight.model.arcee import ArceeModel
from inflight.model.arch import LlamaArchConfig
from inflight.model.deepseek import DeepseekModel
from inflight.model.exaone import ExaoneModel
from inflight.model.exaone4 import Exaone4Model
from inflight.model.gemma import Gemma2Model, Gemma3Model, GemmaModel
from inflight.model.glm4 import Glm4Model
from inflight.model.gpt_oss import GptOssModel
from inflight.model.hunyuan import HunyuanModel
from inflight.model.lfm2 import Lfm2Model, Lfm2MoeModel
from inflight.model.llama import LlamaModel
from inflight.model.moe import (
    Ernie45MoeModel,
    Glm4MoeModel,
    Glm4MoeQkNormModel,
    GraniteMoeModel,
    HunyuanMoeModel,
    MiniMaxM2Model,
    MixtralModel,
    OlmoeModel,
    Qwen2MoeModel,
    Qwen3MoeModel,
)
from inflight.model.olmo2 import Olmo2Model
from inflight.model.phi3 import Phi3Model
from inflight.model.qwen3 import Qwen3Model
from inflight.model.qwen3_5 import Qwen3_5Model, Qwen3_5MoeModel, Qwen3NextModel
from inflight.model.rotary_pairs import PairRotaryModel

MODEL_CLASSES: dict[str, type[LlamaModel]] = {
    "llama": LlamaModel,
    "mistral": LlamaModel,
    "qwen2": LlamaModel,
    "granite": LlamaModel,
    "smollm3": LlamaModel,
    "ministral3": LlamaModel,  # (its query temperature is a config field)
    "qwen3": Qwen3Model,
    "qwen3_moe": Qwen3MoeModel,
    "qwen2_moe": Qwen2MoeModel,
    "glm4_moe": Glm4MoeModel,
    "ernie4_5_moe": Ernie45MoeModel,
    "minimax_m2": MiniMaxM2Model,
    "hunyuan_moe": HunyuanMoeModel,
    "olmoe": OlmoeModel,
    "granitemoe": GraniteMoeModel,
    "dots1": Glm4MoeQkNormModel,  # (GLM-4.5's experts beside Qwen3's attention)
    "mixtral": MixtralModel,
    "phi3": Phi3Model,
    "gemma": GemmaModel,
    "gemma2": Gemma2Model,
    "gemma3": Gemma3Model,
    "gpt_oss": GptOssModel,
    "exaone4": Exaone4Model,
    "exaone": ExaoneModel,
    "olmo2": Olmo2Model,
    "olmo3": Olmo2Model,  # (its windows and their RoPE are config fields)
    "glm4": Glm4Model,
    "ernie4_5": PairRotaryModel,  # (the Llama decoder, its rotary rows reordered at load)
    "seed_oss": LlamaModel,
    "arcee": ArceeModel,
    "hunyuan_dense": HunyuanModel,
    "deepseek_v2": DeepseekModel,
    "deepseek_v3": DeepseekModel,
    "glm4_moe_lite": DeepseekModel,  # (GLM-4.7-Flash: DeepSeek-V3's layers, GLM's names)
    "lfm2": Lfm2Model,
    "lfm2_moe": Lfm2MoeModel,
    "qwen3_5": Qwen3_5Model,
    "qwen3_5_moe": Qwen3_5MoeModel,
    "qwen3_next": Qwen3NextModel,
}


def model_class(arch: LlamaArchConfig) -> type[LlamaModel]:
    if arch.architecture == "glm4_moe" and arch.qk_norm:  # (a config field picks its layer)
        return Glm4MoeQkNormModel
    return MODEL_CLASSES[arch.architecture]
