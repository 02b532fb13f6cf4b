"""Drive the tensor-free core with hand-made model outputs (no model, no tensors)."""

from __future__ import annotations

from inflight.config import SchedulerConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.core.scheduler import Scheduler
from inflight.request import Request
from inflight.sampling_params import SamplingParams

FAKE_TOKEN = 7
EOS = 2


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int = 256,
    enable_prefix_caching: bool = True,
    clock=None,
    num_cpu_blocks: int = 0,
    group_windows: list[int | None] | None = None,
    **knobs,
) -> Scheduler:
    config = SchedulerConfig(max_model_len=max_model_len, **knobs)
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching, num_cpu_blocks,
                        group_windows or [None])  # fmt: skip
    return Scheduler(config, kv) if clock is None else Scheduler(config, kv, clock)


def make_request(request_id: str, prompt_len: int, max_tokens: int, **params) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=[10 + i % 50 for i in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params),
        eos_token_ids=frozenset({EOS}),
    )


def fake_model_output(out: SchedulerOutput, token: int = FAKE_TOKEN) -> ModelRunnerOutput:
    """Every request that samples this step gets `token`, as from a model that always says it:
    a speculating request keeps its drafts up to the first that is not `token`."""
    accepted = {}
    for s in out.scheduled:
        if s.draft_token_ids:
            kept = 0
            while kept < len(s.draft_token_ids) and s.draft_token_ids[kept] == token:
                kept += 1
            accepted[s.request_id] = s.draft_token_ids[:kept]
    return ModelRunnerOutput(
        sampled_token_ids={s.request_id: token for s in out.scheduled if s.sample},
        accepted_draft_ids=accepted,
    )


def step(scheduler: Scheduler) -> SchedulerOutput:
    """One engine step with hand-made model outputs."""
    out = scheduler.schedule()
    scheduler.update_from_output(out, fake_model_output(out))
    return out


def run_to_completion(scheduler: Scheduler, max_steps: int = 100_000) -> int:
    """Steps until no request is left; returns the number of steps that scheduled work."""
    steps = 0
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return steps
        if step(scheduler).scheduled:
            steps += 1
    raise AssertionError("requests did not finish")


def first_steps_to_completion(
    scheduler: Scheduler, first_step: int = 0, max_steps: int = 1_000
) -> dict[str, int]:
    """Steps until no request is left; returns the step each request was first scheduled in,
    counting from `first_step`."""
    first: dict[str, int] = {}
    for n in range(first_step, first_step + max_steps):
        if not scheduler.has_unfinished_requests():
            return first
        for x in step(scheduler).scheduled:
            first.setdefault(x.request_id, n)
    raise AssertionError("requests did not finish")
