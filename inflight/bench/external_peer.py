"""Peers that live in their own virtual environment (vLLM, llama.cpp): never imported by inflight.

A peer is a runner script executed by the peer's Python. It reads the workload (JSONL of token
ids and `max_tokens`) and writes `{"wall_s": ..., "requests": [[prompt_tokens, output_tokens,
ttft_s, e2e_s], ...]}` in workload order. This module starts it, samples the peak memory of its
process tree from outside, and turns the result into a `RunResult`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
from pathlib import Path

from inflight.workload.requests import WorkloadRequest, save_jsonl
from inflight.workload.results import RequestRecord, RunResult

logger = logging.getLogger("inflight.bench")


def run_runner(
    name: str,
    python: Path,
    runner: Path,
    args: list[str],
    workload: list[WorkloadRequest],
    env: dict[str, str],
) -> RunResult:
    """Runs `python runner WORKLOAD RESULT *args` and reads its result."""
    with tempfile.TemporaryDirectory() as tmp:
        work, result = Path(tmp) / "workload.jsonl", Path(tmp) / "result.json"
        save_jsonl(workload, work)
        command = [str(python), str(runner), str(work), str(result), *args]
        logger.info("%s peer: %s", name, " ".join(command))
        with tempfile.TemporaryFile("w+") as stderr:
            process = subprocess.Popen(command, env=env, text=True,
                                       stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
            peak_mb = watch_tree_rss(process)
            if process.returncode != 0:
                stderr.seek(0)
                raise RuntimeError(f"{name} exited with {process.returncode}: "
                                   f"{stderr.read()[-2000:]}")  # fmt: skip
        data = json.loads(result.read_text())
    records = [RequestRecord(*row) for row in data["requests"]]
    return RunResult(name, data["wall_s"], records, peak_rss_mb=peak_mb)


def tree_rss_kib(root: int) -> int:
    """Resident memory of a process and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue  # the process ended meanwhile
        pid = int(status.parent.name)
        children.setdefault(int(fields["PPid"]), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack += children.get(pid, [])
    return total


def watch_tree_rss(process: subprocess.Popen, interval_s: float = 0.25) -> float:
    """Waits for `process`, sampling its tree's RSS; returns the peak in MB. (The runner cannot
    measure itself: on Linux a child's ru_maxrss starts at its parent's, ours, at fork.)"""
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss_kib(process.pid))
        time.sleep(interval_s)
    return peak / 1024
