"""LLM: the offline API. `LLM(model=None, **knobs).generate(prompts, params)` runs the engine
loop in the caller's thread until every request is done and returns outputs in input order.
(`AsyncLLM` is its asyncio sibling on the same `FrontEnd`.)
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any, cast

from tqdm.auto import tqdm

from inflight.engine.frontend import FrontEnd, Message
from inflight.engine.processor import ParentRequest, PromptInput
from inflight.errors import InvalidRequestError
from inflight.metrics.stats import StepStats
from inflight.model.loader import LoadedModel
from inflight.outputs import RequestOutput
from inflight.request import DEFAULT_TENANT, NO_SLO, FinishReason, Request, SLOTarget
from inflight.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


# what an embedding request runs with: its prompt, then nothing sampled
EMBEDDING_PARAMS = SamplingParams(max_tokens=1, temperature=0)


class LLM(FrontEnd):
    def __init__(
        self, model: str | None = None, *, loaded_model: LoadedModel | None = None, **knobs: Any
    ) -> None:
        """`loaded_model` reuses weights already in memory (another engine's `core.loaded`)."""
        super().__init__(model, loaded_model=loaded_model, **knobs)
        self._ids = itertools.count()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generates for every prompt (text or token ids); all are validated before any runs.
        Without `sampling_params`, the model's recommended settings
        (`get_default_sampling_params`). `priority` (one per prompt, lower first) matters under
        `scheduling_policy="priority"`."""
        one = isinstance(prompts, str) or (
            isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], int)
        )  # a prompt: text, or token ids
        batch = [cast(PromptInput, prompts)] if one else list(cast(list[PromptInput], prompts))
        return self._run([(p, True) for p in batch], sampling_params, use_tqdm, priority)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Renders each conversation through the model's chat template (with its own variables
        from `chat_template_kwargs`, such as Qwen3's `enable_thinking`), then generates."""
        one = bool(messages) and isinstance(messages[0], dict)
        conversations = cast(list[list[Message]], [messages] if one else messages)
        prompts: list[tuple[PromptInput, bool]] = [
            (self.render_chat(c, template_kwargs=chat_template_kwargs), False)
            for c in conversations
        ]
        return self._run(prompts, sampling_params, use_tqdm)

    def embed(
        self, prompts: PromptInput | Sequence[PromptInput], use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """An embedding model's vector of every prompt (`RequestOutput.embedding`: pooled as
        the model pools, L2-normalized); a generative model refuses."""
        one = isinstance(prompts, str) or (
            isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], int)
        )
        batch = [cast(PromptInput, prompts)] if one else list(cast(list[PromptInput], prompts))
        return self._run([(p, True) for p in batch], EMBEDDING_PARAMS, use_tqdm, embed=True)

    def _run(
        self,
        prompts: list[tuple[PromptInput, bool]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        priority: Sequence[int] | None = None,
        embed: bool = False,
    ) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise InvalidRequestError(
                f"got {len(prompts)} prompts but {len(params)} sampling params", "sampling_params"
            )
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        if len(priorities) != len(prompts):
            raise InvalidRequestError(
                f"got {len(prompts)} prompts but {len(priorities)} priorities", "priority"
            )
        # Validate everything first, so a bad prompt leaves nothing half-submitted.
        processed = [
            self.input_processor.process(
                str(next(self._ids)),
                prompt,
                p,
                priority=prio,
                add_special_tokens=special,
                embed=embed,
            )
            for (prompt, special), p, prio in zip(prompts, params, priorities, strict=True)
        ]
        order = {parent.request_id: i for i, (parent, _) in enumerate(processed)}
        for parent, children in processed:
            self._submit(parent, children)

        results: list[RequestOutput | None] = [None] * len(processed)
        bar = tqdm(total=len(processed), desc="generating", unit="req", disable=not use_tqdm)
        num_generated = 0
        with bar:
            while self.core.has_unfinished_requests():
                for out in self.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        num_generated += sum(len(o.token_ids) for o in out.outputs)
                        bar.update(1)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(f"{num_generated / elapsed:.1f} out tok/s")
        done = [r for r in results if r is not None]
        assert len(done) == len(results)
        return done

    def add_request(
        self, prompt: PromptInput, params: SamplingParams, add_special_tokens: bool = True,
        tenant: str = DEFAULT_TENANT, slo: SLOTarget = NO_SLO,
    ) -> str:  # fmt: skip
        """Queues one request without running the engine (drive it with `step`); returns its id.
        `tenant`: whose share it uses under `scheduling_policy="fair"`; `slo`: its latency
        targets (the engine's `slo_ttft` / `slo_tpot` where it sets none). Raises SLOUnmetError
        when SLO admission predicts it would miss its TTFT target."""
        parent, children = self.input_processor.process(
            str(next(self._ids)), prompt, params, add_special_tokens=add_special_tokens,
            tenant=tenant, slo=slo,
        )  # fmt: skip
        scheduler = self.core.scheduler
        scheduler.check_slo(children, scheduler.clock())
        self._submit(parent, children)
        return parent.request_id

    def _submit(self, parent: ParentRequest, children: list[Request]) -> None:
        self.output_processor.register(parent, children)
        for child in children:
            self.core.add_request(child)

    def step(self) -> list[RequestOutput]:
        """One engine step; returns snapshots of the requests it changed."""
        return self.step_with_stats()[0]

    def step_with_stats(self) -> tuple[list[RequestOutput], StepStats]:
        """One engine step: snapshots of the requests it changed, and the step's record."""
        result = self.core.step()
        with self.core.timer.phase("output"):
            outputs, stopped = self.output_processor.process_outputs(result.outputs)
            for request_id, stop_string in stopped.items():
                self.core.finish_requests([request_id], FinishReason.STOP, stop_string)
        self.core.timer.end_step(result.stats)
        return outputs, result.stats
