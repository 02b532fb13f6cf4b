"""Offline benchmark: a workload through `LLM`, honouring arrival times, recording every step."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from inflight.bench.stats import RequestRecord, RunResult, StepRecord
from inflight.bench.workloads import WorkloadRequest, pad_batches, require_simultaneous
from inflight.engine.llm import LLM
from inflight.errors import ConfigError
from inflight.sampling_params import SamplingParams, StructuredOutputs


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started or since `reset_peak_rss`."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def reset_peak_rss() -> None:
    """Restarts the peak from the current resident memory (Linux), so a run measured in this
    process does not report an earlier run's peak. Elsewhere the peak stays the process's."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _counters(llm: LLM) -> dict[str, int]:
    """Scheduler and prefix-cache counters a run reports as differences."""
    scheduler, kv = llm.core.scheduler, llm.core.kv_cache_manager
    return {
        "predictive_admissions": scheduler.num_predictive_admissions,
        "prediction_failures": scheduler.num_prediction_failures,
        "prefix_cache_queries": kv.num_prefix_queries,
        "prefix_cache_hits": kv.num_prefix_hits,
    }


def run_offline(
    llm: LLM,
    workload: list[WorkloadRequest],
    name: str,
    progress: bool = True,
    padded: bool = False,
    constrained: Callable[[int], StructuredOutputs | None] = lambda index: None,
) -> RunResult:
    """Greedy with `ignore_eos`, so every request produces exactly its `max_tokens`.

    `padded` (with static batching) makes it static batching as `generate` does it
    (`workloads.pad_batches`): only each request's own prompt and `max_tokens` count, and it
    ends with its batch. `constrained(i)`: the i-th request's structured-output constraint.
    """
    submitted = workload
    if padded:
        require_simultaneous(workload, "padded static batching")
        config = llm.config.scheduler
        if config.batching != "static" or config.scheduling_policy != "fcfs":
            raise ConfigError("padded batches need static batching under the fcfs policy")
        pad_id = llm.tokenizer.pad_token_id or 0
        submitted = pad_batches(workload, config.max_num_seqs, pad_id)
    pending = sorted(zip(workload, submitted, map(constrained, range(len(workload))), strict=True),
                     key=lambda p: p[0].arrival_time)  # fmt: skip
    asked_by_id: dict[str, WorkloadRequest] = {}  # the request as the workload has it
    records: list[RequestRecord] = []
    timeline: list[StepRecord] = []
    core = llm.core
    preemptions_before = core.totals.num_preemptions
    counters_before = _counters(llm)
    bar = tqdm(total=len(workload), desc=name, unit="req", disable=not progress)
    start = time.perf_counter()
    with bar:
        while pending or core.has_unfinished_requests():
            now = time.perf_counter() - start
            while pending and pending[0][0].arrival_time <= now:
                r, sent, constraint = pending.pop(0)
                params = SamplingParams(temperature=0, max_tokens=sent.max_tokens, ignore_eos=True,
                                        structured_outputs=constraint)  # fmt: skip
                asked_by_id[llm.add_request(sent.prompt_token_ids, params)] = r
            if not core.has_unfinished_requests():
                time.sleep(max(0.0, pending[0][0].arrival_time - now))
                continue
            outputs = llm.step()
            step = core.last_step
            timeline.append(
                StepRecord(
                    t=time.perf_counter() - start, duration=step.duration_s,
                    running=step.num_running, waiting=step.num_waiting,
                    scheduled_seqs=step.num_scheduled_seqs,
                    scheduled_tokens=step.num_batched_tokens, kv_usage=step.kv_usage,
                )
            )  # fmt: skip
            for out in outputs:
                if out.finished:
                    m, asked = out.metrics, asked_by_id[out.request_id]
                    records.append(
                        RequestRecord(len(asked.prompt_token_ids),
                                      min(len(out.outputs[0].token_ids), asked.max_tokens),
                                      m.ttft, m.e2e_latency)
                    )  # fmt: skip
                    bar.update(1)
    return RunResult(
        name=name,
        wall_s=time.perf_counter() - start,
        requests=records,
        timeline=timeline,
        preemptions=core.totals.num_preemptions - preemptions_before,
        peak_rss_mb=peak_rss_mb(),
        extra={k: v - counters_before[k] for k, v in _counters(llm).items()},
    )
