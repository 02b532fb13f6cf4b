"""Offline benchmark: a workload through `LLM`, honouring arrival times, recording every step."""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import time
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from inflight.engine.llm import LLM
from inflight.errors import ConfigError
from inflight.metrics.stats import StepStats
from inflight.sampling_params import SamplingParams, StructuredOutputs
from inflight.workload.requests import WorkloadRequest, pad_batches, require_simultaneous
from inflight.workload.results import RequestRecord, RunResult


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started or since `reset_peak_rss`."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def reset_peak_rss() -> None:
    """Restarts the peak from the current resident memory (Linux), so a run measured in this
    process does not report an earlier run's peak. Elsewhere the peak stays the process's."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


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
    timeline: list[StepStats] = []
    core = llm.core
    bar = tqdm(total=len(workload), desc=name, unit="req", disable=not progress)
    start = time.perf_counter()
    clock_start = core.scheduler.clock()
    collective_start = core.workers.group.collective_seconds if core.workers else 0.0
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
            outputs, stats = llm.step_with_stats()
            timeline.append(dataclasses.replace(stats, t=stats.t - clock_start))
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
        preemptions=sum(s.num_preempted for s in timeline),
        peak_rss_mb=peak_rss_mb(),
        extra={**event_counts(timeline), **_tensor_parallel_figures(llm, timeline,
                                                                   collective_start)},
    )  # fmt: skip


def _tensor_parallel_figures(llm: LLM, timeline: list[StepStats], collective_start: float) -> dict:
    """For a model split over ranks: rank 0's milliseconds a step in collectives (all-reduces
    and the logits' gather, waits for the other ranks included) and the other ranks' peak
    memory; nothing for one rank."""
    workers = llm.core.workers
    if workers is None or not timeline:
        return {}
    seconds = workers.group.collective_seconds - collective_start
    return {
        "tp_collective_ms_per_step": round(1000 * seconds / len(timeline), 2),
        "tp_rank_peak_rss_mb": [round(b / 2**20) for b in workers.peak_rss_bytes()],
    }


def event_counts(timeline: list[StepStats]) -> dict[str, int]:
    """A run's admission and prefix-cache events, summed over its steps."""
    return {
        "predictive_admissions": sum(s.admission.predictive_admissions for s in timeline),
        "prediction_failures": sum(s.admission.prediction_failures for s in timeline),
        "prefix_cache_queries": sum(s.prefix_cache.queries for s in timeline),
        "prefix_cache_hits": sum(s.prefix_cache.hits for s in timeline),
        "spec_draft_tokens": sum(s.speculation.drafted for s in timeline),
        "spec_accepted_tokens": sum(s.speculation.accepted for s in timeline),
        "spec_drafts_declined": sum(s.speculation.declined for s in timeline),
    }
