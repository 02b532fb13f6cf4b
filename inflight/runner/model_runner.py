"""ModelRunner: SchedulerOutput -> one flat forward pass (`step_inputs.py`) -> one sampled token
per sampling request, after the drafts it carries are verified."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch

from inflight.attention import AttentionBackend
from inflight.core.kv_groups import KVLayout
from inflight.core.outputs import (
    Logprobs,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from inflight.errors import ModelFailedError
from inflight.kernels import load_extension
from inflight.metrics.profiling import NO_TIMER, Timer
from inflight.model.llama import LlamaModel
from inflight.parallel.workers import RankWorkers
from inflight.runner.conv_state import ConvState
from inflight.runner.cuda_graphs import DecodeGraphs
from inflight.runner.drafter import Drafter
from inflight.runner.kv_cache import KVCache
from inflight.runner.sampler import Sampler, token_logprobs
from inflight.runner.step_inputs import StepInputs, build_step_inputs, kv_group_args
from inflight.sampling_params import SamplingParams
from inflight.structured import GrammarMasks

WARM_UP_CHUNK = 512  # tokens per prompt chunk of the start-up warm-up
# tokens per step of a convolution state's rebuild after a failed step (`_rebuild_states`)
REBUILD_CHUNK_TOKENS = 512

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        attn_backend: AttentionBackend,
        device: torch.device,
        seed: int = 0,
        decode_graphs: DecodeGraphs | None = None,
        drafter: Drafter | None = None,
        kv_layout: KVLayout | None = None,
        workers: RankWorkers | None = None,
        conv_state: ConvState | None = None,
    ) -> None:
        self.model = model
        # each running request's convolution inputs, for a model with convolution layers
        self.conv_state = conv_state
        self.workers = workers  # the other tensor-parallel ranks, where the model is split
        # several KV groups (core/kv_groups.py): each layer's, and what stands for null blocks
        self.layer_groups, self.null_block = kv_group_args(kv_layout, kv_cache)
        self.drafter = drafter  # writes the drafts of draft-model speculation
        self.decode_graphs = decode_graphs
        self.kv_cache = kv_cache
        self.attn_backend = attn_backend
        self.device = device
        self.block_size = kv_cache.block_size
        # The C++ kernels (chosen with the attention backend) include greedy sampling's argmax.
        if attn_backend.cpu_kernels:
            self.sampler = Sampler(device, seed, argmax=load_extension().first_argmax)
        else:
            self.sampler = Sampler(device, seed)
        self.grammar_masks = GrammarMasks()
        # an embedding model's mean pooling: each request's sum of hidden states so far
        self._pooled_sums: dict[str, torch.Tensor] = {}
        self.timer: Timer = NO_TIMER
        # Test-only: called with every request of a batch before its forward pass, so a test
        # can make one request's processing fail.
        self.fault_hook: Callable[[ScheduledRequest], None] | None = None

    @torch.inference_mode()
    def warm_up(self, num_prompt_tokens: int) -> None:
        """One step of `num_prompt_tokens` prompt tokens (in chunks of at most `WARM_UP_CHUNK`,
        so attention stays cheap; how many: `engine_core.warm_up_tokens`) and a decode, sampled,
        every token's K/V in the scratch block (tables that name it over and over), so that
        kernels compile, libraries set up and memory is allocated and touched before the first
        request, not during it (without it, the first steps of a process are measurably slower
        on GPUs and on AVX-512 CPUs)."""
        scratch = self.kv_cache.scratch_block
        if scratch is None:
            raise ValueError("warming up needs a KV cache with a scratch block")

        greedy = SamplingParams(temperature=0)  # draws nothing from the shared generator

        others = max(self.layer_groups, default=0)  # the other KV groups' tables: the same

        def chunk(name: str, num_tokens: int) -> ScheduledRequest:
            tokens = [0] * num_tokens
            table = [scratch] * -(-num_tokens // self.block_size)
            return ScheduledRequest(name, tokens, 0, table, True, greedy, tokens, [],
                                    group_tables=[table] * others)  # fmt: skip

        sizes = [WARM_UP_CHUNK] * (num_prompt_tokens // WARM_UP_CHUNK)
        sizes += [num_prompt_tokens % WARM_UP_CHUNK] if num_prompt_tokens % WARM_UP_CHUNK else []
        scheduled = [chunk(f"warm-up {i}", n) for i, n in enumerate(sizes)]
        # a decode: the token after a one-token prompt
        decode = ScheduledRequest("warm-up decode", [0], 1, [scratch] * 2, True, greedy, [0], [0],
                                  group_tables=[[scratch] * 2] * others)  # fmt: skip
        scheduled.append(decode)
        logits = self.run_model(self.step_inputs(scheduled, warm_up=True))
        if self.drafter is not None:
            self.drafter.warm_up(scheduled)
        self.sampler.sample(logits, scheduled)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step_inputs(
        self, scheduled: list[ScheduledRequest], score_prompts: bool = True,
        every_row: bool = False, warm_up: bool = False,
    ) -> StepInputs:  # fmt: skip
        """The forward pass's inputs (`build_step_inputs`, and the convolution state's reads
        and writes, a `warm_up`'s on scratch rows); the other tensor-parallel ranks are handed
        the step once this rank's are built (so a step that cannot be built runs nowhere), and
        run it beside this one."""
        inputs = build_step_inputs(scheduled, self.block_size, self.attn_backend, self.device,
                                   score_prompts=score_prompts, every_row=every_row,
                                   layer_groups=self.layer_groups,
                                   null_block=self.null_block)  # fmt: skip
        conv_rows = None
        if self.conv_state is not None:
            inputs.conv_step = self.conv_state.step(scheduled, inputs.query_start_loc,
                                                    scratch=warm_up)  # fmt: skip
            conv_rows = inputs.conv_step.rows
        if self.workers is not None:
            self.workers.forward(scheduled, score_prompts=score_prompts, every_row=every_row,
                                 conv_rows=conv_rows)  # fmt: skip
        return inputs

    def run_model(self, inputs: StepInputs) -> torch.Tensor:
        """The forward pass over `inputs`. Split over ranks, one that fails leaves the others'
        collectives out of step with this one's, so it stops the engine (ModelFailedError)
        rather than being retried as one request's fault."""
        try:
            if inputs.conv_step is None:
                return self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers,
                                  inputs.attn_metadata, inputs.logits_indices,
                                  inputs.layer_metadata)  # fmt: skip
            logits = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers,
                                inputs.attn_metadata, inputs.logits_indices,
                                inputs.layer_metadata, conv_step=inputs.conv_step)  # fmt: skip
            inputs.conv_step.commit()  # (only once the pass is through: a retry reads anew)
            return logits
        except Exception as e:
            if self.workers is None or isinstance(e, ModelFailedError):
                raise
            raise ModelFailedError(f"a forward pass of the split model failed on rank 0: "
                                   f"{type(e).__name__}: {e}") from e  # fmt: skip

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.grammar_masks.drop(out.finished_request_ids)
        for request_id in out.finished_request_ids:
            self._pooled_sums.pop(request_id, None)
        if self.drafter is not None:
            self.drafter.drop(out.finished_request_ids + out.preempted_request_ids)
        states: tuple[list[tuple[str, int]], list[str], list[tuple[int, int]]] = ([], [], [])
        if self.conv_state is not None:  # (a swapped request's state goes to host memory)
            kept_drafts = self.conv_state.take_kept_drafts()  # (before a swap stashes its row)
            ended = out.finished_request_ids + out.preempted_request_ids
            states = (self.conv_state.swap_out(out.swapped_request_ids),
                      self.conv_state.release(ended), kept_drafts)  # fmt: skip
        self.kv_cache.swap(out.swap_out, out.swap_in)
        if self.workers is not None and (out.swap_out or out.swap_in or any(states)):
            self.workers.swap(out.swap_out, out.swap_in, states)
        if not out.scheduled:
            return ModelRunnerOutput()
        return self._run_isolating(out.scheduled)

    def _run_isolating(self, scheduled: list[ScheduledRequest]) -> ModelRunnerOutput:
        """Runs the batch; if it fails, runs its halves apart, down to single requests, so one
        request whose inputs break the step fails alone and everyone else gets their token.
        Running a request again rewrites the same KV slots with the same values, and a seeded
        request's draws depend on its output positions alone, so the tokens are those of one
        clean run."""
        if not scheduled:  # (a half emptied by the requests that failed their state's rebuild)
            return ModelRunnerOutput()
        try:
            return self._run(scheduled)
        except ModelFailedError:  # (a tensor-parallel rank is gone): no request's fault
            raise
        except Exception as e:
            if len(scheduled) == 1:
                request_id = scheduled[0].request_id
                logger.error("request %s failed in the step: %s: %s",
                             request_id, type(e).__name__, e, exc_info=e)  # fmt: skip
                return ModelRunnerOutput(failed={request_id: f"{type(e).__name__}: {e}"})
            logger.warning("a step of %d requests failed (%s); running them apart",
                           len(scheduled), type(e).__name__)  # fmt: skip
            result = ModelRunnerOutput()
            if self.conv_state is not None:  # their state rows may be half-advanced
                failed = self._rebuild_states(scheduled)
                result.failed.update(failed)
                scheduled = [s for s in scheduled if s.request_id not in failed]
            mid = len(scheduled) // 2
            result.merge(self._run_isolating(scheduled[:mid]))
            result.merge(self._run_isolating(scheduled[mid:]))
            return result

    def _rebuild_states(self, scheduled: list[ScheduledRequest]) -> dict[str, str]:
        """Each request's convolution state as it was before a failed step: recomputed from its
        first token to the step's start, alone, in chunks (its KV blocks rewritten with the
        values they hold: a token's computation never depends on its batch). Returns the
        requests whose own tokens fail there, with the error."""
        failed = {}
        for s in scheduled:
            history = (s.prompt_token_ids + s.output_token_ids)[: s.start_pos]
            try:
                for start in range(0, len(history), REBUILD_CHUNK_TOKENS):
                    chunk = history[start : start + REBUILD_CHUNK_TOKENS]
                    replay = dataclasses.replace(s, token_ids=chunk, start_pos=start,
                                                 sample=False, draft_token_ids=[], grammar=None,
                                                 sampling_params=SamplingParams())  # fmt: skip
                    self._run([replay])
            except ModelFailedError:
                raise
            except Exception as e:
                logger.error("request %s failed rebuilding its state: %s: %s",
                             s.request_id, type(e).__name__, e, exc_info=e)  # fmt: skip
                failed[s.request_id] = f"{type(e).__name__}: {e}"
        return failed

    def _run(self, scheduled: list[ScheduledRequest]) -> ModelRunnerOutput:
        if self.fault_hook is not None:
            for s in scheduled:
                self.fault_hook(s)
        if self.model.cfg.pooling is not None:
            return self._embed(scheduled)
        drafter_seconds = 0.0
        if self.drafter is not None:
            with self.timer.phase("draft"):
                start = time.perf_counter()
                scheduled = self.drafter.fill(scheduled)
                drafter_seconds = time.perf_counter() - start
        sampling = [s for s in scheduled if s.sample]
        # rows of the requests that sample plainly (speculating ones are verified apart; they
        # are never constrained)
        plain = [s for s in sampling if not s.draft_token_ids]
        constrained = [row for row, s in enumerate(plain) if s.grammar is not None]
        masks = None
        if constrained:  # filled beside the forward pass, which releases the GIL
            masks = self.grammar_masks.start_fill([plain[row] for row in constrained])
        try:
            logits, prompt_rows = self._forward(scheduled)
        finally:
            # always waited for: the matchers must be idle before anything runs them again
            bitmask = None
            if masks is not None:
                with self.timer.phase("grammar"):
                    bitmask = masks.result()
        result = ModelRunnerOutput(drafter_seconds=drafter_seconds)
        if prompt_rows:
            num_scoring = sum(n for _, _, n in prompt_rows)
            logits, scoring = logits[:-num_scoring], logits[-num_scoring:]
            with self.timer.phase("sample"):
                result.prompt_logprobs = self._prompt_logprobs(scoring, prompt_rows, scheduled)
        if not sampling:
            return result
        if len(plain) < len(sampling):
            logits, sampling = self._verify_drafts(logits, sampling, result)
            if not sampling:
                return result
        if bitmask is not None:
            with self.timer.phase("grammar"):
                for row in self.grammar_masks.apply(logits, constrained, bitmask):
                    result.failed[sampling[row].request_id] = "the grammar allows no token here"
        with self.timer.phase("sample"):
            token_ids, logprobs = self.sampler.sample(logits, sampling)
        for s, token_id, lp in zip(sampling, token_ids, logprobs, strict=True):
            if s.request_id in result.failed:
                continue
            if s.grammar is not None:  # last: it never raises, so a retry cannot replay it
                complete, error = self.grammar_masks.accept(s.request_id, token_id)
                if error is not None:
                    result.failed[s.request_id] = error
                    continue
                if complete:
                    result.grammar_complete.add(s.request_id)
            result.sampled_token_ids[s.request_id] = token_id
            if lp is not None:
                result.logprobs[s.request_id] = lp
        return result

    def _verify_drafts(
        self, logits: torch.Tensor, sampling: list[ScheduledRequest], result: ModelRunnerOutput
    ) -> tuple[torch.Tensor, list[ScheduledRequest]]:
        """Verifies every speculating request on its rows (its last token's and each draft's)
        into `result`; returns the other requests and their logits rows, one each."""
        plain_rows, plain, row = [], [], 0
        with self.timer.phase("sample"):
            for s in sampling:
                num_rows = 1 + len(s.draft_token_ids)
                if s.draft_token_ids:
                    *kept, token_id = self.sampler.verify(logits[row : row + num_rows], s)
                    result.accepted_draft_ids[s.request_id] = kept
                    if self.drafter is not None:
                        self.drafter.commit(s, len(kept))
                    if self.conv_state is not None:
                        self.conv_state.keep_drafts(s, len(kept))
                    result.sampled_token_ids[s.request_id] = token_id
                else:
                    plain_rows.append(row)
                    plain.append(s)
                row += num_rows
        return logits[plain_rows], plain

    def _forward(
        self, scheduled: list[ScheduledRequest]
    ) -> tuple[torch.Tensor, list[tuple[str, int, int]]]:
        """Logits [S, V] of the requests in `scheduled` that sample, in their order, then the
        rows that score prompt tokens (`StepInputs.prompt_rows`, returned beside them)."""
        graphs = self.decode_graphs
        if graphs is not None and graphs.fits(scheduled):  # decodes score no prompt
            with self.timer.phase("prepare_inputs"):
                size = graphs.load(scheduled)
            with self.timer.phase("forward"):
                return graphs.forward(size, len(scheduled)), []
        with self.timer.phase("prepare_inputs"):
            inputs = self.step_inputs(scheduled)
        with self.timer.phase("forward"):
            logits = self.run_model(inputs)
        return logits, inputs.prompt_rows

    def _embed(self, scheduled: list[ScheduledRequest]) -> ModelRunnerOutput:
        """An embedding model's step: each request whose prompt is done gets its vector, the
        last token's final hidden state (`last`) or the mean of all of them (`mean`, summed
        chunk by chunk), L2-normalized in float32."""
        mean = self.model.cfg.pooling == "mean"
        with self.timer.phase("prepare_inputs"):
            inputs = self.step_inputs(scheduled, score_prompts=False, every_row=mean)
        with self.timer.phase("forward"):
            hidden = self.run_model(inputs).float()
        result, row = ModelRunnerOutput(), 0
        for s in scheduled:
            if mean:
                chunk = hidden[row : row + s.num_tokens].sum(dim=0)
                row += s.num_tokens
                earlier = self._pooled_sums.pop(s.request_id, None)
                if s.start_pos > 0 and earlier is not None:  # (recomputed from 0: anew)
                    chunk = chunk + earlier
                if not s.sample:
                    self._pooled_sums[s.request_id] = chunk
                    continue
                vector = chunk / len(s.prompt_token_ids)
            elif s.sample:
                vector, row = hidden[row], row + 1
            else:
                continue
            vector = vector / vector.norm().clamp_min(torch.finfo(torch.float32).tiny)
            result.embeddings[s.request_id] = vector.tolist()
        return result

    @staticmethod
    def _prompt_logprobs(
        logits: torch.Tensor, rows: list[tuple[str, int, int]], scheduled: list[ScheduledRequest]
    ) -> dict[str, tuple[int, list[Logprobs]]]:
        """Each prompt token's score from the logits of the position before it (the raw
        distribution, as sampled tokens' logprobs), with the top alternatives asked for."""
        by_id = {s.request_id: s for s in scheduled}
        scored, row = {}, 0
        for request_id, first, n in rows:  # one request's rows at a time: one float32 copy
            s = by_id[request_id]
            targets = s.prompt_token_ids[first + 1 : first + 1 + n]
            num_top = s.sampling_params.prompt_logprobs or 0
            logprobs = torch.log_softmax(logits[row : row + n].to(torch.float32), dim=-1)
            entries = token_logprobs(logprobs, targets, num_top)
            scored[request_id] = (first + 1, entries)
            row += n
        return scored

    def probe(self) -> None:
        """One prompt token and one decode on the scratch block: raises if the model itself
        cannot run a step (told apart from requests that break a step)."""
        self.warm_up(1)
