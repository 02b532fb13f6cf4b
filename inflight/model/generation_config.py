"""The sampling settings a model's authors recommend, where its files say them: a folder's
`generation_config.json` (what vLLM's `--generation-config auto` reads) or a GGUF file's
`general.sampling.*` keys (what llama.cpp reads). They become the defaults of requests that leave
those fields unset, ahead of OpenAI's (temperature 1, top_p 1, no top-k); a request that sets a
field keeps its value. A value the engine would refuse from a request is logged and left out, so
a broken file cannot make every request fail."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.errors import InvalidRequestError
from inflight.model.gguf_loader import read_gguf_index
from inflight.model.loader import is_gguf
from inflight.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# SamplingParams' field <- its name in generation_config.json, and in a GGUF file
_HF_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "repetition_penalty": "repetition_penalty"}  # fmt: skip
_GGUF_KEYS = {"temperature": "general.sampling.temp", "top_p": "general.sampling.top_p",
              "top_k": "general.sampling.top_k", "min_p": "general.sampling.min_p",
              "repetition_penalty": "general.sampling.penalty_repeat"}  # fmt: skip


@dataclass(frozen=True)
class SamplingDefaults:
    """The model's recommended values; None where its files say nothing."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None

    def given(self) -> dict[str, Any]:
        """The fields the files set."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def sampling_params(self, **fields: Any) -> SamplingParams:
        """SamplingParams of `fields`: where one of the fields these defaults cover is left out
        or None, the model's value, or past that SamplingParams' own default."""
        unset = [f.name for f in dataclasses.fields(self) if fields.get(f.name) is None]
        given = self.given()
        for name in unset:
            fields.pop(name, None)
            if name in given:
                fields[name] = given[name]
        return SamplingParams(**fields)


def _folder_generation_config(path: Path) -> dict[str, Any]:
    """A model folder's `generation_config.json`; empty where it has none, or one that is not a
    JSON object (nothing recommended)."""
    try:
        saved = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def read_end_tokens(path: Path) -> tuple[int, ...]:
    """The tokens a folder's `generation_config.json` ends generations with (Llama 3 Instruct's
    `<|eot_id|>` beside the `<|end_of_text|>` of its config.json); none for a GGUF file, whose
    own end tokens its metadata names."""
    if is_gguf(path):
        return ()
    ids = _folder_generation_config(path).get("eos_token_id")
    ids = ids if isinstance(ids, list) else [ids]
    return tuple(i for i in ids if isinstance(i, int) and not isinstance(i, bool))


def read_sampling_defaults(path: Path) -> SamplingDefaults:
    """The model's recommended sampling settings: from a GGUF file's metadata (as its cached
    index holds them: no second parse of the header), or from the `generation_config.json` of a
    folder (none where it has no such file)."""
    if is_gguf(path):
        fields = read_gguf_index(path).sampling
        found = {name: fields[key] for name, key in _GGUF_KEYS.items() if key in fields}
        source = f"{path.name}'s general.sampling keys"
    else:
        saved = _folder_generation_config(path)
        found = {name: saved[key] for name, key in _HF_KEYS.items() if saved.get(key) is not None}
        source = str(path / "generation_config.json")
    kept = {}
    for name, value in found.items():
        try:
            SamplingParams(**{name: value})
        except InvalidRequestError as e:
            logger.warning("ignored %s's sampling default %s", source, e)
            continue
        kept[name] = value
    if kept:
        shown = ", ".join(f"{k}={v}" for k, v in kept.items())
        logger.info("sampling defaults from %s: %s (a request's own values win; "
                    "--generation-config none for OpenAI's)", source, shown)  # fmt: skip
    return SamplingDefaults(**kept)
