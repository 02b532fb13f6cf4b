"""The vLLM peer's plumbing that runs without vLLM: its environment and memory measurement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from inflight.bench.external_peer import watch_tree_rss
from inflight.bench.vllm_peer import _environment


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
    peak = watch_tree_rss(process, interval_s=0.05)
    assert process.returncode == 0
    assert 200 <= peak < 1000


FAKE_VLLM = '''
from types import SimpleNamespace as NS


class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos):
        self.max_tokens = max_tokens


class Engine:
    """One token per request per step, two requests at a time (as a scheduler with 2 seats)."""

    def __init__(self):
        self.requests = []

    def add_request(self, request_id, prompt, params):
        self.requests.append([request_id, prompt["prompt_token_ids"], params.max_tokens, []])

    def has_unfinished_requests(self):
        return any(len(r[3]) < r[2] for r in self.requests)

    def step(self):
        outputs = []
        for rid, prompt, max_tokens, tokens in [r for r in self.requests if len(r[3]) < r[2]][:2]:
            tokens.append(7)
            done = len(tokens) == max_tokens
            outputs.append(NS(request_id=rid, prompt_token_ids=prompt, finished=done,
                              outputs=[NS(token_ids=list(tokens))]))
        return outputs


class LLM:
    def __init__(self, **kwargs):
        self.llm_engine = Engine()
'''


def test_vllm_runner_reports_every_request_with_its_latencies(tmp_path, monkeypatch):
    """The runner and its parser against a stand-in `vllm` package (vLLM is not installed here):
    requests come back in workload order with token counts, TTFT <= end-to-end <= wall."""
    from inflight.bench.vllm_peer import run_vllm
    from inflight.workload.requests import WorkloadRequest

    stub = tmp_path / "stub"
    (stub / "vllm").mkdir(parents=True)
    (stub / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    tokens_prompt = (
        "def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': prompt_token_ids}\n"
    )
    (stub / "vllm" / "inputs.py").write_text(tokens_prompt)
    monkeypatch.setenv("PYTHONPATH", str(stub))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    workload = [WorkloadRequest([1, 2, 3], 4), WorkloadRequest([5], 1), WorkloadRequest([9, 9], 2)]
    result = run_vllm(Path(sys.executable), model_dir, workload, "bfloat16", max_num_seqs=2)
    assert [(r.prompt_tokens, r.output_tokens) for r in result.requests] == [(3, 4), (1, 1), (2, 2)]
    for r in result.requests:
        assert 0 <= r.ttft <= r.e2e <= result.wall_s
    # the third request waited for a seat: its first token came after the second one finished
    assert result.requests[2].ttft >= result.requests[1].e2e
