"""inflight: an LLM inference engine built on continuous batching and a paged KV cache."""

from inflight.errors import ConfigError, InflightError, InvalidRequestError, ModelLoadError
from inflight.outputs import CompletionOutput, RequestOutput
from inflight.sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "CompletionOutput",
    "ConfigError",
    "InflightError",
    "InvalidRequestError",
    "ModelLoadError",
    "RequestOutput",
    "SamplingParams",
]


def __getattr__(name: str):  # lazy: importing the package must not load torch-heavy modules
    if name == "LLM":
        from inflight.engine.llm import LLM

        return LLM
    raise AttributeError(name)
