"""A real uvicorn server on 127.0.0.1 and a random free port, in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from inflight.engine.async_engine import AsyncLLM
from inflight.server.api_server import ServerConfig, build_app
from inflight.server.http_server import uvicorn_config


class LiveServer:
    def __init__(self, engine: AsyncLLM, **config: Any) -> None:
        self.engine = engine
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.config = ServerConfig(host="127.0.0.1", port=self.port, **config)
        self.app = build_app(engine, self.config)
        self.server = uvicorn.Server(uvicorn_config(self.app, self.config))  # as `serve` runs it
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Waits until the core has no request left (aborts are applied within one step)."""
        deadline = time.monotonic() + timeout
        while self.engine.core.has_unfinished_requests() or self.engine._num_unfinished:
            if time.monotonic() > deadline:
                raise AssertionError("the engine did not become idle")
            time.sleep(0.02)


def slow_steps(engine: AsyncLLM, seconds: float) -> None:
    """Every engine step sleeps `seconds` first, so a test can act while requests run."""
    step = engine.core.step

    def slow_step():
        time.sleep(seconds)
        return step()

    engine.core.step = slow_step
