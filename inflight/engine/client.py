"""What the HTTP server may ask of an engine: the contracts it is typed against.

- `EngineClient`: one engine as the server sees it. `AsyncLLM` implements it in-process; the
  Ray Serve gateway's `RemoteEngine` implements it over engine replicas.
- `FeedSource`: the narrow part the dashboard reads (a live feed, its clock, liveness), which
  a gateway's per-replica views implement too.
- `Replicas`: what a gateway adds (`FleetClient` = both); the server asks
  `isinstance(engine, Replicas)` to show replica counts and views.

Members are read-only properties and methods, so a plain attribute or a property implements
each.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from transformers import PreTrainedTokenizerBase

from inflight.engine.processor import ParentRequest, PromptInput
from inflight.metrics.live import LiveFeed
from inflight.model.generation_config import SamplingDefaults
from inflight.outputs import RequestOutput
from inflight.request import DEFAULT_TENANT, NO_SLO, Request, SLOTarget
from inflight.sampling_params import SamplingParams

Processed = tuple[ParentRequest, list[Request]]


class MetricsText(Protocol):
    def render(self) -> bytes:
        """The Prometheus text of every series."""


class FeedSource(Protocol):
    """One engine as the dashboard reads it."""

    @property
    def feed(self) -> LiveFeed: ...

    @property
    def is_alive(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    def clock(self) -> float:
        """Now, on the clock of the feed's timestamps."""

    def watch(self, delta: int) -> None:
        """A dashboard opened (+1) or closed (-1): keep the feed's detail fresh while any is."""


class EngineClient(FeedSource, Protocol):
    """One engine as the server uses it: facts of the model, the tokenizer, lifecycle, and
    requests (process -> check_capacity -> submit, each refusal a typed error)."""

    @property
    def model_path(self) -> Path: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def embedding_size(self) -> int | None:
        """Dimensions of the model's embeddings; None for a generative model."""

    @property
    def shorter_embeddings(self) -> bool:
        """Whether a client may ask for fewer dimensions (a Matryoshka-trained model)."""

    @property
    def num_kv_blocks(self) -> int: ...

    @property
    def sampling_defaults(self) -> SamplingDefaults:
        """The model's recommended sampling settings: what a request's unset fields take."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    @property
    def metrics(self) -> MetricsText: ...

    @property
    def dead_error(self) -> BaseException | None:
        """Why the engine stopped (None while it runs)."""

    def knobs(self) -> dict[str, Any]:
        """Every knob in effect, resolved values included."""

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    async def drain(self, timeout: float) -> int:
        """Refuses new requests; ends those still running after `timeout` s; returns how many
        were cut short."""

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str: ...

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    async def run_tokenizer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the tokenizer's thread, off the event loop."""

    def process(
        self,
        prompt: PromptInput,
        params: SamplingParams,
        *,
        priority: int = 0,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
        embed: bool = False,
        tenant: str = DEFAULT_TENANT,
        slo: SLOTarget = NO_SLO,
    ) -> Processed:
        """Validates and tokenizes; raises InvalidRequestError before anything is queued.
        `embed`: the prompt's vector is asked for (only an embedding model gives one)."""

    def check_capacity(self, num_sequences: int = 1) -> None:
        """Raises (queue full, dead, shutting down) before `submit`, so a refusal is a status."""

    def check_slo(self, processed: list[Processed]) -> None:
        """Raises SLOUnmetError when SLO admission refuses one of these requests (before
        `submit`, so the refusal is a 429)."""

    def check_queue_slo(self, slo: SLOTarget) -> None:
        """Raises SLOUnmetError, before tokenizing, when the queue alone would make a request
        with these targets miss its TTFT one."""

    def submit(self, processed: Processed) -> AsyncGenerator[RequestOutput, None]:
        """Queues the request; its stream of cumulative outputs. Closing it early aborts it."""


@runtime_checkable
class Replicas(Protocol):
    """What a gateway in front of engine replicas adds."""

    def replicas_up(self) -> int:
        """Engines that reported recently."""

    def replica_views(self) -> dict[str, FeedSource]:
        """Each engine's feed, by replica name."""


class FleetClient(EngineClient, Replicas, Protocol):
    """A gateway: one engine to the server, several behind it."""
