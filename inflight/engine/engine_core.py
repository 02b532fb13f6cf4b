"""EngineCore: owns scheduler, KV cache and model runner; `step()` = schedule -> execute -> update,
returning the outputs and the step's `StepStats`; `gauges()` and `snapshot()` say what the core
holds now, for the metrics and the dashboard.

Built from an EngineConfig: loads the model, resolves `max_model_len` and the number of KV
blocks, and refuses configurations where one request of `max_model_len` tokens could never fit
in the pool (such a request would be preempted forever).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from inflight.config import EngineConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.kv_groups import KVLayout, plan_kv_layout
from inflight.core.outputs import EngineCoreOutput, SchedulerOutput
from inflight.core.scheduler import Scheduler
from inflight.core.sizing import KVPlan, num_blocks_for_budget, peak_pages, plan_kv_pool
from inflight.core.state_snapshots import StateSnapshots
from inflight.errors import ConfigError, ModelFailedError
from inflight.metrics.profiling import NO_TIMER, PhaseTimer, Timer
from inflight.metrics.stats import CoreGauges, CoreSnapshot, StepStats
from inflight.model.arch import LlamaArchConfig
from inflight.model.loader import (
    LoadedModel,
    arch_config,
    check_memory_fits,
    estimated_weight_bytes,
    load_model,
    resolve_engine_dtype,
    resolve_model_path,
    resolve_quantized_activations,
)
from inflight.parallel.shard import Shard, check_tensor_parallel, shard_arch
from inflight.parallel.workers import KVSetup, RankSpec, RankWorkers, threads_per_rank
from inflight.platform import resolve_device
from inflight.request import FinishReason, Request, RequestStatus
from inflight.runner.conv_state import ConvState, conv_state_bytes, sequence_state_bytes
from inflight.runner.cuda_graphs import DecodeGraphs, supports_graphs
from inflight.runner.drafter import Drafter
from inflight.runner.kv_cache import (
    KVCache,
    kv_bytes_per_page_token,
    kv_bytes_per_token,
    resolve_kv_cache_dtype,
    values_in_keys,
)
from inflight.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def state_snapshot_rows(config: EngineConfig, arch: LlamaArchConfig) -> int:
    """`arch.saved_states` under `config`'s knobs."""
    return arch.saved_states(config.cache.enable_prefix_caching, config.cache.num_saved_states,
                             config.scheduler.max_num_seqs)  # fmt: skip


def warm_up_tokens(budget: int, max_model_len: int, device: torch.device, block_size: int) -> int:
    """Prompt tokens of the start-up warm-up. A GPU's is a full step budget: kernels and
    libraries set up per shape there, and the largest shapes come first. A CPU's first-use costs
    do not grow with the step's size, while its compute does, and a larger warm-up made no later
    step faster: one block (docs/benchmarks.md, "Figures behind design decisions")."""
    if device.type != "cpu":
        return min(budget, max_model_len)
    return min(budget, max_model_len, block_size)


@dataclass(frozen=True, slots=True)
class StepResult:
    outputs: list[EngineCoreOutput]  # the requests the step changed
    stats: StepStats  # the step's record


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.device = resolve_device(config.model.device)
        # the model's file or folder, resolved once: its dtype, ranks and loading read it
        self._path = loaded.path if loaded is not None else resolve_model_path(config.model.model)
        self.dtype = resolve_engine_dtype(config.model.dtype, self.device, self._path,
                                          config.model.quantized_activations)  # fmt: skip
        kv_dtype = resolve_kv_cache_dtype(config.cache.kv_cache_dtype, self.dtype)
        # the other ranks of a model split over several (parallel/), started before loading
        self.workers = self._start_ranks(config, loaded, kv_dtype)
        try:
            self._build(config, loaded, kv_dtype)
        except BaseException:
            if self.workers is not None:
                self.workers.close()
            raise

    def _build(
        self, config: EngineConfig, loaded: LoadedModel | None, kv_dtype: torch.dtype
    ) -> None:
        self.loaded = loaded = self._load_target(config, loaded, kv_dtype)
        if self.workers is not None:  # (they loaded their slices meanwhile)
            self.workers.connect()
        self.arch = loaded.arch
        draft = None
        if config.scheduler.speculative_model is not None:
            draft = self._load_drafter(config.scheduler.speculative_model, loaded, config)
        self.kv_layout = self._kv_layout(config, loaded, draft)
        plan = self._plan_kv_pool(config, loaded, draft, kv_dtype, self.kv_layout,
                                  sequence_state_bytes(loaded.model.cfg, self.dtype))  # fmt: skip
        self.max_model_len = plan.max_model_len
        sched_cfg = dataclasses.replace(config.scheduler, max_model_len=plan.max_model_len)
        self.config = dataclasses.replace(config, scheduler=sched_cfg)
        for model in (loaded, draft):  # LongRoPE's side, before any graph reads the rotation
            if model is not None:
                model.model.fit_rope_to(plan.max_model_len)

        block_size = config.cache.kv_block_size
        attn = loaded.model.layers[0].attn
        saved_states = state_snapshot_rows(self.config, self.arch)
        if self.workers is not None:
            conv_slots = sched_cfg.max_num_seqs if self.arch.conv_layers else 0
            self.workers.setup(KVSetup(plan.num_blocks, plan.num_cpu_blocks, kv_dtype,
                                       self.kv_layout, plan.max_model_len, conv_slots,
                                       saved_states,
                                       sched_cfg.num_speculative_tokens))  # fmt: skip
        # the scratch block: the start-up warm-up's, and padding rows' of decode graphs; this
        # rank's share of the heads where the model is split (`model.cfg`)
        self.kv_cache = KVCache(loaded.model.cfg, attn, plan.num_blocks, kv_dtype, self.device,
                                plan.num_cpu_blocks, scratch_block=True,
                                layout=self.kv_layout)  # fmt: skip
        caching = self.arch.caches_prefixes(config.cache.enable_prefix_caching, saved_states)
        snapshots = StateSnapshots(saved_states) if saved_states else None
        group_windows = self.kv_layout.group_windows if self.kv_layout else (None,)
        self.kv_cache_manager = KVCacheManager(plan.num_blocks, block_size, caching,
                                               plan.num_cpu_blocks, group_windows,
                                               snapshots, plan.swap_state_blocks,
                                               config.cache.reuse_decoded_kv)  # fmt: skip
        self.scheduler = Scheduler(sched_cfg, self.kv_cache_manager)
        self.runner = self._build_runner(config, draft, plan, kv_dtype)
        self.runner.warm_up(warm_up_tokens(sched_cfg.max_num_batched_tokens, plan.max_model_len,
                                           self.device, block_size))  # fmt: skip
        self.timer: Timer = NO_TIMER
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB, %s), max_model_len %d%s",
                    plan.num_blocks, block_size, self.kv_cache.num_bytes / 2**20,
                    str(kv_dtype).removeprefix("torch."), plan.max_model_len,
                    f", {len(group_windows)} groups of {self.kv_layout.layers_per_page} layers "
                    f"(windows {group_windows})" if self.kv_layout else "")  # fmt: skip
        if plan.swap_state_blocks:
            logger.log(logging.WARNING if plan.swap_state_blocks >= plan.num_cpu_blocks
                       else logging.INFO,
                       "swap space: %d blocks, of which a swapped request's sequence state "
                       "takes %d (a request that does not fit is recomputed)",
                       plan.num_cpu_blocks, plan.swap_state_blocks)  # fmt: skip
        assert peak_pages(plan.max_model_len, block_size, group_windows,
                          sched_cfg.chunk_limit) <= plan.num_blocks  # fmt: skip

    def _load_target(
        self, config: EngineConfig, loaded: LoadedModel | None, kv_dtype: torch.dtype
    ) -> LoadedModel:
        """The model, loaded (after checking that its weights and pool fit the machine's
        memory), or the one given, if it was loaded as this configuration would load it."""
        activations = resolve_quantized_activations(
            config.model.quantized_activations,
            self.dtype,
            config.scheduler.max_num_seqs,
            self._path,
        )
        if loaded is not None:
            if why := loaded.mismatch(self.dtype, activations):
                raise ConfigError(why)
            return loaded
        path = self._path
        if self.device.type == "cpu" and self.workers is None:  # (ranks: checked as started)
            self._check_memory(config, path, arch_config(path), kv_dtype, activations)
        return load_model(path, self.dtype, self.device, config.cache.kv_block_size,
                          config.model.attention_backend, activations,
                          tp=self.workers.group if self.workers else None,
                          warn_unused=config.model.quantized_activations != "auto")  # fmt: skip

    def _start_ranks(
        self, config: EngineConfig, loaded: LoadedModel | None, kv_dtype: torch.dtype
    ) -> RankWorkers | None:
        """Ranks 1..N-1 of a split model, started (each loads its own slice) once the split is
        known to be even and every rank's weights and pool are known to fit this machine's
        memory together; None for one rank."""
        size = config.model.tensor_parallel_size
        if size == 1:
            return None
        if loaded is not None:
            raise ConfigError("tensor_parallel_size > 1 loads each rank's slice of the model: "
                              "an engine split over ranks cannot reuse a loaded model")  # fmt: skip
        if self.device.type != "cpu":
            raise ConfigError(f"tensor_parallel_size {size}: tensor parallelism runs on CPU "
                              f"ranks only, not on {self.device.type}")  # fmt: skip
        path = self._path
        arch = arch_config(path)
        try:
            check_tensor_parallel(arch, size)
        except ValueError as e:
            raise ConfigError(f"{path.name}: {e}") from e
        activations = resolve_quantized_activations(
            config.model.quantized_activations,
            self.dtype,
            config.scheduler.max_num_seqs,
            self._path,
        )
        on_ray = config.model.distributed_executor_backend == "ray"
        launcher = None
        if on_ray:
            from inflight.parallel.ray_ranks import RayRanks

            launcher = RayRanks(size, config.model.ray_cpus_per_rank)  # refused if it cannot fit
            threads = launcher.cpus_per_rank
        else:
            threads = threads_per_rank(size)
        here = 1 if launcher is not None and not launcher.same_machine else size
        try:
            self._check_memory(config, path, arch, kv_dtype, activations, ranks_here=here)
        except BaseException:
            if launcher is not None:  # its bundles go back to the cluster
                launcher.stop()
            raise
        torch.set_num_threads(threads)
        logger.info("tensor parallelism: %d ranks of %d threads each, %s (this process is "
                    "rank 0)", size, threads,
                    "Ray actors" if on_ray else "processes on this machine")  # fmt: skip
        spec = RankSpec(str(path), self.dtype, str(self.device), config.cache.kv_block_size,
                        config.model.attention_backend, activations, threads)  # fmt: skip
        return RankWorkers(spec, size, launcher)

    def _check_memory(
        self, config: EngineConfig, path: Path, arch: LlamaArchConfig, kv_dtype: torch.dtype,
        activations: str, ranks_here: int | None = None,
    ) -> None:  # fmt: skip
        """Refuses (before loading) weights and KV pools that will not fit this machine's
        memory: the weights and pools of the ranks it holds (every rank of a split model by
        default; one where the others run on other nodes), each its share (a pool with the
        convolution state beside it, where the model has one), and each one's swap space."""
        size = config.model.tensor_parallel_size
        here = size if ranks_here is None else ranks_here
        rank_arch = shard_arch(Shard(arch, 0, size))
        rank_pool = self._kv_bytes(config, rank_arch, kv_dtype)
        rank_state = conv_state_bytes(
            rank_arch, config.scheduler.max_num_seqs, self.dtype,
            state_snapshot_rows(config, arch), config.scheduler.num_speculative_tokens,
        )  # fmt: skip
        weights = estimated_weight_bytes(path, self.dtype, activations)
        # (each rank plans its swap blocks from rank 0's bytes a block: about the whole space)
        swap = config.cache.swap_space_bytes if config.scheduler.preemption_mode == "swap" else 0
        check_memory_fits(
            path, weights * here // size, here * rank_pool, here * swap, here * rank_state
        )

    def _kv_layout(
        self, config: EngineConfig, target: LoadedModel, draft: LoadedModel | None
    ) -> KVLayout | None:
        """KV groups (core/kv_groups.py) where some layers attend within a window, so that
        those layers give back the blocks that leave it; None: one table for every layer. A
        draft model's KV is indexed by the first group's table, which must then hold every
        block (a full-attention group: all the drafter's layers read the whole sequence)."""
        windows = target.arch.layer_windows
        if all(w is None for w in windows) or not config.cache.free_window_blocks:
            return None
        layout = plan_kv_layout(windows)
        if draft is not None and layout.group_windows[0] is not None:
            logger.info("KV: the windowed layers keep every block (a draft model's KV needs a "
                        "table of every block, and every layer is windowed)")  # fmt: skip
            return None
        return layout

    def _wants_graphs(self, config: EngineConfig, attn: Any) -> bool:
        # an embedding model never decodes: there is no decode step to capture
        return (supports_graphs(attn, self.device) and not config.model.enforce_eager
                and self.arch.pooling is None)  # fmt: skip

    @staticmethod
    def _plan_kv_pool(
        config: EngineConfig, target: LoadedModel, draft: LoadedModel | None,
        kv_dtype: torch.dtype, layout: KVLayout | None, state_bytes: int,
    ) -> KVPlan:  # fmt: skip
        """The pool's blocks, `max_model_len` and the swap space's blocks. A drafter's KV shares
        the pool's blocks, so a block costs both models' bytes; swap space holds only the
        target's (a drafter's KV is recomputed after preemption), and a swapped request's
        sequence state (`state_bytes`, a rank's share). With KV groups a block is a page of
        `layout.layers_per_page` layers."""
        sched_cfg = config.scheduler
        # (a split model's rank holds its share of the heads: `model.cfg`)
        rank_arch = target.model.cfg
        keys_alone = values_in_keys(rank_arch, target.model.layers[0].attn, kv_dtype)
        bytes_per_token = kv_bytes_per_page_token(rank_arch, kv_dtype, layout, keys_alone)
        target_bytes_per_token = bytes_per_token
        max_positions = target.arch.max_position_embeddings
        if draft is not None:
            draft_alone = values_in_keys(draft.arch, draft.model.layers[0].attn, kv_dtype)
            bytes_per_token += kv_bytes_per_token(draft.arch, kv_dtype, draft_alone)
            max_positions = min(max_positions, draft.arch.max_position_embeddings)
        swapping = sched_cfg.preemption_mode == "swap"
        return plan_kv_pool(
            bytes_per_token=bytes_per_token, block_size=config.cache.kv_block_size,
            memory_bytes=config.cache.kv_cache_memory_bytes,
            num_kv_blocks=config.cache.num_kv_blocks, max_num_seqs=sched_cfg.max_num_seqs,
            requested_len=config.model.max_model_len, model_limit=max_positions,
            swap_space_bytes=config.cache.swap_space_bytes if swapping else 0,
            swap_bytes_per_token=target_bytes_per_token, swap_state_bytes=state_bytes,
            group_windows=layout.group_windows if layout else (None,),
            chunk=sched_cfg.chunk_limit,
        )  # fmt: skip

    def _build_runner(
        self, config: EngineConfig, draft: LoadedModel | None, plan: KVPlan,
        kv_dtype: torch.dtype,
    ) -> ModelRunner:  # fmt: skip
        """The model runner, with decode graphs captured where the device and backend allow,
        and the drafter (its own KV over the same block ids) when a draft model is set."""
        model, device = self.loaded.model, self.device
        attn = model.layers[0].attn
        graphs = None
        wants_graphs = self._wants_graphs(config, attn)
        if wants_graphs and not model.graph_capturable:
            logger.info("%s steps read the host (experts routed there, or convolution state "
                        "rows): decode steps run without CUDA graphs",
                        type(model).__name__)  # fmt: skip
        elif wants_graphs:
            graphs = DecodeGraphs(model, self.kv_cache, config.scheduler.max_num_seqs,
                                  plan.max_model_len, device, self.kv_layout)  # fmt: skip
            graphs.capture_all()
        drafter = None
        if draft is not None:
            draft_attn = draft.model.layers[0].attn
            draft_kv = KVCache(draft.arch, draft_attn, plan.num_blocks, kv_dtype, device,
                               scratch_block=True)  # fmt: skip
            drafter = Drafter(draft.model, draft_kv, draft_attn, device)
        conv_state = None
        if self.arch.conv_layers:
            # (a rank's share of the channels where the model is split: `model.cfg`)
            saved = self.kv_cache_manager.snapshots
            conv_state = ConvState.for_model(model.cfg, config.scheduler.max_num_seqs,
                                             self.dtype, device,
                                             0 if saved is None else saved.capacity,
                                             config.scheduler.num_speculative_tokens)  # fmt: skip
            logger.info("sequence state (convolution inputs, DeltaNet matrices): %d slots, %d "
                        "saved for the prefix cache, %d draft rows a slot, %.1f MiB",
                        conv_state.num_slots, conv_state.num_snapshots, conv_state.num_drafts,
                        conv_state.num_bytes / 2**20)  # fmt: skip
        return ModelRunner(model, self.kv_cache, attn, device, config.model.seed, graphs, drafter,
                           self.kv_layout, self.workers, conv_state)  # fmt: skip

    @staticmethod
    def _kv_bytes(config: EngineConfig, arch: LlamaArchConfig, dtype: torch.dtype) -> int:
        """The target's KV pool as the budget sizes it (`num_kv_blocks`, else the budget capped
        at what `max_num_seqs` requests of the longest length could use)."""
        block_size = config.cache.kv_block_size
        per_token = kv_bytes_per_token(arch, dtype)
        blocks = config.cache.num_kv_blocks or num_blocks_for_budget(
            per_token,
            block_size,
            config.cache.kv_cache_memory_bytes,
            config.scheduler.max_num_seqs,
            config.model.max_model_len or arch.max_position_embeddings,
        )  # fmt: skip
        return blocks * block_size * per_token

    def _load_drafter(self, model: str, target: LoadedModel, config: EngineConfig) -> LoadedModel:
        """The draft model, loaded like the target; its tokens must mean the target's."""
        draft = load_model(resolve_model_path(model), self.dtype, self.device,
                           config.cache.kv_block_size, config.model.attention_backend,
                           target.quantized_activations, warn_unused=False)  # fmt: skip
        if draft.arch.conv_layers:
            raise ConfigError(f"speculative_model {model} carries a state from step to step "
                              "(convolution layers), which the drafter does not keep; draft "
                              "with a model that attends in every layer")  # fmt: skip
        if draft.arch.vocab_size != target.arch.vocab_size:
            raise ConfigError(
                f"speculative_model {model} has a vocabulary of {draft.arch.vocab_size} tokens, "
                f"the model {target.arch.vocab_size}: a draft model must share its tokenizer"
            )
        return draft

    def enable_profiling(self) -> PhaseTimer:
        """Times every phase of every step from now on (`inflight bench offline --profile`)."""
        device = self.device
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else lambda: None
        self.timer = self.runner.timer = PhaseTimer(sync)
        return self.timer

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def finish_requests(
        self, request_ids: list[str], reason: FinishReason, stop_reason: str | None = None
    ) -> list[EngineCoreOutput]:
        return self.scheduler.finish_requests(request_ids, reason, stop_reason)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def _probe_model(self, failed: dict[str, str]) -> None:
        """Every request of the step failed, each alone: if a synthetic request fails too, the
        model is broken, not the requests, and the engine must stop."""
        try:
            self.runner.probe()
        except Exception as e:
            first = next(iter(failed.values()))
            raise ModelFailedError(
                f"the model fails on every request ({first}) and on a probe ({e})"
            ) from e

    def step(self) -> StepResult:
        """schedule -> execute -> update, and the step's record."""
        start = time.perf_counter()
        with self.timer.phase("schedule"):
            scheduler_output: SchedulerOutput = self.scheduler.schedule()
        runner_output = self.runner.execute(scheduler_output)
        if scheduler_output.scheduled and len(runner_output.failed) == len(
            scheduler_output.scheduled
        ):
            self._probe_model(runner_output.failed)
        with self.timer.phase("update"):
            outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        duration_s = time.perf_counter() - start
        self.scheduler.record_step_time(scheduler_output, duration_s)
        stats = self.scheduler.make_stats(
            scheduler_output, len(runner_output.sampled_token_ids), duration_s
        )
        return StepResult(outputs, stats)

    def gauges(self) -> CoreGauges:
        """Sequences and blocks now (after a step, or after an abort between steps)."""
        scheduler, kv = self.scheduler, self.kv_cache_manager
        return CoreGauges(
            num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
            num_swapped=len(kv.swapped), kv_usage=kv.usage,
            kv_blocks_used=kv.pool.num_used_blocks, kv_blocks_total=kv.pool.num_blocks,
        )  # fmt: skip

    def snapshot(self, now: float, max_requests: int = 100) -> CoreSnapshot:
        """The gauges, the block map and the first `max_requests` requests (no prompt text):
        what a dashboard shows of the core."""
        scheduler, kv = self.scheduler, self.kv_cache_manager
        rows: list[list[Any]] = []
        for r in itertools.islice(scheduler.requests.values(), max_requests):
            state = "running" if r.status is RequestStatus.RUNNING else (
                "swapped" if kv.is_swapped(r) else "waiting")  # fmt: skip
            rows.append([r.request_id, state, r.priority, r.num_prompt_tokens,
                         r.num_output_tokens, kv.num_held(r.request_id),
                         round(now - r.arrival_time, 1)])  # fmt: skip
        cpu = kv.cpu_pool
        swap_map = "3" * (cpu.num_used_blocks if cpu is not None else 0)
        return CoreSnapshot(self.gauges(), kv.pool.block_states(), swap_map, rows)
