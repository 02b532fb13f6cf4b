"""Discrete-event simulation of a fleet of engine replicas.

Each replica runs the engine's own `Scheduler` and `KVCacheManager` (not a copy) on a simulated
clock; a step lasts what the cost model says, then every sampling request receives a token, as
if the model had run. Requests are greedy with `ignore_eos`, so they finish at `max_tokens`,
exactly as `inflight bench` runs them: for the same workload the engine and the simulator make
the same schedules, step for step.

Events, in time order: an arrival goes to the replica its router names (`inflight.routing`, the
policy Ray Serve replicas use; by default the one with the fewest unfinished requests), where
SLO admission may refuse it (`core/slo.py`, on that replica's queue and its own fitted step
cost, as the server does), or it waits for the next step, as a request reaching the engine
during a forward pass does; a step end updates the scheduler and starts the next step at once.
An arrival at the very instant a step ends is seen by the next step.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from inflight.config import CacheConfig, EngineConfig, SchedulerConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.kv_groups import plan_kv_layout
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.core.scheduler import Scheduler
from inflight.core.sizing import plan_kv_pool
from inflight.core.state_snapshots import StateSnapshots
from inflight.errors import ConfigError, SLOUnmetError
from inflight.metrics.stats import StepStats, StepTotals
from inflight.request import Request
from inflight.routing import make_router, prefix_key
from inflight.sampling_params import SamplingParams
from inflight.sim.cost_model import CostModel, require_link
from inflight.sim.hardware import HardwareProfile, Link
from inflight.sim.model_profile import ModelProfile
from inflight.workload.requests import WorkloadRequest
from inflight.workload.results import RequestRecord, RunResult

SIMULATED_TOKEN = 0  # what every simulated sample "produces"; only counts matter


@dataclass(frozen=True)
class SimSetup:
    """Everything one simulation needs, resolved: pools sized, max_model_len fixed."""

    hardware: HardwareProfile
    model: ModelProfile
    scheduler: SchedulerConfig
    cache: CacheConfig
    num_kv_blocks: int
    num_cpu_blocks: int
    replicas: int = 1
    link: Link | None = None  # joins a replica's tensor-parallel ranks (`model.tensor_parallel`)
    group_windows: tuple[int | None, ...] = (None,)  # the KV groups' (core/kv_groups.py)
    page_bytes_per_token: int = 0  # of a page's layers (0: every layer's, one group)
    # a state-carrying model's: the states saved for prefix hits, and the swap blocks a swapped
    # request's state is charged (the engine's `StateSnapshots`, `KVPlan.swap_state_blocks`)
    saved_states: int = 0
    swap_state_blocks: int = 0

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def describe(self) -> dict:
        return {
            "hardware": self.hardware.name, "model": self.model.name,
            "weights": self.model.weight_dtype, "kv_dtype": self.model.kv_dtype,
            "replicas": self.replicas, "tensor_parallel": self.model.tensor_parallel,
            **({"link": self.link.name} if self.link and self.model.tensor_parallel > 1 else {}),
            "max_num_seqs": self.scheduler.max_num_seqs,
            "max_num_batched_tokens": self.scheduler.max_num_batched_tokens,
            "kv_blocks": self.num_kv_blocks, "kv_block_size": self.cache.kv_block_size,
            "kv_tokens": self.num_kv_blocks * self.cache.kv_block_size,
            "max_model_len": self.max_model_len, "batching": self.scheduler.batching,
            "policy": self.scheduler.scheduling_policy,
        }  # fmt: skip


def build_setup(
    hardware: HardwareProfile,
    model: ModelProfile,
    knobs: dict,
    replicas: int = 1,
    memory_utilization: float = 0.9,
    runtime_reserve_bytes: int = 2**30,
    link: Link | None = None,
    group_windows: tuple[int | None, ...] | None = None,
) -> SimSetup:
    """Sizes the KV pool as the engine would: from `kv_cache_memory_bytes` on a CPU, and on a
    GPU from the memory left, after weights, peak activations and a runtime reserve (CUDA
    context, graphs), within `memory_utilization` of the device (vLLM's rule). Under tensor
    parallelism (`model.tensor_parallel` ranks joined by `link`) each rank is one device of
    `hardware` holding its share of the weights and the KV of its own heads, and every rank's
    pool has the same blocks. A model with windowed layers gets the engine's KV groups (unless
    `free_window_blocks` is off), or those `group_windows` names."""
    require_link(model, link)
    config = EngineConfig.from_knobs(**knobs)
    cache, sched = config.cache, config.scheduler
    block_size = cache.kv_block_size
    arch = model.arch
    windows = arch.layer_windows
    layout = plan_kv_layout(windows)
    if group_windows is None:
        grouped = cache.free_window_blocks and any(w is not None for w in windows)
        group_windows = layout.group_windows if grouped else (None,)
    bytes_per_token = model.kv_bytes_per_token
    if len(group_windows) > 1 or group_windows[0] is not None:
        bytes_per_token = bytes_per_token // len(arch.kv_layers) * layout.layers_per_page
    limit = model.arch.max_position_embeddings
    requested = config.model.max_model_len
    tp = model.tensor_parallel
    ranks = f" on each of {tp} ranks" if tp > 1 else ""
    saved_states = arch.saved_states(cache.enable_prefix_caching, cache.num_saved_states,
                                     sched.max_num_seqs)  # fmt: skip
    if hardware.is_cpu:
        budget = cache.kv_cache_memory_bytes
        needed = model.rank_weight_bytes + budget + runtime_reserve_bytes
        if needed > hardware.memory_bytes:
            raise ConfigError(
                f"{model.name} ({model.weight_dtype}) needs {model.rank_weight_bytes / 1e9:.1f} GB "
                f"for weights and {budget / 1e9:.1f} GB for the KV pool{ranks}, with the runtime "
                f"{needed / 1e9:.1f} GB: more than {hardware.name}'s "
                f"{hardware.memory_bytes / 1e9:.1f} GB"
            )
    else:
        # (a state-carrying model's rows: a seat's, the saved states', a zero and a scratch row)
        state_rows = (sched.max_num_seqs + saved_states + 2) * model.sequence_state_bytes
        fixed = (
            model.rank_weight_bytes
            + model.activation_bytes(sched.max_num_batched_tokens, sched.max_num_seqs)
            + state_rows
            + runtime_reserve_bytes
        )
        usable = hardware.memory_bytes * memory_utilization
        budget = int(usable - fixed)
        if budget < bytes_per_token * block_size:
            raise ConfigError(
                f"{model.name} ({model.weight_dtype}) needs {fixed / 1e9:.1f} GB for weights, "
                f"activations and runtime{ranks}, more than {usable / 1e9:.1f} GB "
                f"({memory_utilization:.0%} of {hardware.name}); no room for a KV cache"
            )
    plan = plan_kv_pool(
        bytes_per_token=bytes_per_token, block_size=block_size, memory_bytes=budget,
        num_kv_blocks=cache.num_kv_blocks, max_num_seqs=sched.max_num_seqs,
        requested_len=requested, model_limit=limit,
        swap_space_bytes=cache.swap_space_bytes if sched.preemption_mode == "swap" else 0,
        swap_state_bytes=model.sequence_state_bytes,
        group_windows=group_windows, chunk=sched.chunk_limit,
    )  # fmt: skip
    return SimSetup(
        hardware, model, dataclasses.replace(sched, max_model_len=plan.max_model_len), cache,
        plan.num_blocks, plan.num_cpu_blocks, replicas, link, group_windows, bytes_per_token,
        saved_states, plan.swap_state_blocks,
    )  # fmt: skip


_SHORT_DTYPE = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
# Knobs of the engine's model and device, not of its core; and speculation, whose acceptance
# depends on the model's tokens, which a simulation does not have.
ENGINE_ONLY_KNOBS = ("model", "dtype", "device", "seed", "attention_backend", "enforce_eager",
                     "num_speculative_tokens", "speculative_model",
                     "quantized_activations",
                     # (the simulator's own flag: devices, not processes of this machine)
                     "tensor_parallel_size", "distributed_executor_backend",
                     "ray_cpus_per_rank")  # fmt: skip


def setup_like_engine(hardware: HardwareProfile, core, knobs: dict) -> SimSetup:
    """A setup that schedules exactly as the given `EngineCore` does: its model and dtype, its
    pool size and max_model_len, its scheduler knobs."""
    dtype = _SHORT_DTYPE[str(core.dtype)]
    model = ModelProfile(core.loaded.path.stem, core.arch, dtype, dtype)
    sim_knobs = {k: v for k, v in knobs.items() if k not in ENGINE_ONLY_KNOBS}
    sim_knobs |= {"num_kv_blocks": core.kv_cache.num_blocks, "max_model_len": core.max_model_len}
    return build_setup(hardware, model, sim_knobs,
                       group_windows=core.kv_cache_manager.group_windows)  # fmt: skip


@dataclass
class _Replica:
    setup: SimSetup
    now: float = 0.0
    inbox: list[Request] = field(default_factory=list)
    step_end: float | None = None  # None: idle
    current: SchedulerOutput | None = None

    def __post_init__(self) -> None:
        s, arch = self.setup, self.setup.model.arch
        # as the engine's core: a state-carrying model hits only where a state was saved
        caching = arch.caches_prefixes(s.cache.enable_prefix_caching, s.saved_states)
        snapshots = StateSnapshots(s.saved_states) if s.saved_states else None
        self.kv = KVCacheManager(s.num_kv_blocks, s.cache.kv_block_size, caching,
                                 s.num_cpu_blocks, s.group_windows, snapshots,
                                 s.swap_state_blocks, s.cache.reuse_decoded_kv)  # fmt: skip
        self.scheduler = Scheduler(s.scheduler, self.kv, clock=lambda: self.now)

    @property
    def num_unfinished_sequences(self) -> int:
        """Sequences in its scheduler and on their way to it: a router's measure of load."""
        return len(self.scheduler.requests) + len(self.inbox)


class Simulation:
    def __init__(
        self, setup: SimSetup, router: str = "least-loaded", cost_model: Any = None
    ) -> None:
        """`cost_model`: what a step costs (`step_cost(out)`; default: the roofline model of
        the setup's hardware; `LineCost` fitted to a run)."""
        self.setup = setup
        self.router = make_router(router)
        self.cost_model = cost_model or CostModel(
            setup.hardware, setup.model, setup.cache.kv_block_size, setup.link,
            setup.page_bytes_per_token,
        )  # fmt: skip
        self.replicas = [_Replica(setup) for _ in range(setup.replicas)]
        self.totals = StepTotals()  # every step of every replica
        self.flops = self.bytes = 0.0  # what those steps computed and moved, by the cost model
        self.link_bytes = 0.0  # what one rank sent to the others over those steps
        self.timeline: list[StepStats] = []  # replica 0's steps (a fleet's would interleave)
        self.schedules: list[SchedulerOutput] = []  # every step's schedule, when recorded
        self.record_schedules = False
        self.refused = 0  # arrivals SLO admission turned away

    def _start_step(self, replica: _Replica, t: float) -> None:
        replica.now = t
        for request in replica.inbox:
            replica.scheduler.add_request(request)
        replica.inbox.clear()
        if not replica.scheduler.has_unfinished_requests():
            replica.step_end = replica.current = None
            return
        out = replica.scheduler.schedule()
        if not out.scheduled:
            raise RuntimeError("the scheduler scheduled nothing with requests pending")
        cost = self.cost_model.step_cost(out)
        replica.current, replica.step_end = out, t + cost.seconds
        self.flops += cost.flops
        self.bytes += cost.weight_bytes + cost.kv_bytes
        self.link_bytes += cost.link_bytes
        if self.record_schedules:
            self.schedules.append(out)

    def _end_step(self, replica: _Replica) -> list[str]:
        """Finishes the replica's step; returns the ids of requests that finished."""
        out, start = replica.current, replica.now
        replica.now = replica.step_end
        sampled = {s.request_id: SIMULATED_TOKEN for s in out.scheduled if s.sample}
        outputs = replica.scheduler.update_from_output(out, ModelRunnerOutput(sampled))
        replica.scheduler.record_step_time(out, replica.now - start)
        step = replica.scheduler.make_stats(out, len(sampled), replica.now - start)
        self.totals.add(step)
        if replica is self.replicas[0]:
            self.timeline.append(step)
        return [o.request_id for o in outputs if o.finished]

    def run(self, workload: list[WorkloadRequest], name: str, progress: bool = False) -> RunResult:
        wall_start = time.perf_counter()
        requests = [self._request(i, r) for i, r in enumerate(workload)]
        pending = sorted(requests, key=lambda r: r.arrival_time)
        next_arrival = 0
        records: list[RequestRecord] = []
        by_id = {r.request_id: r for r in requests}
        with tqdm(total=len(requests), desc=name, unit="req", disable=not progress) as bar:
            while True:
                busy = [r for r in self.replicas if r.step_end is not None]
                t_done = min((r.step_end for r in busy), default=float("inf"))
                t_arrive = (pending[next_arrival].arrival_time if next_arrival < len(pending)
                            else float("inf"))  # fmt: skip
                if t_arrive == t_done == float("inf"):
                    break
                if t_arrive <= t_done:  # every arrival of this instant, then idle replicas start
                    while next_arrival < len(pending) and (
                        pending[next_arrival].arrival_time == t_arrive
                    ):
                        request = pending[next_arrival]
                        replica = self._route(request)
                        if self._admits(replica, request, t_arrive):
                            replica.inbox.append(request)
                        else:
                            self.refused += 1
                            bar.update(1)
                        next_arrival += 1
                    for replica in self.replicas:
                        if replica.step_end is None and replica.inbox:
                            self._start_step(replica, t_arrive)
                    continue
                replica = next(r for r in busy if r.step_end == t_done)
                for request_id in self._end_step(replica):
                    records.append(_record(by_id[request_id]))
                    bar.update(1)
                self._start_step(replica, t_done)
        sim_end = max(r.now for r in self.replicas)
        return RunResult(
            name=name, wall_s=sim_end - min(r.arrival_time for r in requests),
            requests=records, timeline=self.timeline, preemptions=self.totals.num_preemptions,
            extra=self._extra(time.perf_counter() - wall_start) | {"refused": self.refused},
        )  # fmt: skip

    def _admits(self, replica: _Replica, request: Request, now: float) -> bool:
        """SLO admission at the replica, as its server would decide it."""
        try:
            replica.scheduler.check_slo([request], now, replica.inbox)
        except SLOUnmetError:
            return False
        return True

    def _route(self, request: Request) -> _Replica:
        prefix = []
        if self.router.uses_prefix:
            prefix = prefix_key(request.prompt_token_ids, self.setup.cache.kv_block_size,
                                request.cache_salt)  # fmt: skip
        loads = {i: r.num_unfinished_sequences for i, r in enumerate(self.replicas)}
        return self.replicas[self.router.choose(prefix, loads)]

    def _request(self, index: int, r: WorkloadRequest) -> Request:
        total = len(r.prompt_token_ids) + r.max_tokens
        if total > self.setup.max_model_len:
            raise ConfigError(
                f"workload request {index}: {len(r.prompt_token_ids)} prompt + {r.max_tokens} "
                f"output tokens exceed max_model_len {self.setup.max_model_len}"
            )
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        return Request(str(index), list(r.prompt_token_ids), params,
                       arrival_time=r.arrival_time, priority=r.priority, tenant=r.tenant,
                       slo=self.setup.scheduler.default_slo)  # fmt: skip

    def _extra(self, sim_wall_s: float) -> dict:
        t, hw = self.totals, self.setup.hardware
        busy = max(t.busy_s, 1e-12)
        peak = self.cost_model.peak
        admissions = [r.scheduler.admission for r in self.replicas]
        predictions = {}
        if self.setup.scheduler.predictive_admission:
            predictions = {
                "predictive_admissions": sum(a.stats.predictive_admissions for a in admissions),
                "prediction_failures": sum(a.stats.prediction_failures for a in admissions),
            }
        kvs = [r.kv for r in self.replicas]
        queries = sum(kv.prefix_stats.queries for kv in kvs)
        extra = predictions | {
            "replicas": self.setup.replicas,
            "router": self.router.name,
            "prefix_routed": self.router.prefix_routed,
            "load_routed": self.router.load_routed,
            "prefix_cache_hit_rate": round(
                sum(kv.prefix_stats.hits for kv in kvs) / max(1, queries), 4
            ),
            "steps_all_replicas": t.num_steps,
            "seat_utilization": round(t.seat_s / (busy * self.setup.scheduler.max_num_seqs), 4),
            "compute_utilization": round(self.flops / (busy * peak), 4),
            "bandwidth_utilization": round(self.bytes / (busy * hw.memory_bw), 4),
            "simulator_wall_s": round(sim_wall_s, 3),
        }
        if self.setup.model.tensor_parallel > 1:
            extra["link_gb_sent_per_rank"] = round(self.link_bytes / 1e9, 3)
        return extra


def _record(request: Request) -> RequestRecord:
    arrival = request.arrival_time
    return RequestRecord(
        request.num_prompt_tokens,
        request.num_output_tokens,
        request.first_token_time - arrival,
        request.finished_time - arrival,
    )


def simulate(
    setup: SimSetup,
    workload: list[WorkloadRequest],
    name: str,
    progress: bool = False,
    router: str = "least-loaded",
    cost_model: Any = None,
) -> RunResult:
    return Simulation(setup, router, cost_model).run(workload, name, progress)
