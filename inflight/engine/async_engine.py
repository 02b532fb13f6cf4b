"""AsyncLLM: the asyncio front of the engine, for the HTTP server (the offline `LLM`'s sibling
on the same `FrontEnd`).

The engine core steps on a thread of its own (`engine_loop.EngineThread`) and never waits on
HTTP. That thread also builds the core (loads, packs and warms the model): PyTorch's CPU ops run
OpenMP parallel regions, and a second thread running them would start a second OpenMP thread
pool; with more pool threads than cores, libgomp stops spinning between regions and puts its
workers to sleep, so every region pays a wake-up (docs/benchmarks.md, "One engine thread").
The asyncio side tokenizes and validates (raising before anything is queued), keeps one output
queue per request, runs the detokenizer and stop strings, and aborts a request in the core the
moment its consumer goes away (client disconnect, timeout). Messages cross threads in two
directions only:

    asyncio --(AddRequests / FinishRequests / Wake / Shutdown, the loop's inbox)--> engine thread
    engine thread --(outputs, loop.call_soon_threadsafe)--> asyncio

A request the step fails on alone ends with RequestFailedError and the others carry on; if the
model itself fails (or the loop does), the engine is dead: every open stream gets
EngineDeadError and new requests are refused, never left hanging. `drain` refuses new requests
and gives those in flight a deadline (graceful shutdown).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from inflight.core.outputs import EngineCoreOutput
from inflight.core.slo import QueueState, check_slo, needs_forecast
from inflight.engine.engine_loop import (
    AddRequests,
    EngineLoop,
    EngineThread,
    FinishRequests,
    Shutdown,
    Wake,
)
from inflight.engine.frontend import FrontEnd
from inflight.engine.processor import ParentRequest, PromptInput
from inflight.errors import (
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestFailedError,
    RequestTimeoutError,
    ShuttingDownError,
    SLOUnmetError,
)
from inflight.metrics.live import FinishedSample, LiveFeed
from inflight.metrics.prometheus import EngineMetrics
from inflight.metrics.stats import CoreGauges, StepStats
from inflight.outputs import RequestOutput
from inflight.request import DEFAULT_TENANT, NO_SLO, FinishReason, Request, SLOTarget
from inflight.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AsyncLLM(FrontEnd):
    def __init__(
        self,
        model: str | None = None,
        *,
        max_queued_requests: int | None = None,
        request_timeout: float | None = None,
        **knobs: Any,
    ) -> None:
        self._engine_thread = EngineThread()
        try:
            self._engine_thread.submit(lambda: FrontEnd.__init__(self, model, **knobs)).result()
        except BaseException:
            self._engine_thread.stop()
            raise
        # an engine dropped without shutdown ends its thread, and with it its OpenMP pool
        weakref.finalize(self, self._engine_thread.stop)
        self.max_queued_requests = max_queued_requests
        self.request_timeout = request_timeout
        self.metrics = EngineMetrics(self.knobs())
        self.metrics.weight_bytes.set(self.core.loaded.weight_bytes)
        self.metrics.kv_cache_bytes.set(self.core.kv_cache.num_bytes)
        state = self.core.runner.conv_state
        self.metrics.sequence_state_bytes.set(0 if state is None else state.num_bytes)
        self.feed = LiveFeed()  # the dashboard's data
        # the core's gauges as the engine thread last published them: what other threads read
        # of the core (a frozen record, swapped whole)
        self._gauges: CoreGauges = self.core.gauges()
        # the queue as SLO admission reads it, published likewise once a TTFT target may be
        # met or missed (a default one, or the first request with its own: building it every
        # step costs up to a few ms), the requests the core has taken in, and those submitted
        # since with their count since the start (to tell which the state already holds)
        scheduler_config = self.config.scheduler
        self._wants_forecasts = scheduler_config.slo_ttft is not None
        self._queue_state: QueueState | None = None
        self._num_added = 0
        self._unseen: collections.deque[tuple[int, Request]] = collections.deque()
        self._num_submitted = 0
        self._engine_loop = EngineLoop(self.core, self)
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._last_token_time: dict[str, float] = {}
        self._num_unfinished = 0  # sequences accepted and not yet finished (asyncio side)
        self._ids = itertools.count()
        # One thread for tokenizing and chat templates: off the event loop (the Rust tokenizer
        # releases the GIL), and one at a time (a shared fast tokenizer is not re-entrant).
        self._tokenizer_pool = ThreadPoolExecutor(1, thread_name_prefix="inflight-tokenizer")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: Future[None] | None = None  # the engine loop, once started
        self.dead_error: BaseException | None = None
        self.draining = False

    # ------------------------------------------------------------ lifecycle
    def knobs(self) -> dict[str, Any]:
        """Every knob in effect, resolved values included (for the info metric and logs)."""
        cfg = self.core.config
        knobs: dict[str, Any] = {}
        for part in (cfg.model, cfg.cache, cfg.scheduler):
            knobs.update({f.name: getattr(part, f.name) for f in dataclasses.fields(part)})
        knobs.update(
            model=self.core.loaded.path.name,  # a name: /metrics shows no file system paths
            # nor a template's text: whether one replaces the model's
            chat_template=None if cfg.model.chat_template is None else "custom",
            num_kv_blocks=self.core.kv_cache.num_blocks,
            dtype=str(self.core.dtype).removeprefix("torch."),
            device=str(self.core.device),
            max_queued_requests=self.max_queued_requests,
            request_timeout=self.request_timeout,
        )
        return knobs

    async def start(self) -> None:
        if self._running is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._publish_state(time.monotonic())
        self._running = self._engine_thread.submit(self._run_engine)

    async def shutdown(self) -> None:
        if self._running is None:
            return
        self._engine_loop.put(Shutdown())
        # the loop ends; the thread stays for a later start() and ends with the engine
        await asyncio.to_thread(futures.wait, [self._running], 10)
        self._running = None
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    async def drain(self, timeout: float) -> int:
        """Refuses new requests, waits up to `timeout` seconds for those in flight to finish,
        then ends the rest with ShuttingDownError (an error chunk for a stream). Returns how
        many were cut short."""
        self.draining = True
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        cut = len(self._streams)
        error = ShuttingDownError(f"the server shut down ({timeout:g} s shutdown timeout)")
        for stream in list(self._streams.values()):
            stream.put_nowait(error)
        deadline = time.monotonic() + 5
        while self._streams and time.monotonic() < deadline:  # consumers abort as they leave
            await asyncio.sleep(0.01)
        return cut

    @property
    def is_alive(self) -> bool:
        return self.dead_error is None and self._running is not None and not self._running.done()

    def clock(self) -> float:
        """The clock of the feed's timestamps."""
        return time.monotonic()

    # --------------------------------------------------------- engine thread
    def _run_engine(self) -> None:
        try:
            self._engine_loop.run()
        except BaseException as e:
            logger.exception("engine loop failed")
            self.dead_error = e
            assert self._loop is not None, "start() sets the loop before the thread starts"
            self._loop.call_soon_threadsafe(self._fail_all, e)

    def idle_wait_s(self) -> float | None:
        """An idle engine thread still refreshes a watching dashboard's detail."""
        return 0.25 if self.feed.watchers else None

    def on_iteration(self, outputs: list[EngineCoreOutput], stats: StepStats | None) -> None:
        """The engine loop's news: step records to the metrics and the feed, the core's state
        (after a step or after messages alone, an abort on an idle engine, so the gauges never
        keep the values of the last step), and the outputs to the asyncio side."""
        if stats is not None:
            self.metrics.observe_step(stats)
            self.feed.add_step(stats)
        self._publish_state(time.monotonic())
        if outputs:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _publish_state(self, now: float) -> None:
        """The gauges, and while a dashboard watches, the block map and request table."""
        if self.feed.wants_detail(now):
            snapshot = self.core.snapshot(now)
            self.feed.set_detail(snapshot, now)
            self._gauges = snapshot.gauges
        else:
            self._gauges = self.core.gauges()
        scheduler = self.core.scheduler
        self._num_added = scheduler.num_added
        if self._wants_forecasts and self.config.scheduler.slo_admission == "refuse":
            self._queue_state = scheduler.queue_state()
        self.metrics.observe_state(self._gauges)

    @property
    def num_unfinished_sequences(self) -> int:
        """Running and waiting sequences as last published: a router's measure of load."""
        return self._gauges.num_running + self._gauges.num_waiting

    def watch(self, delta: int) -> None:
        """A dashboard opened (+1) or closed (-1): the engine thread keeps the block map and the
        request table fresh while any is open, idle or not."""
        self.feed.watchers += delta
        self._engine_loop.put(Wake())

    # ------------------------------------------------------------- asyncio side
    def _deliver(self, outputs: list[EngineCoreOutput]) -> None:
        now = time.monotonic()
        for out in outputs:
            if out.new_token_ids and out.request_id in self._last_token_time:
                gap = now - self._last_token_time[out.request_id]
                self.metrics.observe_tokens(gap, len(out.new_token_ids))
            self._last_token_time[out.request_id] = now
            if out.finished:
                self._last_token_time.pop(out.request_id, None)
        request_outputs, stopped = self.output_processor.process_outputs(outputs)
        for request_id, stop_string in stopped.items():
            self._engine_loop.put(FinishRequests([request_id], FinishReason.STOP, stop_string))
        for ro in request_outputs:
            # (a finished request leaves the map here too, in case its stream was never read)
            if ro.finished:
                stream = self._streams.pop(ro.request_id, None)
            else:
                stream = self._streams.get(ro.request_id)
            if ro.finished:
                self._num_unfinished -= len(ro.outputs)
                self.metrics.observe_finished(ro)
                self._feed_finished(ro, now)
            if stream is not None:
                stream.put_nowait(ro)

    def _feed_finished(self, out: RequestOutput, now: float) -> None:
        m = out.metrics
        num_output = sum(len(c.token_ids) for c in out.outputs)
        tpot = None
        if m.ttft is not None and m.e2e_latency is not None and num_output > len(out.outputs):
            tpot = (m.e2e_latency - m.ttft) / (num_output - len(out.outputs))
        self.feed.add_finished(FinishedSample(
            t=now, queue_s=m.queue_time, ttft_s=m.ttft, tpot_s=tpot, e2e_s=m.e2e_latency,
            prompt_tokens=len(out.prompt_token_ids), output_tokens=num_output,
        ))  # fmt: skip

    def _fail_all(self, error: BaseException) -> None:
        dead = EngineDeadError(f"the engine loop failed: {type(error).__name__}: {error}")
        for stream in self._streams.values():
            stream.put_nowait(dead)

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
    ) -> tuple[ParentRequest, list[Request]]:
        """Tokenizes and validates now; raises InvalidRequestError before anything is queued.
        `embed`: the prompt's vector is asked for (an embedding model's request); `tenant`:
        whose share it uses under `fair` scheduling; `slo`: its latency targets."""
        return self.input_processor.process(
            f"req-{next(self._ids)}", prompt, params, priority=priority,
            add_special_tokens=add_special_tokens, cache_salt=cache_salt, embed=embed,
            tenant=tenant, slo=slo,
        )  # fmt: skip

    async def run_tokenizer(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs `fn(*args)` (tokenizing, rendering a chat) on the tokenizer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenizer_pool, functools.partial(fn, *args))

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text that could fit the context (longer texts are refused untokenized)."""
        return self.input_processor.tokenize(text, add_special_tokens)[1]

    def _count_refusal(self, reason: str) -> None:
        """A request refused (queue full) or cut by the timeout: for /metrics and the dashboard."""
        self.metrics.rejected.labels(reason=reason).inc()
        self.feed.add_refusal(time.monotonic(), reason)

    def check_capacity(self, num_sequences: int = 1) -> None:
        """Raises EngineDeadError, or QueueFullError if `num_sequences` more (a request with `n`
        samples is n) would overflow the waiting queue; call before `submit` so a refusal is an
        HTTP status, not a broken stream."""
        if self.draining:
            raise ShuttingDownError("the server is shutting down")
        if not self.is_alive:
            raise EngineDeadError("the engine is not running")
        if self.max_queued_requests is None:
            return
        if num_sequences > self.max_queued_requests:
            raise InvalidRequestError(
                f"{num_sequences} sequences (prompts x n) exceed the server's queue bound of "
                f"{self.max_queued_requests}", "n",
            )  # fmt: skip
        num_waiting = self._num_unfinished - self._gauges.num_running
        if num_waiting + num_sequences > self.max_queued_requests:
            self._count_refusal("queue_full")
            raise QueueFullError(
                f"the waiting queue is full ({self.max_queued_requests} sequences); retry later"
            )

    def check_slo(self, processed: list[tuple[ParentRequest, list[Request]]]) -> None:
        """Raises SLOUnmetError when SLO admission predicts that one of these requests (queued
        in order) would miss its TTFT target: from the queue the engine thread last published
        and what was submitted since, on this thread, so the refusal never waits for a step.
        Until the engine thread has published a queue, everything is admitted."""
        self._check_slo([c for _, children in processed for c in children])

    def check_queue_slo(self, slo: SLOTarget) -> None:
        """Before tokenizing: raises SLOUnmetError when even a one-token prompt with these
        targets (the engine's where unset) would miss its TTFT target behind the queue, so that
        under overload a refusal costs no tokenizing (a longer prompt only comes later)."""
        probe = Request("slo-probe", [0], SamplingParams(max_tokens=1),
                        slo=slo.over(self.config.scheduler.default_slo))  # fmt: skip
        self._check_slo([probe])

    def _check_slo(self, requests: list[Request]) -> None:
        if not self._wants_forecasts and needs_forecast(requests, self.config.scheduler):
            self._wants_forecasts = True  # the engine thread publishes the queue from now on
            self._engine_loop.put(Wake())
        state = self._queue_state
        if state is None:
            return
        self._forget_unseen(state.num_added)
        try:
            check_slo(state, requests, time.monotonic(), self.config.scheduler,
                      [r for _, r in self._unseen])  # fmt: skip
        except SLOUnmetError:
            self._count_refusal("slo_unmet")
            raise

    def _forget_unseen(self, num_added: int) -> None:
        """Drops the submitted requests among the first `num_added` the core took in."""
        while self._unseen and self._unseen[0][0] < num_added:
            self._unseen.popleft()

    def submit(
        self, processed: tuple[ParentRequest, list[Request]]
    ) -> AsyncGenerator[RequestOutput, None]:
        """Queues a processed request now and returns its stream of cumulative snapshots.

        The stream raises EngineDeadError or RequestTimeoutError; closing it early aborts the
        request in the core (its blocks return within a step).
        """
        parent, children = processed
        stream: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[parent.request_id] = stream
        self.output_processor.register(parent, children)
        self._num_unfinished += len(children)
        self._forget_unseen(self._num_added)
        for child in children:
            self._unseen.append((self._num_submitted, child))
            self._num_submitted += 1
        self._engine_loop.put(AddRequests(children))
        return self._outputs(parent.request_id, [c.request_id for c in children], stream)

    async def generate(
        self, prompt: PromptInput, params: SamplingParams, **kwargs: Any
    ) -> AsyncGenerator[RequestOutput, None]:
        """process + check_capacity + submit, for callers that want one call."""
        processed = self.process(prompt, params, **kwargs)
        self.check_capacity(len(processed[1]))
        self.check_slo([processed])
        async for out in self.submit(processed):
            yield out

    async def _outputs(
        self, request_id: str, child_ids: list[str], stream: asyncio.Queue
    ) -> AsyncGenerator[RequestOutput, None]:
        deadline = None if self.request_timeout is None else time.monotonic() + self.request_timeout
        finished = False
        try:
            while True:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = await asyncio.wait_for(stream.get(), timeout)
                except TimeoutError:
                    self._count_refusal("timeout")
                    raise RequestTimeoutError(
                        f"request {request_id} exceeded the {self.request_timeout:g} s request "
                        "timeout and was aborted"
                    ) from None
                if isinstance(item, BaseException):
                    raise item
                failed = [c for c in item.outputs if c.finish_reason == FinishReason.ERROR]
                if failed:
                    finished = item.finished
                    raise RequestFailedError(
                        f"request {request_id} failed in the engine: {failed[0].stop_reason}"
                    )
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.abort(child_ids)

    def abort(self, child_request_ids: list[str]) -> None:
        """Ends requests in the core (their blocks return within one step)."""
        self._engine_loop.put(FinishRequests(child_request_ids, FinishReason.ABORT))
