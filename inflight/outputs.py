"""What the public APIs return: RequestOutput with one CompletionOutput per sample (`n`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inflight.core.outputs import Logprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    # the stop token id or stop string that ended it; for "error", the error's description
    stop_reason: int | str | None = None
    logprobs: list[Logprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def copy(self) -> CompletionOutput:
        """A snapshot whose lists are its own: tokens and logprobs of later steps do not show up
        in it. Written out, not `dataclasses.replace` (several times slower): it runs for every
        running request every step."""
        logprobs = None if self.logprobs is None else self.logprobs.copy()
        return CompletionOutput(self.index, self.text, self.token_ids.copy(), self.finish_reason,
                                self.stop_reason, logprobs)  # fmt: skip


@dataclass
class RequestMetrics:
    """Monotonic timestamps (seconds); derived latencies are None until they happened."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0

    def copy(self) -> RequestMetrics:
        return RequestMetrics(self.arrival_time, self.first_scheduled_time, self.first_token_time,
                              self.finished_time, self.num_preemptions)  # fmt: skip

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(0.0))
    # where asked for (`SamplingParams.prompt_logprobs`), once the first token is out: an entry
    # per prompt token, None for the first (nothing before it scores it)
    prompt_logprobs: list[Logprobs | None] | None = None
    # an embedding model's vector of the prompt (pooled and L2-normalized), once it is done
    embedding: list[float] | None = None
    # prompt tokens served from the prefix cache (of n samples, the fewest any found: the
    # prompt is computed once, by the sample admitted first)
    num_cached_tokens: int = 0
