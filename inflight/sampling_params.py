"""SamplingParams: how one request turns logits into tokens, and when it stops.

Validated on construction, so a bad value raises `InvalidRequestError` (naming the field) at the
API boundary and never reaches the core. Defaults follow vLLM (`max_tokens=16`, temperature 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from inflight.errors import InvalidRequestError

# Temperatures below this sample greedily (argmax) instead of dividing by ~0.
GREEDY_EPSILON = 1e-5
MAX_LOGPROBS = 20
MAX_TEMPERATURE = 100.0  # OpenAI allows 2; beyond 100 sampling is uniform anyway
# Seeds are what torch.Generator.manual_seed takes: int64 or uint64.
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
MAX_INT64 = 2**63 - 1
# choices of one request: each is a sequence of its own, all built when it is added (n = 2**31
# would hang the caller building them, then run out of memory)
MAX_N = 4096
# repetition_penalty divides logits: bounded away from 0 (a denormal makes them infinite).
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
# Stop conditions are checked on every new token: bounded, so one request cannot slow the
# detokenizer for everyone (OpenAI allows 4 stop strings).
MAX_STOP_STRINGS, MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS = 64, 1024, 1024
# The smallest normal float32: a smaller non-zero value becomes a denormal or 0 in the sampler.
FLOAT32_TINY = 1.1754943508222875e-38
# A grammar's text (schema, regex, EBNF, choices) is compiled before the request is queued:
# bounded, so compiling one cannot hold the tokenizer thread for long.
MAX_GRAMMAR_CHARS, MAX_CHOICES = 64 * 1024, 1024


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{param} {message}", param=param)


def _check_combination(ok: bool, param: str, message: str) -> None:
    """A rule between fields: the OpenAPI document can state it only in words."""
    if not ok:
        raise InvalidRequestError(f"{param} {message}", param, "invalid_combination")


def check_int(value: object, param: str, lo: int, hi: int) -> None:
    """An int (not a bool) in [lo, hi]."""
    _check(isinstance(value, int) and not isinstance(value, bool), param,
           f"must be an integer, got {type(value).__name__}")  # fmt: skip
    _check(lo <= value <= hi, param, f"must be in [{lo}, {hi}], got {value}")  # type: ignore[operator]


def checked_float(value: object, param: str, lo: float, hi: float, lo_open: bool = False) -> float:
    """A finite real number in [lo, hi] ((lo, hi] with `lo_open`). One that float32 holds only
    as a denormal is 0 where 0 is allowed (as float32 arithmetic would make it) and refused
    where the value must be positive: it would divide or compare as 0."""
    _check(isinstance(value, int | float) and not isinstance(value, bool), param,
           f"must be a number, got {type(value).__name__}")  # fmt: skip
    _check(math.isfinite(value), param, f"must be finite, got {value}")  # type: ignore[arg-type]
    above = value > lo if lo_open else value >= lo  # type: ignore[operator]
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    _check(above and value <= hi, param, f"must be in {interval}, got {value}")  # type: ignore[operator]
    if value == 0 or abs(value) >= FLOAT32_TINY:  # type: ignore[arg-type]
        return value  # type: ignore[return-value]
    _check(lo <= 0 and not lo_open, param,
           f"is too close to 0 ({value} is not a normal float32)")  # fmt: skip
    return 0.0


def unicode_problem(text: str) -> str | None:
    """Why `text` is not valid Unicode, or None (JSON can carry lone surrogates, which no
    encoder, tokenizer included, accepts)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"not valid Unicode (a lone surrogate at character {e.start})"
    return None


def check_text(value: object, param: str) -> None:
    """A string that is valid Unicode."""
    _check(isinstance(value, str), param, f"must be a string, got {type(value).__name__}")
    problem = unicode_problem(value)  # type: ignore[arg-type]
    _check(problem is None, param, f"is {problem}")


@dataclass(frozen=True)
class StructuredOutputs:
    """A constraint on the output, compiled to a grammar that masks each step's logits: exactly
    one of a JSON schema (`json`, a dict or its text), any JSON object (`json_object`), a
    `regex`, one of the strings in `choice`, or an EBNF (GBNF) `grammar`. `param` names the
    request field it came from, for error messages."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    param: str = field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object is True else []
        kinds = "json, json_object, regex, choice, grammar"
        _check_combination(len(given) == 1, self.param,
                           f"must set exactly one of {kinds}; got {given}")  # fmt: skip
        _check(isinstance(self.json_object, bool), self.param, "json_object must be a boolean")
        if self.json is not None:
            _check(isinstance(self.json, dict | str), self.param,
                   "json must be a JSON schema (an object, or its text)")  # fmt: skip
        for name in ("regex", "grammar"):
            if (value := getattr(self, name)) is not None:
                check_text(value, self.param)
                _check(0 < len(value) <= MAX_GRAMMAR_CHARS, self.param,
                       f"{name} must have 1 to {MAX_GRAMMAR_CHARS} characters")  # fmt: skip
        if self.choice is not None:
            _check(isinstance(self.choice, list) and 0 < len(self.choice) <= MAX_CHOICES,
                   self.param, f"choice must be a list of 1 to {MAX_CHOICES} strings")  # fmt: skip
            for option in self.choice:
                check_text(option, self.param)
            _check(sum(map(len, self.choice)) <= MAX_GRAMMAR_CHARS, self.param,
                   f"choice must have at most {MAX_GRAMMAR_CHARS} characters in all")  # fmt: skip

    @property
    def kind(self) -> str:
        for name in ("json", "regex", "choice", "grammar"):
            if getattr(self, name) is not None:
                return name
        return "json_object"


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # number of top alternatives besides the sampled token
    # the prompt tokens' logprobs too (from the second on), with this many top alternatives
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        """Checks every field's type and range, so nothing the sampler would choke on (an
        overflowing seed, a denormal divisor, NaN) gets past the API boundary."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        check_int(self.n, "n", 1, MAX_N)
        self.temperature = checked_float(self.temperature, "temperature", 0.0, MAX_TEMPERATURE)
        self.top_p = checked_float(self.top_p, "top_p", 0.0, 1.0, lo_open=True)
        check_int(self.top_k, "top_k", -1, MAX_INT64)
        if self.top_k == -1:
            self.top_k = 0
        self.min_p = checked_float(self.min_p, "min_p", 0.0, 1.0)
        self.presence_penalty = checked_float(self.presence_penalty, "presence_penalty", -2.0, 2.0)
        self.frequency_penalty = checked_float(self.frequency_penalty, "frequency_penalty",
                                               -2.0, 2.0)  # fmt: skip
        self.repetition_penalty = checked_float(
            self.repetition_penalty, "repetition_penalty",
            MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY,
        )  # fmt: skip
        check_int(self.max_tokens, "max_tokens", 1, MAX_INT64)
        check_int(self.min_tokens, "min_tokens", 0, MAX_INT64)
        _check_combination(self.min_tokens <= self.max_tokens, "min_tokens",
                           f"must not exceed max_tokens ({self.max_tokens}), got "
                           f"{self.min_tokens}")  # fmt: skip
        if self.logit_bias:  # a copy: the caller's dict is not rewritten
            biases = {}
            for token_id, bias in self.logit_bias.items():
                check_int(token_id, "logit_bias", 0, MAX_INT64)
                biases[token_id] = checked_float(bias, "logit_bias", -100.0, 100.0)
            self.logit_bias = biases
        if self.seed is not None:
            # children of an n > 1 request are seeded seed, seed + 1, ..., seed + n - 1
            check_int(self.seed, "seed", MIN_SEED, MAX_SEED)
            _check_combination(self.seed + self.n - 1 <= MAX_SEED, "seed",
                               f"+ n - 1 must be at most {MAX_SEED}, got {self.seed}")  # fmt: skip
        _check(len(self.stop) <= MAX_STOP_STRINGS, "stop",
               f"must hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")  # fmt: skip
        for stop in self.stop:
            check_text(stop, "stop")
            _check(bool(stop), "stop", "must not contain empty strings")
            _check(len(stop) <= MAX_STOP_STRING_CHARS, "stop",
                   f"strings must be at most {MAX_STOP_STRING_CHARS} characters")  # fmt: skip
        num_ids = len(self.stop_token_ids)
        _check(num_ids <= MAX_STOP_TOKEN_IDS, "stop_token_ids",
               f"must hold at most {MAX_STOP_TOKEN_IDS} ids, got {num_ids}")  # fmt: skip
        for token_id in self.stop_token_ids:
            check_int(token_id, "stop_token_ids", 0, MAX_INT64)
        if self.logprobs is not None:
            check_int(self.logprobs, "logprobs", 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            check_int(self.prompt_logprobs, "prompt_logprobs", 0, MAX_LOGPROBS)
        if self.structured_outputs is not None:
            _check(isinstance(self.structured_outputs, StructuredOutputs), "structured_outputs",
                   "must be a StructuredOutputs")  # fmt: skip
            # min_tokens bans EOS, and a complete grammar allows only EOS: no token would be left
            _check(self.min_tokens == 0, "min_tokens", "cannot be combined with structured outputs")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            _check(isinstance(getattr(self, name), bool), name, "must be a boolean")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1.0
        )
