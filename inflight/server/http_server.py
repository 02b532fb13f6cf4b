"""uvicorn, plus two things it leaves out: a deadline on each request's head, and a shutdown that
lets requests finish.

- uvicorn times out an idle keep-alive connection only after a response, so a client that
  connects and sends nothing, or trickles its headers a byte at a time, holds a connection
  forever. `head_timeout_protocol` closes a connection whose request head is not complete
  `read_timeout` seconds after it opened or after its last response ended. (A stalled body is
  `middleware.RequestLimits`' 408.)
- On SIGTERM or SIGINT, `InflightServer` drains: new requests get 503, requests in flight get
  up to `shutdown_timeout` seconds to finish, the rest are aborted with an error (an error chunk
  for a stream), and the process exits 0. uvicorn alone waits on open streams without bound and
  then re-raises the signal, so the process ends "killed". A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from inflight.engine.client import EngineClient
from inflight.server.api_server import ServerConfig

logger = logging.getLogger(__name__)


def head_timeout_protocol(timeout: float) -> type[H11Protocol]:
    class HeadTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request head arrived
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # first: a pipelined request handled inside disarms it again
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _timed_out(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

    return HeadTimeoutProtocol


class InflightServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, engine: EngineClient, shutdown_timeout: float
    ) -> None:
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task | None = None

    async def startup(self, sockets: list | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self._draining is not None or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_draining)

    def _start_draining(self) -> None:
        if self._draining is None:
            self._draining = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        logger.info("shutting down: in-flight requests get up to %g s to finish",
                    self.shutdown_timeout)  # fmt: skip
        cut = await self.engine.drain(self.shutdown_timeout)
        if cut:
            logger.warning("shutdown timeout: aborted %d unfinished requests", cut)
        self.should_exit = True


def serve(app: FastAPI, engine: EngineClient, config: ServerConfig) -> None:
    """Serves until SIGTERM/SIGINT, then drains (see the module docstring) and returns."""
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        http=head_timeout_protocol(config.read_timeout),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=5,  # after the drain, only finished streams remain
    )
    InflightServer(uv_config, engine, config.shutdown_timeout).run()
