"""Request: the core's record of one sequence (prompt, outputs, progress, timestamps).

Invariant: `num_computed_tokens <= num_tokens`; tokens in `[num_computed_tokens, num_tokens)`
still need a forward pass. A decode has exactly one such token (the last sampled one); a prefill
(fresh or after a recompute preemption) has many.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

from inflight.sampling_params import SamplingParams

DEFAULT_TENANT = "default"  # whom a request belongs to when nobody says


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # its step failed on it alone; stop_reason holds the error


@dataclass(frozen=True, slots=True)
class SLOTarget:
    """Latency targets of a request, in seconds (`core/slo.py` uses them); None: no target
    of that kind."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s)):
            if value is not None and (
                isinstance(value, bool)
                or not (isinstance(value, int | float) and math.isfinite(value) and value > 0)
            ):
                raise ValueError(f"SLO {name} must be a positive finite number, got {value!r}")

    def __bool__(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def over(self, defaults: SLOTarget) -> SLOTarget:
        """These targets, each missing one taken from `defaults`."""
        return SLOTarget(self.ttft_s if self.ttft_s is not None else defaults.ttft_s,
                         self.tpot_s if self.tpot_s is not None else defaults.tpot_s)  # fmt: skip


NO_SLO = SLOTarget()  # a request without latency targets


@dataclass(slots=True)
class Logprobs:
    """Log-probabilities at one position: the sampled token's, and the top-N alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1 = most likely
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    cache_salt: str | None = None  # requests with different salts never share cached blocks
    tenant: str = DEFAULT_TENANT  # whose share of the engine it uses (`fair` scheduling)
    slo: SLOTarget = NO_SLO  # its latency targets
    grammar: Any = None  # the compiled constraint of its structured output (xgrammar), or None

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    # prompt tokens whose KV its first admission found in the prefix cache
    num_cached_tokens: int = 0
    # scores of prompt tokens 1, 2, ... so far, where its sampling params ask for them
    prompt_logprobs: list[Logprobs] = field(default_factory=list)

    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_decoding(self) -> bool:
        """Past its prompt: one known token left to compute, the one it sampled last."""
        return self.num_tokens - self.num_computed_tokens == 1

    @property
    def lacks_prompt_logprobs(self) -> bool:
        """It wants prompt logprobs and has not scored every prompt token yet: its prompt must
        be computed, not taken from the prefix cache."""
        wanted = self.sampling_params.prompt_logprobs is not None
        return wanted and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def tokens_left(self, max_model_len: int) -> int:
        """Tokens the request may still sample (max_tokens, max_model_len)."""
        return min(self.sampling_params.max_tokens - self.num_output_tokens,
                   max_model_len - self.num_tokens)  # fmt: skip

    def stop_after(
        self, token_id: int, max_model_len: int
    ) -> tuple[FinishReason | None, int | None]:
        """Whether the request ends with `token_id`, just appended, and the stop token that
        ended it (EOS and stop ids count only after `min_tokens`; length limits always)."""
        params = self.sampling_params
        if self.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in self.eos_token_ids:
                return FinishReason.STOP, None
            if token_id in params.stop_token_ids:
                return FinishReason.STOP, token_id
        if self.num_output_tokens >= params.max_tokens or self.num_tokens >= max_model_len:
            return FinishReason.LENGTH, None
        return None, None
