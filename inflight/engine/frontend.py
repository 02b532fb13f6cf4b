"""FrontEnd: what the offline `LLM` and the asyncio `AsyncLLM` both stand on, side by side.

An engine core (scheduler, KV cache, model runner), the model's tokenizer, the input processor
(validation, tokenizing, one request per `n`) and the output processor (detokenizing, stop
strings, fan-in of `n`). A front end adds only how the step loop is driven: in the caller's
thread (`LLM`) or on a thread of its own behind asyncio queues (`AsyncLLM`). What a server
reads of an engine is here too, as public properties.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from inflight.config import EngineConfig
from inflight.engine.engine_core import EngineCore
from inflight.engine.processor import InputProcessor, OutputProcessor
from inflight.errors import InvalidRequestError
from inflight.model.generation_config import (
    SamplingDefaults,
    read_end_tokens,
    read_sampling_defaults,
)
from inflight.model.loader import LoadedModel
from inflight.sampling_params import SamplingParams, check_text
from inflight.tokenizer import load_tokenizer

Message = dict[str, Any]

logger = logging.getLogger(__name__)


# what the renderer itself passes a chat template: not for `template_kwargs` to replace
RESERVED_TEMPLATE_KWARGS = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})  # fmt: skip


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text of a conversation; `tools` (OpenAI's shape) go to templates that
    render them; `template_kwargs` are variables of the template's own (Qwen3's
    `enable_thinking`)."""
    if not tokenizer.chat_template:
        raise InvalidRequestError(
            "this model has no chat template: give the engine one (`--chat-template`, "
            "`chat_template=`: a Jinja template's file or text), or send a plain prompt",
            param="messages",
        )
    template_kwargs = dict(template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(template_kwargs))
    if reserved:
        raise InvalidRequestError(f"chat_template_kwargs cannot set {', '.join(reserved)}",
                                  param="chat_template_kwargs")  # fmt: skip
    for i, message in enumerate(messages):
        for key, value in message.items():
            if isinstance(value, str):
                check_text(value, f"messages.{i}.{key}")
    _check_texts(template_kwargs, "chat_template_kwargs")
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
    except Exception as e:  # jinja errors for malformed messages
        raise InvalidRequestError(
            f"cannot render the chat template: {e}", "messages", "chat_template_error"
        ) from e


def _check_texts(value: Any, param: str) -> None:
    """Every string in a JSON value (keys too) is valid Unicode: a template renders them into
    the prompt text, which the tokenizer must take."""
    if isinstance(value, str):
        check_text(value, param)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_texts(key, param)
            _check_texts(item, f"{param}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_texts(item, f"{param}.{i}")


class FrontEnd:
    def __init__(
        self, model: str | None = None, *, loaded_model: LoadedModel | None = None, **knobs: Any
    ) -> None:
        """`loaded_model` reuses weights already in memory (another engine's `core.loaded`)."""
        config = EngineConfig.from_knobs(model=model, **knobs)
        self.core = EngineCore(config, loaded_model)
        self.config = self.core.config
        self.tokenizer = load_tokenizer(self.core.loaded.path, config.model.chat_template)
        eos = {*self.core.arch.eos_token_ids, *read_end_tokens(self.core.loaded.path)}
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        vocab = self.core.arch.vocab_size
        if outside := sorted(i for i in eos if not 0 <= i < vocab):  # a broken file's
            logger.warning("end tokens outside the vocabulary [0, %d) ignored: %s", vocab, outside)
            eos -= set(outside)
        self.input_processor = InputProcessor(
            self.tokenizer,
            self.core.max_model_len,
            self.core.arch.vocab_size,
            frozenset(eos),
            self.core.arch.pooling,
            config.scheduler.default_slo,
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self.sampling_defaults = (
            read_sampling_defaults(self.core.loaded.path)
            if config.model.generation_config == "auto" else SamplingDefaults()
        )  # fmt: skip

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams of the model's recommended settings (`sampling_defaults`), what a
        `generate` call without any uses."""
        return self.sampling_defaults.sampling_params()

    @property
    def model_path(self) -> Path:
        return self.core.loaded.path

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.arch.vocab_size

    @property
    def embedding_size(self) -> int | None:
        return None if self.core.arch.pooling is None else self.core.arch.hidden_size

    @property
    def shorter_embeddings(self) -> bool:
        return self.core.arch.matryoshka

    @property
    def num_kv_blocks(self) -> int:
        return self.core.kv_cache_manager.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self.config.cache.kv_block_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.input_processor.eos_token_ids

    def render_chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return render_chat(self.tokenizer, messages, tools, template_kwargs)
