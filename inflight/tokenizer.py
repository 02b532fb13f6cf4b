"""Tokenizer and chat template from a model folder or from GGUF metadata.

Building a tokenizer from GGUF metadata takes seconds (transformers converts the BPE merges), so
the converted tokenizer is cached under `$INFLIGHT_CACHE` (default `~/.cache/inflight`), keyed
by the file's path, size and modification time. It is built as transformers' generic fast
tokenizer over the converted vocabulary: `AutoTokenizer` builds the same one and then a
family's class around it, which for a large vocabulary (Gemma 3's 262k pieces) takes several
times as long (docs/benchmarks.md, "Figures behind design decisions"; the same ids and text on
the parity prompts: `tests/test_tokenizer.py`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

from transformers import (
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from inflight.errors import ModelLoadError
from inflight.file_cache import cache_dir, file_cache_key

logger = logging.getLogger(__name__)


def load_tokenizer(path: Path, chat_template: str | None = None) -> PreTrainedTokenizerBase:
    """The model's tokenizer; with `chat_template` (a template's text, as the knob's config
    holds it), that template in place of its own."""
    tokenizer = _load_tokenizer(path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def _load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    try:
        if path.is_dir():
            return AutoTokenizer.from_pretrained(path, **_config_for_tokenizer(path))
        cached = cache_dir() / "tokenizers" / file_cache_key(path)
        if (cached / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(cached)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path.parent, gguf_file=path.name)
        try:
            tokenizer.save_pretrained(cached)
        except OSError as e:  # a read-only home only costs the conversion next time
            logger.warning("could not cache the GGUF tokenizer at %s: %s", cached, e)
        return tokenizer
    except ModelLoadError:
        raise
    except Exception as e:  # transformers raises many kinds for a broken tokenizer
        raise ModelLoadError(f"{path}: cannot load the tokenizer ({type(e).__name__}: {e})") from e


def _config_for_tokenizer(folder: Path) -> dict[str, PreTrainedConfig]:
    """`config=`, for `AutoTokenizer`, where the folder's tokenizer_config.json names its class:
    the folder's config.json read as transformers' base config, whose `model_type` and name are
    all `AutoTokenizer` reads of a config then. Without it, `AutoTokenizer` loads the family's
    config class, and importing any of them imports torch.distributed's tensors and sympy:
    1.5 s of every server's start on a model folder. Empty (`AutoTokenizer` as it is)
    otherwise."""
    try:
        named = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
        fields = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, AttributeError):
        return {}
    if not named or not isinstance(fields, dict) or not fields.get("model_type"):
        return {}
    try:
        config = PreTrainedConfig.from_dict(fields)
    except Exception:  # a field the base config refuses: the family's class may take it
        return {}
    config._name_or_path = str(folder)
    return {"config": config}


@functools.cache
def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's): each byte is a printable character, itself where it
    is printable (`!`-`~`, `¡`-`¬`, `®`-`ÿ`), else 256 + its rank among the others."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> Callable[[int], bytes]:
    """The bytes each token id stands for, a token holding part of a UTF-8 character included
    (its decoded text would be U+FFFD): logprobs' `bytes`, from which a client joins the text.
    Byte-level BPE vocabularies spell bytes in their own alphabet; SentencePiece ones with byte
    fallback hold `<0xNN>` tokens and `▁` for a space."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = (json.loads(backend.to_str()).get("decoder") or {}) if backend is not None else {}
    kinds = {d.get("type") for d in decoder.get("decoders", [decoder])}
    special = set(tokenizer.all_special_ids)

    @functools.lru_cache(maxsize=1 << 16)
    def of(token_id: int) -> bytes:
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if token_id in special or not isinstance(piece, str):
            return tokenizer.decode([token_id]).encode()
        if "ByteLevel" in kinds:
            chars = _byte_level_chars()
            return b"".join(bytes([chars[c]]) if c in chars else c.encode() for c in piece)
        if "ByteFallback" in kinds and (match := _BYTE_TOKEN.fullmatch(piece)):
            return bytes([int(match.group(1), 16)])
        if "Replace" in kinds or "Metaspace" in kinds:
            return piece.replace("\u2581", " ").encode()
        return tokenizer.decode([token_id]).encode()

    return of
