"""A served engine runs every PyTorch op on one thread: its construction (load, pack, warm-up)
and its steps. Parallel regions on a second thread start a second OpenMP thread pool, and then
libgomp puts its workers to sleep between regions (`engine/async_engine.py` says why)."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from inflight.engine.async_engine import AsyncLLM
from inflight.engine.engine_core import EngineCore
from inflight.errors import ConfigError
from inflight.sampling_params import SamplingParams


def test_the_core_is_built_and_stepped_on_the_engine_thread(tiny_llama, monkeypatch):
    threads: dict[str, set[str]] = {"built": set(), "stepped": set()}
    real_init, real_step = EngineCore.__init__, EngineCore.step

    def init(self, *args, **kwargs):
        threads["built"].add(threading.current_thread().name)
        real_init(self, *args, **kwargs)

    def step(self):
        threads["stepped"].add(threading.current_thread().name)
        return real_step(self)

    monkeypatch.setattr(EngineCore, "__init__", init)
    monkeypatch.setattr(EngineCore, "step", step)
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)

    async def serve() -> list[int]:
        await engine.start()
        params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        outputs = [out async for out in engine.generate([3, 7, 11], params)]
        assert engine.is_alive
        await engine.shutdown()
        return outputs[-1].outputs[0].token_ids

    assert len(asyncio.run(serve())) == 5
    assert threads == {"built": {"inflight-engine"}, "stepped": {"inflight-engine"}}
    assert not engine.is_alive


def test_a_core_that_fails_to_build_raises_in_the_caller_and_stops_its_thread(tiny_llama):
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ConfigError, match="dtype must be"):
        AsyncLLM(str(tiny_llama), dtype="float64")
    leftover = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    for t in leftover:
        t.join(5)
    assert not [t for t in leftover if t.is_alive()]


def test_an_engine_dropped_without_shutdown_ends_its_thread(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    thread = engine._engine_thread.thread
    assert thread.is_alive()
    del engine
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_an_engine_shut_down_starts_again(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    async def serve_once() -> int:
        await engine.start()
        outputs = [out async for out in engine.generate([3, 7, 11], params)]
        await engine.shutdown()
        return len(outputs[-1].outputs[0].token_ids)

    assert asyncio.run(serve_once()) == 3
    assert not engine.is_alive
    assert asyncio.run(serve_once()) == 3
