"""Pydantic models of the OpenAI API subset inflight serves, plus vLLM's sampling extras.

Requests keep unknown fields for `request_fields` to judge. Known fields are checked strictly,
by JSON type (`"stream": "yes"` is not a boolean, `"n": "2"` not an integer; `2.0` is one, as
JSON Schema has it) and by range (the ranges of `SamplingParams`, so the OpenAPI document
states them), strings as valid Unicode; a failure becomes a 400 naming the field.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from inflight.sampling_params import (
    FLOAT32_TINY,
    MAX_CHOICES,
    MAX_GRAMMAR_CHARS,
    MAX_INT64,
    MAX_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MIN_REPETITION_PENALTY,
    MIN_SEED,
    unicode_problem,
)
from inflight.server import schema_rules as rules

MAX_N = 16  # choices per request over HTTP (the queue bound counts each)


def _valid_unicode(text: str) -> str:
    if (problem := unicode_problem(text)) is not None:
        raise ValueError(problem)
    return text


def _integral_float(value: Any) -> Any:
    """JSON has one number type: `2.0` is the integer 2 (so JSON Schema's `integer` says)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Text = Annotated[str, AfterValidator(_valid_unicode)]
# a request's integer fields (the validator outermost, or pydantic drops the bounds from the
# document)
Int = Annotated[int, BeforeValidator(_integral_float)]
OptionalInt = Annotated[int | None, BeforeValidator(_integral_float)]
MAX_SLO_S = 86_400.0  # a latency target longer than a day is a mistake
TokenId = Annotated[int, Field(ge=0, le=MAX_INT64), BeforeValidator(_integral_float)]
StopText = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]
STRICT = ConfigDict(extra="allow", strict=True)


def omitted(**kwargs: Any) -> Any:
    """A response field left out when None: OpenAI's spec has it optional, not nullable."""
    return Field(default=None, exclude_if=lambda value: value is None, **kwargs)


# token id -> bias; an id as decimal digits below 2**63 (`outside_vocabulary` past the vocabulary)
LogitBias = Annotated[
    dict[Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,17})$")],
         Annotated[float, Field(ge=-100, le=100)]],
    Field(json_schema_extra={"additionalProperties": False}),
]  # fmt: skip


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


GrammarText = Annotated[Text, Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)]
# plain `str`: its pattern admits ASCII only, and a validator inside would drop the pattern from
# the OpenAPI document
FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    name: Annotated[Text, Field(max_length=64)] = "response"
    description: Text | None = None
    # `schema` is a BaseModel attribute, hence the alias
    schema_: dict[str, Any] = Field(alias="schema", default_factory=dict)
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: free text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(**STRICT, json_schema_extra=rules.needs_when(
        "type", ["text", "json_object"], "json_schema"
    ))  # fmt: skip
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs`: exactly one constraint."""

    model_config = STRICT
    json_: dict[str, Any] | GrammarText | None = Field(alias="json", default=None)
    json_object: bool | None = None
    regex: GrammarText | None = None
    choice: Annotated[list[Text], Field(min_length=1, max_length=MAX_CHOICES)] | None = None
    grammar: GrammarText | None = None


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = STRICT

    model: Text | None = None
    n: Int = Field(default=1, ge=1, le=MAX_N)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, ge=FLOAT32_TINY, le=1, allow_inf_nan=False)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: OptionalInt = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    logit_bias: LogitBias | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    # vLLM-style extras
    top_k: OptionalInt = Field(default=None, ge=-1, le=MAX_INT64)
    min_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    repetition_penalty: float | None = Field(
        default=None, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, allow_inf_nan=False
    )
    ignore_eos: bool = False
    min_tokens: Int = Field(default=0, ge=0, le=MAX_INT64)
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # the prompt tokens' logprobs, with this many alternatives each (vLLM's shape in the answer)
    prompt_logprobs: OptionalInt = Field(default=None, ge=0, le=MAX_LOGPROBS)
    priority: Int = Field(default=0, ge=-MAX_INT64 - 1, le=MAX_INT64)
    cache_salt: Text | None = None  # requests with different salts never share cached KV
    # latency targets in seconds (the server's --slo-ttft / --slo-tpot where absent)
    slo_ttft: float | None = Field(default=None, gt=0, le=MAX_SLO_S, allow_inf_nan=False)
    slo_tpot: float | None = Field(default=None, gt=0, le=MAX_SLO_S, allow_inf_nan=False)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None


NonEmpty = Field(min_length=1)
PromptText = Annotated[Text, NonEmpty]
PromptIds = Annotated[list[TokenId], NonEmpty]


class CompletionRequest(SamplingFields):
    prompt: (
        PromptText
        | Annotated[list[PromptText], NonEmpty]
        | PromptIds
        | Annotated[list[PromptIds], NonEmpty]
    )
    max_tokens: OptionalInt = Field(default=16, ge=1, le=MAX_INT64)
    echo: bool = False
    logprobs: OptionalInt = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: OptionalInt = Field(default=None, ge=1, le=MAX_N)  # only best_of == n is served


class ChatContentPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    model_config = STRICT
    name: Text
    arguments: Text  # a JSON object's text, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = STRICT
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[ChatContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: Text | None = None  # what a tool message answers
    name: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(BaseModel):
    model_config = STRICT
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(**STRICT, json_schema_extra={"allOf": [
        rules.not_both("functions", "tools"), rules.not_both("function_call", "tool_choice"),
        rules.tools_for_tool_choice("tools", "functions",
                                    choices=("tool_choice", "function_call")),
        rules.only_with("top_logprobs", "logprobs", True),
    ]})  # fmt: skip
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    max_tokens: OptionalInt = Field(default=None, ge=1, le=MAX_INT64)
    max_completion_tokens: OptionalInt = Field(default=None, ge=1, le=MAX_INT64)
    logprobs: bool = False
    top_logprobs: OptionalInt = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # variables of the model's chat template (Qwen3's enable_thinking), as vLLM takes them
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's legacy function calling, mapped onto tools and tool_choice
    functions: Annotated[list[FunctionDefinition], Field(max_length=128)] | None = None
    function_call: Literal["none", "auto"] | NamedFunction | None = None

    @model_validator(mode="after")
    def _functions_as_tools(self) -> ChatCompletionRequest:
        if self.functions is not None:
            if self.tools is not None:
                raise ValueError("functions (legacy) and tools cannot both be set")
            self.tools = [Tool(type="function", function=f) for f in self.functions]
        if self.function_call is not None:
            if self.tool_choice is not None:
                raise ValueError("function_call (legacy) and tool_choice cannot both be set")
            call = self.function_call
            self.tool_choice = (
                call if isinstance(call, str) else NamedToolChoice(type="function", function=call)
            )
        return self


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # served from the prefix cache, not computed


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # in think blocks (`reasoning_content`)


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    completion_tokens_details: CompletionTokensDetails | None = omitted()  # chat's


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    logprob: float
    rank: int
    decoded_token: str


# vLLM's: per prompt token, null for the first, else {token id: its entry} for the token itself
# and the top alternatives asked for
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = omitted()


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = omitted()


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None  # this server never refuses


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None  # this server never refuses
    # the model's thinking (`server/reasoning.py`), as vLLM returns it; absent for other models
    reasoning_content: str | None = omitted()
    tool_calls: list[ToolCall] | None = omitted()


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = omitted()


class DeltaFunctionCall(BaseModel):
    name: str | None = omitted()
    arguments: str | None = omitted()


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = omitted()
    type: Literal["function"] | None = omitted()
    function: DeltaFunctionCall


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = omitted()
    content: str | None = omitted()
    reasoning_content: str | None = omitted()
    tool_calls: list[DeltaToolCall] | None = omitted()


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = omitted()
    prompt_logprobs: PromptLogprobs | None = omitted()  # on the first chunk, where asked for


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "inflight"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(**STRICT, json_schema_extra={"anyOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
    ]})  # fmt: skip
    model: Text | None = None
    prompt: PromptText | None = None
    messages: Annotated[list[ChatMessage], NonEmpty] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    model: Text | None = None
    tokens: list[TokenId]


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    """OpenAI's error object: `type` by kind (`invalid_request_error`, `requests` for rate
    limits, `server_error`), `code` a word to branch on or null."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def error_body(message: str, type_: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:  # fmt: skip
    return ErrorResponse(
        error=ErrorInfo(message=message, type=type_, param=param, code=code)
    ).model_dump()
