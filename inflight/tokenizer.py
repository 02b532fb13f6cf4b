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

import hashlib
import logging
import os
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from inflight.errors import ModelLoadError

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("INFLIGHT_CACHE", Path.home() / ".cache" / "inflight"))


def file_cache_key(path: Path) -> str:
    """A key that changes when the file is replaced: its path, size and modification time."""
    stat = path.stat()
    raw = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    try:
        if path.is_dir():
            return AutoTokenizer.from_pretrained(path)
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
