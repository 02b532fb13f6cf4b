"""Latency targets (SLOs): predicting a request's first token before it is queued, keeping
decodes within their time per token, and judging each finished request against its targets.

A request's targets are a TTFT (arrival to first token) and a TPOT (mean time per output token
after the first), each optional, from the server's defaults or the request itself.

- **Admission** (`forecast_ttft`): when a request arrives, the engine's queue as last published
  (`QueueState`: each running and waiting request's prompt tokens left and expected output
  tokens, in queue order) is played forward with the scheduler's own rules (one token budget a
  step, decodes first, prompt chunks, seats) and the step-cost line fitted to the engine's own
  steps (`step_cost.py`), until the new request's first token. A request predicted to miss its
  TTFT target is refused at once (the server's 429 with `Retry-After`), or queued anyway under
  `slo_admission="queue"`. The forecast ignores KV blocks (a pool too small for the queue makes
  it optimistic) and prefix-cache hits (cached prompts make it cautious), and counts on each
  request's output being the mean of those that finished (at most its `max_tokens`).
- **Decodes before prompts** (`tpot_token_cap`): a step's tokens are capped so that no running
  request with a TPOT target falls behind it, as far as the cost line can tell; prompt chunks
  get what is left (at least one block's worth, so prompts never stall).
- **Earliest deadline first** (`scheduling_policy="edf"`, `policy.py`): the waiting queue in
  order of arrival + TTFT target.
- **Goodput** (`met_target`): a finished request met its SLO when its TTFT and mean TPOT are
  within its targets; the scheduler counts met and missed per tenant for the step records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from inflight.config import SchedulerConfig
from inflight.errors import SLOUnmetError
from inflight.request import Request

# A forecast plays at most this many steps (runs of decode-only steps count once): it runs on
# the server's event loop, ~30 us a step at 64 seats, and a first token further away than this
# is counted a miss (Retry-After 60)
MAX_FORECAST_STEPS = 1024
# waiting requests a published queue holds at most (building it costs ~4 us a request, every
# step); behind more, a forecast counts only these and is a lower bound
MAX_FORECAST_WAITING = 1024
PRIOR_MEAN_OUTPUT = 128  # output tokens expected of a request before any has finished
OUTPUT_DECAY = 0.9  # weight of older requests in the mean output length (~10 requests)


@dataclass(frozen=True, slots=True)
class Work:
    """One request as the forecast sees it."""

    prefill: int  # tokens to compute before its next sample (1: a decode, as the scheduler's)
    decode: int  # tokens it is expected to sample still
    deadline: float = math.inf  # arrival + TTFT target (the edf order)
    priority: int = 0


@dataclass(frozen=True, slots=True)
class QueueState:
    """The scheduler's queue at a step boundary, as the forecast reads it (published by the
    engine thread after every step, read by the server's event loop)."""

    t: float  # the scheduler's clock when it was taken
    running: tuple[Work, ...]
    waiting: tuple[Work, ...]  # in queue order
    line: tuple[float, float] | None  # the step-cost line (s at 0 tokens, s/token); None: unfit
    max_num_seqs: int
    token_budget: int
    chunk_limit: int
    policy: str
    num_added: int  # requests the core had taken in when it was taken
    mean_output: float  # output tokens a request is expected to sample (`OutputLengths`)


class OutputLengths:
    """The mean output length of finished requests (exponentially weighted): what a request is
    expected to sample."""

    def __init__(self) -> None:
        self.mean = float(PRIOR_MEAN_OUTPUT)
        self.seen = False

    def observe(self, num_output_tokens: int) -> None:
        if not self.seen:
            self.mean, self.seen = float(num_output_tokens), True
        else:
            self.mean = OUTPUT_DECAY * self.mean + (1 - OUTPUT_DECAY) * num_output_tokens


def expected_work(request: Request, mean_output: float, max_model_len: int) -> Work:
    """The request as the forecast sees it: its tokens still to compute, and the tokens it is
    expected to sample (the mean, at least 1, at most what it may)."""
    left = request.tokens_left(max_model_len)
    decode = max(1, min(left, round(mean_output) - request.num_output_tokens))
    ttft = request.slo.ttft_s
    deadline = math.inf if ttft is None else request.arrival_time + ttft
    return Work(max(1, request.num_tokens - request.num_computed_tokens), decode, deadline,
                request.priority)  # fmt: skip


@dataclass(slots=True)
class _Item:
    """A request while the forecast plays the queue forward."""

    prefill: int  # tokens to compute before its next sample; 0: done
    decode: int  # samples still expected
    work: Work
    is_new: bool = False


def _insert(queue: list[_Item], item: _Item, policy: str) -> None:
    """Puts an arrival where the policy's queue would (by deadline under edf, behind its
    priority class under priority; at the tail otherwise: fair and sjf orders move with what
    is served, and the tail is the cautious guess)."""
    for i, other in enumerate(queue):
        if (policy == "edf" and other.work.deadline > item.work.deadline) or (
            policy == "priority" and other.work.priority > item.work.priority
        ):
            queue.insert(i, item)
            return
    queue.append(item)


def _decodes_only(running: list[_Item], waiting: list[_Item], seats: int, budget: int) -> bool:
    """Whether the next steps are all alike: decodes only, every one within the budget, and
    nobody admitted until a seat frees."""
    return (bool(running) and len(running) <= budget
            and all(r.prefill == 1 and not r.is_new for r in running)
            and (not waiting or len(running) >= seats))  # fmt: skip


def forecast_ttft(
    state: QueueState, new: Work, now: float, pending: Iterable[Work] = (),
    horizon_s: float = math.inf,
) -> float | None:  # fmt: skip
    """Seconds from `now` until `new` samples its first token, were it queued now behind the
    `pending` requests (sent after `state` was taken, in order); inf past `horizon_s`, None
    while the step-cost line is unfit. Arrivals join at the first step boundary after `now`,
    as a request reaching the engine mid-step does."""
    if state.line is None:
        return None
    base, per_token = state.line
    running = [_Item(w.prefill, w.decode, w) for w in state.running]
    waiting = [_Item(w.prefill, w.decode, w) for w in state.waiting]
    arrivals = [*(_Item(w.prefill, w.decode, w) for w in pending),
                _Item(new.prefill, new.decode, new, is_new=True)]  # fmt: skip
    t, seats, chunk = state.t, state.max_num_seqs, state.chunk_limit
    for _ in range(MAX_FORECAST_STEPS):
        if arrivals and t >= now:
            for item in arrivals:
                _insert(waiting, item, state.policy)
            arrivals = []
        if not arrivals and _decodes_only(running, waiting, seats, state.token_budget):
            # every step alike until the first of them finishes: take those steps at once
            k = min(r.decode for r in running)
            t += k * (base + per_token * len(running))
            for r in running:
                r.decode -= k
            running = [r for r in running if r.decode > 0]
            if t - now > horizon_s:
                return math.inf
            continue
        budget, tokens = state.token_budget, 0
        step: list[tuple[_Item, int]] = []
        pending_decodes = sum(1 for r in running if r.prefill == 1)
        for r in running:  # the scheduler's rules: decodes first, chunks within what is left
            if r.prefill == 1:
                pending_decodes -= 1
                n = min(1, budget)
            else:
                n = min(r.prefill, budget - pending_decodes, chunk)
            if n > 0:
                step.append((r, n))
                budget, tokens = budget - n, tokens + n
        while waiting and budget > 0 and len(running) < seats:
            r = waiting.pop(0)
            n = min(r.prefill, budget, chunk)
            running.append(r)
            step.append((r, n))
            budget, tokens = budget - n, tokens + n
        if not step:  # an idle engine until the arrivals come
            t = max(t, now)
            continue
        t += base + per_token * tokens
        for r, n in step:
            r.prefill -= n
            if r.prefill == 0:  # it samples: its first token, or one more
                if r.is_new:
                    return max(0.0, t - now)
                r.decode -= 1
                r.prefill = 1 if r.decode > 0 else 0
        running = [r for r in running if r.prefill > 0]
        if t - now > horizon_s:
            return math.inf
    return math.inf


def predicted_ttft(
    state: QueueState, request: Request, now: float, pending: Iterable[Request],
    max_model_len: int,
) -> float | None:  # fmt: skip
    """The forecast for a request with a TTFT target about to be queued (None: it has no
    target, or the line is unfit); past four times its target the forecast stops (inf)."""
    target = request.slo.ttft_s
    if target is None:
        return None
    work = [expected_work(r, state.mean_output, max_model_len) for r in (*pending, request)]
    return forecast_ttft(state, work[-1], now, work[:-1], horizon_s=4 * target)


def refused_forecast(
    state: QueueState, request: Request, now: float, pending: Iterable[Request],
    max_model_len: int, admission: str,
) -> float | None:  # fmt: skip
    """The predicted TTFT of a request that SLO admission refuses; None when it is admitted
    (no TTFT target, an unfit line, a forecast within the target, or `admission="queue"`)."""
    if admission != "refuse":
        return None
    predicted = predicted_ttft(state, request, now, pending, max_model_len)
    target = request.slo.ttft_s
    if predicted is None or target is None or predicted <= target:
        return None
    return predicted


def needs_forecast(requests: Iterable[Request], config: SchedulerConfig) -> bool:
    """Whether SLO admission could refuse any of `requests`: one has a TTFT target to miss
    (only then is a queue worth reading)."""
    return config.slo_admission == "refuse" and any(r.slo.ttft_s is not None for r in requests)


def check_slo(
    state: QueueState, requests: Iterable[Request], now: float, config: SchedulerConfig,
    pending: Iterable[Request] = (),
) -> None:  # fmt: skip
    """Raises SLOUnmetError when admission refuses any of `requests`, queued in order behind
    `pending` (sent after `state` was taken)."""
    queued = list(pending)
    for request in requests:
        predicted = refused_forecast(state, request, now, queued, config.max_model_len,
                                     config.slo_admission)  # fmt: skip
        if predicted is not None:
            target = request.slo.ttft_s
            assert target is not None  # only a TTFT target refuses
            when = (f"in {predicted:.2f} s" if math.isfinite(predicted)
                    else "further ahead than it looks")  # fmt: skip
            raise SLOUnmetError(
                f"the engine predicts this request's first token {when}, past its TTFT target "
                f"of {target:g} s; retry later", retry_after_s(predicted, target),
            )  # fmt: skip
        queued.append(request)


def tpot_token_cap(
    running: Iterable[Request], now: float, line: tuple[float, float] | None, floor: int
) -> int | None:
    """The most tokens this step may compute so that every decoding request with a TPOT
    target keeps its mean time per token within it after this step's token (at least
    `floor`); None where no running request has a TPOT target or the line is unfit."""
    if line is None or line[1] <= 0:
        return None
    slack = math.inf
    for r in running:
        tpot = r.slo.tpot_s
        if tpot is not None and r.first_token_time is not None and r.is_decoding:
            # after this step, num_output_tokens gaps since the first token
            slack = min(slack, tpot * r.num_output_tokens - (now - r.first_token_time))
    if slack == math.inf:
        return None
    base, per_token = line
    return max(floor, int((slack - base) / per_token))


def met_target(request: Request) -> bool | None:
    """Whether a request that ended with its output met its targets (None: it had none, or it
    never sampled)."""
    slo, first, end = request.slo, request.first_token_time, request.finished_time
    if not slo or first is None or end is None:
        return None
    if slo.ttft_s is not None and first - request.arrival_time > slo.ttft_s:
        return False
    gaps = request.num_output_tokens - 1
    return not (slo.tpot_s is not None and gaps > 0 and (end - first) / gaps > slo.tpot_s)


def retry_after_s(predicted_ttft: float, target: float) -> int:
    """Whole seconds a refused request should wait before trying again: how far the queue is
    past its target (at least 1; a forecast past its horizon says 60)."""
    if not math.isfinite(predicted_ttft):
        return 60
    return max(1, math.ceil(predicted_ttft - target))
