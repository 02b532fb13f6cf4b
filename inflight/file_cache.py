"""Where inflight caches what it derives from model files (converted tokenizers, GGUF headers,
peers' builds), keyed so that a replaced file is never served from a stale entry. Light on
imports: tensor-parallel ranks read it and load no tokenizer."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("INFLIGHT_CACHE", Path.home() / ".cache" / "inflight"))


def file_cache_key(path: Path) -> str:
    """A key that changes when the file is replaced: its path, size and modification time."""
    stat = path.stat()
    raw = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
