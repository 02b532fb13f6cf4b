"""Both ends of a request outside the core, shared by the offline and the HTTP front ends.

InputProcessor turns a prompt (text or token ids) and SamplingParams into core Requests,
rejecting with InvalidRequestError anything the core could never serve. A request with `n > 1`
fans out into n core requests `<id>-0 .. <id>-(n-1)` (seeded ones get seed + i), gathered back
into one RequestOutput by the OutputProcessor, which also detokenizes and applies stop strings.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from inflight.core.outputs import EngineCoreOutput, Logprobs
from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.errors import InvalidRequestError
from inflight.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inflight.request import DEFAULT_TENANT, NO_SLO, FinishReason, Request, SLOTarget
from inflight.sampling_params import MAX_INT64, SamplingParams, check_int, check_text
from inflight.structured import Grammars

PromptInput = str | list[int]


class InputProcessor:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_model_len: int,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        pooling: str | None = None,
        default_slo: SLOTarget = NO_SLO,
    ) -> None:
        """`pooling`: the model's, where it is an embedding model (it then serves only
        embedding requests, and a generative one only generation). `default_slo`: the targets
        of a request that sets none (the engine's `slo_ttft`, `slo_tpot`)."""
        self.tokenizer = tokenizer
        self.default_slo = default_slo
        self.pooling = pooling
        self.grammars = Grammars(tokenizer, vocab_size, sorted(eos_token_ids))
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        # No text longer than this fits the context: a token covers at most its own string's
        # characters (x4 for normalizers that fold several characters into one). Checking it
        # first keeps a multi-megabyte prompt from holding the tokenizer for seconds.
        longest_token = max((len(t) for t in tokenizer.get_vocab()), default=1)
        self.max_prompt_chars = 4 * longest_token * max_model_len

    def tokenize(
        self, prompt: PromptInput, add_special_tokens: bool = True
    ) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
            if not prompt:
                raise InvalidRequestError("prompt must not be empty", param="prompt")
            if len(prompt) > self.max_prompt_chars:
                raise InvalidRequestError(
                    f"the prompt has {len(prompt)} characters, more than any text of at most "
                    f"{self.max_model_len} tokens (this model's context) can have", "prompt",
                )  # fmt: skip
            ids = self.tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids
            return prompt, ids
        if not isinstance(prompt, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            raise InvalidRequestError("prompt must be a string or a list of token ids", "prompt")
        if not prompt:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        return None, list(prompt)

    def _validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt has token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}",
                param="prompt", code="outside_vocabulary",
            )  # fmt: skip
        for name, ids in (
            ("stop_token_ids", params.stop_token_ids),
            ("logit_bias", list(params.logit_bias or ())),
        ):
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise InvalidRequestError(
                    f"{name} has token ids outside the vocabulary [0, {self.vocab_size})", name,
                    "outside_vocabulary",
                )  # fmt: skip
        if params.top_k > self.vocab_size:
            raise InvalidRequestError(
                f"top_k must be -1, 0 (disabled) or at most the vocabulary size "
                f"{self.vocab_size}, got {params.top_k}", param="top_k", code="outside_vocabulary",
            )  # fmt: skip
        n_prompt = len(prompt_ids)
        if n_prompt + params.max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"this model's maximum context length is {self.max_model_len} tokens, but "
                f"{n_prompt + params.max_tokens} were requested ({n_prompt} in the prompt, "
                f"{params.max_tokens} for max_tokens); shorten the prompt or lower max_tokens",
                param="max_tokens" if n_prompt < self.max_model_len else "prompt",
                code="context_length_exceeded",
            )

    def process(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams,
        priority: int = 0,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
        embed: bool = False,
        tenant: str = DEFAULT_TENANT,
        slo: SLOTarget = NO_SLO,
    ) -> tuple[ParentRequest, list[Request]]:
        """Validates and fans out one request; raises InvalidRequestError before any side effect.
        `embed`: the prompt's vector is asked for, which only an embedding model gives. `slo`:
        its latency targets, each missing one the engine's default.

        `add_special_tokens=False` is for prompts rendered by a chat template, which already
        carry their special tokens.
        """
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("sampling params must be a SamplingParams", "sampling_params")
        if embed and self.pooling is None:
            raise InvalidRequestError(
                "this model generates text and gives no embeddings (an embedding model pools its "
                "hidden states: a sentence-transformers folder, a bare decoder such as "
                "Qwen3Model, or a GGUF file with a pooling_type)", "model", "model_not_supported",
            )  # fmt: skip
        if not embed and self.pooling is not None:
            raise InvalidRequestError(
                "this is an embedding model: it gives embeddings (/v1/embeddings, LLM.embed), "
                "not generated text", "model", "model_not_supported",
            )  # fmt: skip
        check_int(priority, "priority", -MAX_INT64 - 1, MAX_INT64)
        if cache_salt is not None:
            check_text(cache_salt, "cache_salt")
        prompt_text, prompt_ids = self.tokenize(prompt, add_special_tokens)
        self._validate(prompt_ids, params)
        grammar = None
        if params.structured_outputs is not None:
            grammar = self.grammars.compile(params.structured_outputs)
        arrival = time.monotonic()
        children = []
        for i in range(params.n):
            child_params = params
            if params.n > 1:
                seed = None if params.seed is None else params.seed + i
                # the prompt is scored once, by the first child (the others may hit the cache)
                scores = params.prompt_logprobs if i == 0 else None
                child_params = dataclasses.replace(params, n=1, seed=seed, prompt_logprobs=scores)
            children.append(
                Request(
                    request_id=child_request_id(request_id, i, params.n),
                    prompt_token_ids=prompt_ids,
                    sampling_params=child_params,
                    eos_token_ids=self.eos_token_ids,
                    arrival_time=arrival,
                    priority=priority,
                    cache_salt=cache_salt,
                    grammar=grammar,
                    tenant=tenant,
                    slo=slo.over(self.default_slo),
                )
            )
        parent = ParentRequest(request_id, prompt_text, prompt_ids, params, arrival)
        return parent, children


def child_request_id(request_id: str, index: int, n: int) -> str:
    return request_id if n == 1 else f"{request_id}-{index}"


@dataclass
class ParentRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    outputs: list[CompletionOutput] = field(default_factory=list)
    metrics: RequestMetrics = field(init=False)
    num_finished: int = 0
    prompt_logprobs: list[Logprobs | None] | None = None
    embedding: list[float] | None = None
    num_cached_tokens: int | None = None  # the fewest any child found (none reported: None)

    def __post_init__(self) -> None:
        want_logprobs = self.params.logprobs is not None
        self.outputs = [
            CompletionOutput(i, "", [], logprobs=[] if want_logprobs else None)
            for i in range(self.params.n)
        ]
        self.metrics = RequestMetrics(self.arrival_time)

    @property
    def finished(self) -> bool:
        return self.num_finished == self.params.n

    def snapshot(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[o.copy() for o in self.outputs],
            finished=self.finished,
            metrics=self.metrics.copy(),
            prompt_logprobs=self.prompt_logprobs,
            embedding=self.embedding,
            num_cached_tokens=self.num_cached_tokens or 0,
        )


@dataclass
class _ChildState:
    parent: ParentRequest
    index: int
    detokenizer: IncrementalDetokenizer


class OutputProcessor:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.children: dict[str, _ChildState] = {}

    def register(self, parent: ParentRequest, children: list[Request]) -> None:
        for i, child in enumerate(children):
            detok = IncrementalDetokenizer(
                self.tokenizer, parent.prompt_token_ids, child.sampling_params
            )
            self.children[child.request_id] = _ChildState(parent, i, detok)

    def has_unfinished(self) -> bool:
        return bool(self.children)

    def process_outputs(
        self, core_outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput], dict[str, str]]:
        """Returns snapshots of the parents that changed, and {child id: stop string} to finish."""
        updated: dict[str, ParentRequest] = {}
        stopped: dict[str, str] = {}
        now = time.monotonic()
        for out in core_outputs:
            state = self.children.get(out.request_id)
            if state is None:
                continue  # already finished here (a stop string) before the core knew
            parent, completion = state.parent, state.parent.outputs[state.index]
            if out.prompt_logprobs is not None and parent.prompt_logprobs is None:
                parent.prompt_logprobs = [None, *out.prompt_logprobs]
            if out.embedding is not None:
                parent.embedding = out.embedding
            if parent.num_cached_tokens is None or out.num_cached_tokens < parent.num_cached_tokens:
                parent.num_cached_tokens = out.num_cached_tokens
            stop_string = state.detokenizer.add_tokens(out.new_token_ids)
            consumed = state.detokenizer.num_consumed  # none past a stop string
            completion.token_ids.extend(out.new_token_ids[:consumed])
            if completion.logprobs is not None:
                completion.logprobs.extend(out.new_logprobs[:consumed])
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            if stop_string is not None and finish_reason is None:
                finish_reason, stop_reason = FinishReason.STOP, stop_string
                stopped[out.request_id] = stop_string
            elif stop_string is not None:  # the core finished it in the same step
                finish_reason, stop_reason = FinishReason.STOP, stop_string
            completion.text += state.detokenizer.take_delta(finished=finish_reason is not None)
            self._update_metrics(parent.metrics, out)
            if finish_reason is not None:
                completion.finish_reason = finish_reason.value
                completion.stop_reason = stop_reason
                parent.num_finished += 1
                finished_at = out.finished_time or now
                parent.metrics.finished_time = max(parent.metrics.finished_time or 0.0, finished_at)
                del self.children[out.request_id]
            updated[parent.request_id] = parent
        return [p.snapshot() for p in updated.values()], stopped

    @staticmethod
    def _update_metrics(metrics: RequestMetrics, out: EngineCoreOutput) -> None:
        def earliest(a: float | None, b: float | None) -> float | None:
            return b if a is None else a if b is None else min(a, b)

        metrics.first_scheduled_time = earliest(
            metrics.first_scheduled_time, out.first_scheduled_time
        )
        metrics.first_token_time = earliest(metrics.first_token_time, out.first_token_time)
        metrics.num_preemptions = max(metrics.num_preemptions, out.num_preemptions)
