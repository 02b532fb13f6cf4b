"""The engine thread and its loop: drain the inbox, step, publish.

`AsyncLLM` talks to the core only through typed messages put in the loop's inbox; the loop runs
on `EngineThread`, the one thread that also built the core (`async_engine`'s docstring says
why every PyTorch op of an engine runs on one thread). The loop blocks only while the core has
nothing to do; then a message (or, while a dashboard watches, its refresh) wakes it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from inflight.core.outputs import EngineCoreOutput
from inflight.engine.engine_core import EngineCore
from inflight.metrics.stats import StepStats
from inflight.request import FinishReason, Request


@dataclass(frozen=True, slots=True)
class AddRequests:
    requests: list[Request]


@dataclass(frozen=True, slots=True)
class FinishRequests:
    """Ends requests (an abort, or a stop string the detokenizer found)."""

    request_ids: list[str]
    reason: FinishReason
    stop_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Wake:
    """Nothing to apply: an idle loop looks again (a dashboard opened or closed)."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The loop returns after applying what came before it."""


Message = AddRequests | FinishRequests | Wake | Shutdown


class LoopListener(Protocol):
    """What the loop tells its front end, on the engine thread."""

    def idle_wait_s(self) -> float | None:
        """How long an idle loop may block on its inbox (None: until a message comes)."""

    def on_iteration(self, outputs: list[EngineCoreOutput], stats: StepStats | None) -> None:
        """After every pass: the outputs of the messages and of the step, and the step's record
        (None when the core had nothing to step)."""


class EngineLoop:
    def __init__(self, core: EngineCore, listener: LoopListener) -> None:
        self.core, self.listener = core, listener
        self.inbox: queue.Queue[Message] = queue.Queue()

    def put(self, message: Message) -> None:
        """From any thread."""
        self.inbox.put(message)

    def run(self) -> None:
        """Until `Shutdown`; an exception (the model failing) ends the loop and propagates."""
        core = self.core
        while True:
            messages = self._next_messages()
            outputs: list[EngineCoreOutput] = []
            for m in messages:
                if isinstance(m, Shutdown):
                    return
                outputs.extend(self._apply(m))
            stats = None
            if core.has_unfinished_requests():
                result = core.step()
                outputs.extend(result.outputs)
                stats = result.stats
            self.listener.on_iteration(outputs, stats)

    def _next_messages(self) -> list[Message]:
        """Everything in the inbox; blocks for the first message only when the core is idle
        (and no longer than the listener allows)."""
        received: list[Message] = []
        if not self.core.has_unfinished_requests():
            try:
                received.append(self.inbox.get(timeout=self.listener.idle_wait_s()))
            except queue.Empty:
                return []
        while True:
            try:
                received.append(self.inbox.get_nowait())
            except queue.Empty:
                return received

    def _apply(self, message: Message) -> list[EngineCoreOutput]:
        if isinstance(message, AddRequests):
            for request in message.requests:
                self.core.add_request(request)
        elif isinstance(message, FinishRequests):
            return self.core.finish_requests(
                message.request_ids, message.reason, message.stop_reason
            )
        return []


class EngineThread:
    """One daemon thread that runs what it is handed, in order: the core's construction, then
    its loop. Daemon, so that an engine never started or shut down cannot hold up exit."""

    def __init__(self) -> None:
        self._calls: queue.Queue[tuple[Future[Any], Callable[[], Any]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name="inflight-engine", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((future, fn))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            self._run(*call)
            del call  # holds the engine (fn's closure) while this thread waits

    @staticmethod
    def _run(future: Future[Any], fn: Callable[[], Any]) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn())
            except BaseException as e:
                future.set_exception(e)
