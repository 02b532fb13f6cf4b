"""Grammars: StructuredOutputs -> a compiled xgrammar grammar, validated, cached by its text.

JSON is compiled without free whitespace (`{"a":1}`, not `{ "a" : 1 }`): a sampling model may
otherwise emit whitespace until `max_tokens`, and compact JSON parses the same. Schemas are
checked against their metaschema first (jsonschema), so a schema with a wrong keyword value is
refused with that library's message rather than compiled into something else.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema

from inflight.errors import InvalidRequestError
from inflight.sampling_params import StructuredOutputs, unicode_problem

if TYPE_CHECKING:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerBase

# Any JSON object: OpenAI's `json_object` mode.
JSON_OBJECT_SCHEMA = {"type": "object"}
# Compiled grammars kept, least recently used dropped first (one is ~0.1-10 MB).
CACHE_SIZE = 128
# Dicts and lists within dicts and lists: far beyond any real schema, well within the stack.
MAX_SCHEMA_DEPTH = 64
# A schema's text (a request body may hold megabytes): compiling is bounded by it.
MAX_SCHEMA_CHARS = 256 * 1024


@dataclass
class CompileStats:
    """Compile times, cold (first time a text is seen) and cached, for benchmarks."""

    cold: int = 0
    cold_seconds: float = 0.0
    cached: int = 0
    cached_seconds: float = 0.0


def choice_grammar(options: list[str]) -> str:
    """EBNF for exactly one of `options` (JSON string literals are valid EBNF literals)."""
    return "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)


class Grammars:
    """Compiles constraints for one tokenizer; thread-safe (the tokenizer thread compiles)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: list[int]
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._cache: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = CompileStats()

    def _get_compiler(self) -> xgr.GrammarCompiler:
        """Built on first use: importing xgrammar and reading the vocabulary take time that a
        server without constrained requests never needs to pay."""
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_token_ids
            )
            # one thread: compiling runs beside the forward pass on a machine of few cores;
            # no cache of its own (unbounded by default): ours is bounded
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def compile(self, spec: StructuredOutputs) -> xgr.CompiledGrammar:
        """Raises InvalidRequestError naming `spec.param` when the constraint does not compile.
        Compiled grammars are cached by their text: a repeated one costs a lookup."""
        key = (spec.kind, self._text(spec))
        with self._lock:
            start = time.perf_counter()
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                self.stats.cached += 1
                self.stats.cached_seconds += time.perf_counter() - start
                return grammar
            grammar = self._compile(spec, *key)
            self._cache[key] = grammar
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            self.stats.cold += 1
            self.stats.cold_seconds += time.perf_counter() - start
        return grammar

    def _compile(self, spec: StructuredOutputs, kind: str, text: str) -> xgr.CompiledGrammar:
        compiler = self._get_compiler()
        try:
            if kind in ("json", "json_object"):
                return compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(text)
            return compiler.compile_grammar(text)
        except RuntimeError as e:
            raise _invalid(
                f"{spec.param}: the {kind} does not compile: {_reason(e)}", spec.param
            ) from None

    @staticmethod
    def _text(spec: StructuredOutputs) -> str:
        if spec.kind == "json_object":
            return json.dumps(JSON_OBJECT_SCHEMA)
        if spec.kind == "json":
            return _schema_text(spec.json, spec.param)  # type: ignore[arg-type]
        if spec.kind == "choice":
            return choice_grammar(spec.choice)  # type: ignore[arg-type]
        return spec.regex if spec.kind == "regex" else spec.grammar  # type: ignore[return-value]


def _invalid(message: str, param: str) -> InvalidRequestError:
    """A constraint that cannot be compiled: a rule the OpenAPI document can state only in
    words, hence a code of its own."""
    return InvalidRequestError(message, param, "invalid_grammar")


def _schema_text(schema: dict | str, param: str) -> str:
    """A schema's canonical text (dict key order kept: it is the order properties are written)."""
    parsed: Any = schema
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except (ValueError, RecursionError) as e:
            message = f"{param}: the schema is not valid JSON: {e}"
            raise _invalid(message, param) from None
    check_json_schema(parsed, param)
    return json.dumps(_length_bounds_as_patterns(parsed), ensure_ascii=False)


def check_json_schema(schema: Any, param: str) -> None:
    """A JSON schema object no deeper than `MAX_SCHEMA_DEPTH` nor longer than `MAX_SCHEMA_CHARS`
    as text, valid Unicode (JSON may carry lone surrogates, which no encoder accepts), valid
    against its metaschema; cheapest checks first."""
    if not isinstance(schema, dict):
        raise _invalid(f"{param}: a JSON schema must be an object", param)
    # Checked without recursion first: the checks below recurse and would overflow the stack.
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise _invalid(
                f"{param}: the schema nests deeper than {MAX_SCHEMA_DEPTH} levels", param
            )
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    text = json.dumps(schema, ensure_ascii=False)
    if len(text) > MAX_SCHEMA_CHARS:
        raise _invalid(
            f"{param}: the schema has {len(text)} characters, more than {MAX_SCHEMA_CHARS}", param
        )
    if (problem := unicode_problem(text)) is not None:
        raise _invalid(f"{param}: the schema is {problem}", param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.path) or "the top level"
        raise _invalid(f"{param}: not a valid JSON schema at {where}: {e.message}", param) from None


def _length_bounds_as_patterns(schema: Any) -> Any:
    """A copy with every `{"type": "string", "minLength"/"maxLength"}` (no pattern) written as
    the `pattern` `^.{min,max}$`, which means the same. NOTE: xgrammar (0.2.8) compiles length
    bounds to a character class that admits raw control characters, which no JSON parser
    accepts (mlc-ai/xgrammar#800); its pattern path counts the same characters and excludes them.
    """
    if isinstance(schema, list):
        return [_length_bounds_as_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _length_bounds_as_patterns(value) for key, value in schema.items()}
    lo, hi = out.get("minLength"), out.get("maxLength")
    bounded = isinstance(lo, int) or isinstance(hi, int)
    if out.get("type") == "string" and bounded and "pattern" not in out:
        lo = lo if isinstance(lo, int) else 0
        out["pattern"] = f"^.{{{lo},{hi if isinstance(hi, int) else ''}}}$"
        out.pop("minLength", None)
        out.pop("maxLength", None)
    return out


def _reason(error: RuntimeError) -> str:
    """xgrammar's message without its C++ source location prefix."""
    text = str(error).strip()
    if "] " in text and text.startswith("["):
        text = text.split("] ", 1)[1]
    if ".cc:" in text.split(" ", 1)[0]:
        text = text.split(" ", 1)[1] if " " in text else text
    return text.splitlines()[0]
