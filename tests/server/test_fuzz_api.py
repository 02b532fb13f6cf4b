"""Schemathesis against /openapi.json: every operation, schema-valid and schema-violating data.

Asserts no 5xx, every status and content type documented, responses matching their schemas,
schema-violating requests rejected, 405s with Allow, and /health still 200 at the end. CI runs
at least 1,000 generated requests; `pytest --full` runs at least 10,000.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_headers_conformance,response_schema_conformance,negative_data_rejection,"
    "unsupported_method,allow_header_conformance"
)


@pytest.mark.slow
def test_schemathesis_finds_nothing(tiny_llama, request, tmp_path):
    total = 10_000 if request.config.getoption("--full") else 1_000
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=64, num_kv_blocks=64,
                      max_queued_requests=64)  # fmt: skip
    with LiveServer(engine, served_model_name="tiny", max_body_bytes=256 * 1024) as s:
        paths = httpx.get(s.url + "/openapi.json").json()["paths"]
        # Only operations with a body have room for many distinct examples (a GET without
        # parameters has a handful), and the coverage phase adds ~1,900 cases of its own (the
        # Responses API's schema brought most of them): the random phase gets what is left of
        # the budget, and at least 10 cases an operation.
        body_operations = sum(m == "post" for methods in paths.values() for m in methods)
        per_operation = max(10, (total - 1_900) // body_operations)
        command = [
            str(Path(sys.executable).with_name("schemathesis")), "run",
            s.url + "/openapi.json", "--checks", CHECKS,
            "--max-examples", str(per_operation), "--seed", "0",
            "--phases", "examples,coverage,fuzzing", "--request-timeout", "30",
            "--suppress-health-check", "all", "--no-color",
        ]  # fmt: skip
        run = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                             cwd=tmp_path)  # fmt: skip
        report = run.stdout + run.stderr
        assert run.returncode == 0, report[-6000:]
        generated = int(re.search(r"(\d+) generated", report).group(1))
        assert generated >= total, report[-2000:]
        assert httpx.get(s.url + "/health").status_code == 200
        assert engine.is_alive
