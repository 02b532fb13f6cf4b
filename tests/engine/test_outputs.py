"""Snapshots of outputs (what each step hands to streams): every field copied, lists their own."""

from __future__ import annotations

import dataclasses

from inflight.outputs import CompletionOutput, RequestMetrics


def test_completion_copy_keeps_every_field_and_owns_its_lists():
    live = CompletionOutput(2, "text", [5, 6], "stop", "###", logprobs=[{5: -0.1}, {6: -0.2}])
    # a field added to the dataclass must be added to the hand-written copy too
    assert [f.name for f in dataclasses.fields(CompletionOutput)] == [
        "index", "text", "token_ids", "finish_reason", "stop_reason", "logprobs"
    ]  # fmt: skip
    snap = live.copy()
    assert dataclasses.asdict(snap) == dataclasses.asdict(live)
    live.token_ids.append(7)
    live.logprobs.append({7: -0.3})
    assert snap.token_ids == [5, 6] and len(snap.logprobs) == 2, "later steps stay out of it"
    assert CompletionOutput(0, "", []).copy().logprobs is None


def test_metrics_copy_keeps_every_field():
    live = RequestMetrics(1.0, 2.0, 3.0, 4.0, 5)
    assert [f.name for f in dataclasses.fields(RequestMetrics)] == [
        "arrival_time", "first_scheduled_time", "first_token_time", "finished_time",
        "num_preemptions",
    ]  # fmt: skip
    snap = live.copy()
    assert dataclasses.asdict(snap) == dataclasses.asdict(live) and snap is not live
