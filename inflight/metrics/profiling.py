"""Per-phase wall time of engine steps, for `inflight bench offline --profile`.

Off by default: the engine holds `NO_TIMER`, whose phases are empty context managers. Times are
host wall time. On a GPU the timer waits for the device at the end of every phase (`sync`):
otherwise the forward phase measures only how long the host took to queue the kernels, and the
wait lands in whichever phase next reads a result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from time import perf_counter

from inflight.metrics.stats import StepStats


class PhaseTimer:
    def __init__(self, sync: Callable[[], None] = lambda: None) -> None:
        self.steps: list[StepStats] = []  # every timed step, its phases filled in
        self._current: dict[str, float] = defaultdict(float)
        self._sync = sync

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = perf_counter()
        try:
            yield
        finally:
            self._sync()
            self._current[name] += perf_counter() - start

    def end_step(self, step: StepStats) -> None:
        step.phases = dict(self._current)
        self.steps.append(step)
        self._current = defaultdict(float)


class NoTimer:
    def phase(self, name: str) -> nullcontext:
        return nullcontext()

    def end_step(self, step: StepStats) -> None:
        pass


NO_TIMER = NoTimer()
Timer = PhaseTimer | NoTimer

# Phases that are not the model's forward pass: overhead. ("grammar": waiting for the masks
# filled beside the forward pass, and applying them.)
OVERHEAD_PHASES = ("schedule", "prepare_inputs", "grammar", "sample", "update", "output")


def breakdown(steps: list[StepStats]) -> dict:
    """Seconds and share of step time per phase, and the overhead share."""
    totals: dict[str, float] = defaultdict(float)
    for step in steps:
        for name, seconds in step.phases.items():
            totals[name] += seconds
    total = sum(totals.values()) or 1e-12
    phases = {name: {"seconds": round(s, 4), "share": round(s / total, 4),
                     "ms_per_step": round(1e3 * s / max(1, len(steps)), 3)}
              for name, s in sorted(totals.items(), key=lambda kv: -kv[1])}  # fmt: skip
    overhead = sum(totals.get(name, 0.0) for name in OVERHEAD_PHASES)
    return {"steps": len(steps), "phases": phases, "overhead_share": round(overhead / total, 4)}
