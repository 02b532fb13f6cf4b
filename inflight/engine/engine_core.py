"""EngineCore: owns scheduler, KV cache and model runner; `step()` = schedule -> execute -> update.

Built from an EngineConfig: loads the model, resolves `max_model_len` and the number of KV
blocks, and refuses configurations where one request of `max_model_len` tokens could never fit
in the pool (such a request would be preempted forever).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from inflight.config import EngineConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.outputs import EngineCoreOutput, SchedulerOutput
from inflight.core.scheduler import Scheduler
from inflight.core.sizing import cdiv, num_blocks_for_budget, plan_kv_pool
from inflight.errors import ConfigError, ModelFailedError
from inflight.metrics.profiling import NO_TIMER, PhaseTimer, Timer
from inflight.metrics.stats import StepStats
from inflight.model.arch import LlamaArchConfig
from inflight.model.loader import (
    LoadedModel,
    arch_config,
    check_memory_fits,
    estimated_weight_bytes,
    load_model,
    resolve_model_path,
    resolve_quantized_activations,
)
from inflight.platform import resolve_device, resolve_dtype
from inflight.request import FinishReason, Request
from inflight.runner.cuda_graphs import DecodeGraphs, supports_graphs
from inflight.runner.drafter import Drafter
from inflight.runner.kv_cache import KVCache, kv_bytes_per_token, resolve_kv_cache_dtype
from inflight.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def warm_up_tokens(budget: int, max_model_len: int, device: torch.device, block_size: int) -> int:
    """Prompt tokens of the start-up warm-up. A GPU's is a full step budget: kernels and
    libraries set up per shape there, and the largest shapes come first. A CPU's first-use costs
    do not grow with the step's size, while its compute does: one block (a 512-token chunk cost
    1 s on SmolLM2 and 20 s on a 3B model on a 2-core CPU, and made no later step faster:
    the first generate of 16 new prompts took 2.5-3.2 s after either)."""
    if device.type != "cpu":
        return min(budget, max_model_len)
    return min(budget, max_model_len, block_size)


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        device = resolve_device(config.model.device)
        dtype = resolve_dtype(config.model.dtype, device)
        kv_dtype = resolve_kv_cache_dtype(config.cache.kv_cache_dtype, dtype)
        block_size = config.cache.kv_block_size
        activations = resolve_quantized_activations(
            config.model.quantized_activations, dtype, config.scheduler.max_num_seqs
        )
        if loaded is None:
            path = resolve_model_path(config.model.model)
            if device.type == "cpu":  # the weights and the pool share the machine's memory
                check_memory_fits(path, estimated_weight_bytes(path, dtype, activations),
                                  self._kv_bytes(config, arch_config(path), kv_dtype))  # fmt: skip
            loaded = load_model(path, dtype, device, block_size, config.model.attention_backend,
                                activations)  # fmt: skip
        elif why := loaded.mismatch(dtype, activations):
            raise ConfigError(why)
        arch = loaded.arch
        sched_cfg = config.scheduler
        draft = None
        if sched_cfg.speculative_model is not None:
            draft = self._load_drafter(sched_cfg.speculative_model, loaded, dtype, device, config)

        requested_len = config.model.max_model_len
        # the drafter's KV shares the pool's blocks: a block costs both models' bytes (swap
        # space holds only the target's: a drafter's KV is recomputed after preemption)
        target_bytes_per_token = bytes_per_token = kv_bytes_per_token(arch, kv_dtype)
        max_positions = arch.max_position_embeddings
        if draft is not None:
            bytes_per_token += kv_bytes_per_token(draft.arch, kv_dtype)
            max_positions = min(max_positions, draft.arch.max_position_embeddings)
        swap_bytes = config.cache.swap_space_bytes if sched_cfg.preemption_mode == "swap" else 0
        plan = plan_kv_pool(
            bytes_per_token=bytes_per_token, block_size=block_size,
            memory_bytes=config.cache.kv_cache_memory_bytes,
            num_kv_blocks=config.cache.num_kv_blocks, max_num_seqs=sched_cfg.max_num_seqs,
            requested_len=requested_len, model_limit=max_positions,
            swap_space_bytes=swap_bytes, swap_bytes_per_token=target_bytes_per_token,
        )  # fmt: skip
        num_blocks, max_model_len, num_cpu_blocks = (
            plan.num_blocks, plan.max_model_len, plan.num_cpu_blocks
        )  # fmt: skip
        sched_cfg = dataclasses.replace(sched_cfg, max_model_len=max_model_len)
        self.config = dataclasses.replace(config, scheduler=sched_cfg)
        for model in (loaded, draft):  # LongRoPE's side, before any graph reads the rotation
            if model is not None:
                model.model.fit_rope_to(max_model_len)

        self.loaded = loaded
        self.arch = arch
        self.device, self.dtype = device, dtype
        self.max_model_len = max_model_len
        attn = loaded.model.layers[0].attn
        use_graphs = supports_graphs(attn, device) and not config.model.enforce_eager
        # the scratch block: the start-up warm-up's, and padding rows' of decode graphs
        self.kv_cache = KVCache(
            arch, attn, num_blocks, kv_dtype, device, num_cpu_blocks, scratch_block=True
        )
        self.kv_cache_manager = KVCacheManager(
            num_blocks, block_size, config.cache.enable_prefix_caching, num_cpu_blocks
        )
        self.scheduler = Scheduler(sched_cfg, self.kv_cache_manager)
        graphs = None
        if use_graphs:
            graphs = DecodeGraphs(
                loaded.model, self.kv_cache, sched_cfg.max_num_seqs, max_model_len, device
            )
            graphs.capture_all()
        drafter = None
        if draft is not None:
            draft_attn = draft.model.layers[0].attn
            draft_kv = KVCache(draft.arch, draft_attn, num_blocks, kv_dtype, device,
                               scratch_block=True)  # fmt: skip
            drafter = Drafter(draft.model, draft_kv, draft_attn, device)
        self.runner = ModelRunner(
            loaded.model, self.kv_cache, attn, device, config.model.seed, graphs, drafter
        )
        self.runner.warm_up(warm_up_tokens(sched_cfg.max_num_batched_tokens, max_model_len,
                                           device, block_size))  # fmt: skip
        self.timer: Timer = NO_TIMER
        self.last_step = StepStats()  # the latest step's record (all zeros before the first)
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB, %s), max_model_len %d",
            num_blocks,
            block_size,
            self.kv_cache.num_bytes / 2**20,
            str(kv_dtype).removeprefix("torch."),
            max_model_len,
        )
        assert cdiv(max_model_len, block_size) <= num_blocks

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

    @staticmethod
    def _load_drafter(
        model: str, target: LoadedModel, dtype: torch.dtype, device: torch.device,
        config: EngineConfig,
    ) -> LoadedModel:  # fmt: skip
        """The draft model, loaded like the target; its tokens must mean the target's."""
        cfg = config.model
        draft = load_model(resolve_model_path(model), dtype, device, config.cache.kv_block_size,
                           cfg.attention_backend, target.quantized_activations)  # fmt: skip
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

    def step(self) -> list[EngineCoreOutput]:
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
        self.last_step = self.scheduler.make_stats(
            scheduler_output, len(runner_output.sampled_token_ids), time.perf_counter() - start
        )
        return outputs
