"""LLM: the offline API. `LLM(model=None, **knobs).generate(prompts, params)` runs the engine
loop in the caller's thread until every request is done and returns outputs in input order.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from inflight.config import EngineConfig
from inflight.engine.engine_core import EngineCore
from inflight.engine.processor import InputProcessor, OutputProcessor, ParentRequest, PromptInput
from inflight.errors import InvalidRequestError
from inflight.model.loader import LoadedModel
from inflight.outputs import RequestOutput
from inflight.request import FinishReason, Request
from inflight.sampling_params import SamplingParams, check_text
from inflight.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

Message = dict[str, Any]


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text of a conversation; `tools` (OpenAI's shape) go to templates that
    render them."""
    if not tokenizer.chat_template:
        raise InvalidRequestError("this model has no chat template", param="messages")
    for i, message in enumerate(messages):
        for key, value in message.items():
            if isinstance(value, str):
                check_text(value, f"messages.{i}.{key}")
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
    except Exception as e:  # jinja errors for malformed messages
        raise InvalidRequestError(f"cannot render the chat template: {e}", "messages") from e


class LLM:
    def __init__(
        self, model: str | None = None, *, loaded_model: LoadedModel | None = None, **knobs: Any
    ) -> None:
        """`loaded_model` reuses weights already in memory (another engine's `core.loaded`)."""
        config = EngineConfig.from_knobs(model=model, **knobs)
        self.core = EngineCore(config, loaded_model)
        self.config = self.core.config
        self.tokenizer = load_tokenizer(self.core.loaded.path)
        eos = set(self.core.arch.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.input_processor = InputProcessor(
            self.tokenizer, self.core.max_model_len, self.core.arch.vocab_size, frozenset(eos)
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generates for every prompt (text or token ids); all are validated before any runs.
        `priority` (one per prompt, lower first) matters under `scheduling_policy="priority"`."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        return self._run([(p, True) for p in prompts], sampling_params, use_tqdm, priority)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Renders each conversation through the model's chat template, then generates."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [(self.render_chat(c), False) for c in conversations]
        return self._run(prompts, sampling_params, use_tqdm)

    def render_chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> str:
        return render_chat(self.tokenizer, messages, tools)

    def _run(
        self,
        prompts: list[tuple[PromptInput, bool]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
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
                str(next(self._ids)), prompt, p, priority=prio, add_special_tokens=special
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
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def add_request(
        self, prompt: PromptInput, params: SamplingParams, add_special_tokens: bool = True
    ) -> str:
        """Queues one request without running the engine (drive it with `step`); returns its id."""
        parent, children = self.input_processor.process(
            str(next(self._ids)), prompt, params, add_special_tokens=add_special_tokens
        )
        self._submit(parent, children)
        return parent.request_id

    def _submit(self, parent: ParentRequest, children: list[Request]) -> None:
        self.output_processor.add_request(parent, children)
        for child in children:
            self.core.add_request(child)

    def step(self) -> list[RequestOutput]:
        """One engine step; returns snapshots of the requests it changed."""
        core_outputs = self.core.step()
        with self.core.timer.phase("output"):
            outputs, stopped = self.output_processor.process_outputs(core_outputs)
            for request_id, stop_string in stopped.items():
                self.core.finish_requests([request_id], FinishReason.STOP, stop_string)
        if self.core.last_step is not None:
            self.core.timer.end_step(self.core.last_step.num_scheduled_seqs)
        return outputs
