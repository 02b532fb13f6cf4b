"""Schemathesis against /openapi.json: every operation, schema-valid and schema-violating data.

Asserts no 5xx, every status and content type documented, responses matching their schemas,
schema-violating requests rejected, schema-valid ones accepted (`schemathesis_checks`), 405s
with Allow, and /health still 200 at the end. CI runs
at least 1,000 generated requests; `pytest --full` runs at least 10,000.
"""

from __future__ import annotations

import os
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
    "unsupported_method,allow_header_conformance,schema_valid_requests_are_accepted"
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
        # a schema-violating body may also be over the body limit: its 413 rejects it too
        (tmp_path / "schemathesis.toml").write_text(
            "[checks.negative_data_rejection]\nexpected-statuses = [400, 401, 403, 404, 405, "
            '406, 409, 413, 415, 422, 428, 429, "5xx"]\n'
        )
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_checks",
               "INFLIGHT_OPENAPI_URL": s.url + "/openapi.json",
               "PYTHONPATH": str(Path(__file__).parents[2])}  # fmt: skip
        run = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                             cwd=tmp_path, env=env)  # fmt: skip
        report = run.stdout + run.stderr
        assert run.returncode == 0, report[-6000:]
        generated = int(re.search(r"(\d+) generated", report).group(1))
        assert generated >= total, report[-2000:]
        assert httpx.get(s.url + "/health").status_code == 200
        assert engine.is_alive
