"""The vLLM peer's plumbing that runs without vLLM: its environment and memory measurement."""

from __future__ import annotations

import os
import subprocess
import sys

from inflight.bench.vllm_peer import _environment, _watch_tree_rss


def test_environment_binds_every_core_and_preloads_intel_openmp(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    (tmp_path / "venv" / "lib").mkdir()
    (tmp_path / "venv" / "lib" / "libiomp5.so").touch()
    env = _environment(python)
    assert env["VLLM_TARGET_DEVICE"] == "cpu"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == f"0-{os.cpu_count() - 1}"
    assert env["LD_PRELOAD"].endswith(str(tmp_path / "venv" / "lib" / "libiomp5.so"))


def test_peak_memory_counts_the_process_tree():
    """A parent whose child touches 200 MiB: the tree's peak is at least that."""
    child = ("import time; x = bytearray(200 * 2**20); x[::4096] = b'a' * len(x[::4096]); "
             "time.sleep(1.5)")  # fmt: skip
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    process = subprocess.Popen([sys.executable, "-c", parent])
    peak = _watch_tree_rss(process, interval_s=0.05)
    assert process.returncode == 0
    assert 200 <= peak < 1000
