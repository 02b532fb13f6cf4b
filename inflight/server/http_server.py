"""uvicorn, plus what it leaves out: the HTTP edge's limits (`http_edge`: one deadline per
request, a connection cap, header limits, unambiguous framing) and a shutdown that lets requests
finish.

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

from inflight.engine.client import EngineClient
from inflight.server.api_server import ServerConfig
from inflight.server.http_edge import EdgeLimits, edge_protocol

logger = logging.getLogger(__name__)


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


def uvicorn_config(app: FastAPI, config: ServerConfig) -> uvicorn.Config:
    limits = EdgeLimits(read_timeout=config.read_timeout, max_connections=config.max_connections,
                        max_header_bytes=config.max_header_bytes,
                        max_headers=config.max_headers)  # fmt: skip
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        http=edge_protocol(limits),
        # h11's own bound on a head that arrives in pieces is left to `http_edge`'s, checked first
        h11_max_incomplete_event_size=config.max_header_bytes + 1,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=5,  # after the drain, only finished streams remain
    )


def serve(app: FastAPI, engine: EngineClient, config: ServerConfig) -> None:
    """Serves until SIGTERM/SIGINT, then drains (see the module docstring) and returns."""
    InflightServer(uvicorn_config(app, config), engine, config.shutdown_timeout).run()
