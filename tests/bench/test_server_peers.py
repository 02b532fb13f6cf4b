"""Servers as peers: `llama-server` started with parallel slots and measured by the serving
client (against a stand-in binary that speaks its protocol), and `inflight serve` measured the
same way on the tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from inflight.bench.server_peers import run_inflight_server, run_llama_server, serve_flags
from inflight.workload.requests import WorkloadRequest

FAKE_LLAMA_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
with open(ARGV_FILE, "w") as f:
    json.dump(args, f)
port = int(args[args.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert isinstance(body["prompt"], list) and body["ignore_eos"] and body["stream"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["max_tokens"]
        for _ in range(n):
            chunk = {"choices": [{"text": "x", "index": 0, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": n}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def workload() -> list[WorkloadRequest]:
    return [WorkloadRequest(list(range(3, 3 + n)), max_tokens=m, arrival_time=0.0)
            for n, m in ((5, 4), (20, 7), (9, 2))]  # fmt: skip


def test_llama_server_gets_slots_and_a_context_for_each_and_is_measured(tmp_path):
    argv_file = tmp_path / "argv.json"
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\nARGV_FILE = {str(argv_file)!r}\n" + FAKE_LLAMA_SERVER)
    binary.chmod(0o755)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    run = run_llama_server(binary, gguf, workload(), parallel=4)
    assert run.error is None and run.name == "llama-server"
    assert sorted(r.output_tokens for r in run.requests) == [2, 4, 7]
    assert all(r.ttft is not None and r.e2e >= r.ttft for r in run.requests)
    assert run.peak_rss_mb and run.peak_rss_mb > 0
    args = json.loads(argv_file.read_text())
    flag = {name: args[args.index(name) + 1] for name in ("--parallel", "--ctx-size", "--model")}
    assert flag == {"--parallel": "4", "--ctx-size": str(4 * 27), "--model": str(gguf)}
    assert "--cont-batching" in args


def test_knobs_become_serve_flags():
    flags = serve_flags({"model": "m", "max_num_seqs": 4, "enable_prefix_caching": False,
                         "dtype": "float32", "prefill_chunk_size": None})  # fmt: skip
    assert flags == ["--max-num-seqs", "4", "--no-enable-prefix-caching", "--dtype", "float32"]


def test_inflight_serve_is_measured_like_a_peer(tiny_llama):
    knobs = {"dtype": "float32", "num_kv_blocks": 256, "max_model_len": 512, "max_num_seqs": 4}
    run = run_inflight_server(Path(tiny_llama), workload(), knobs)
    assert run.error is None and run.name == "inflight-serve"
    assert sorted(r.output_tokens for r in run.requests) == [2, 4, 7]
    assert run.peak_rss_mb and run.peak_rss_mb > 100  # a Python process with torch
