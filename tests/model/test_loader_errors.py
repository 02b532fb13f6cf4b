"""Broken model folders and files fail with one ModelLoadError naming the file and the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inflight import LLM, ModelLoadError


@pytest.fixture
def model_copy(tmp_path, tiny_llama) -> Path:
    return Path(shutil.copytree(tiny_llama, tmp_path / "model"))


def load(path: Path) -> None:
    LLM(str(path), dtype="float32", num_kv_blocks=64)


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match=r"nope: no such model folder or GGUF file"):
        load(tmp_path / "nope")


def test_missing_config(model_copy):
    (model_copy / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json: missing"):
        load(model_copy)


def test_unsupported_architecture(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"config\.json: unsupported architecture.*GPT2"):
        load(model_copy)


def test_config_not_json(model_copy):
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json: not valid JSON"):
        load(model_copy)


def test_no_weights(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weight files"):
        load(model_copy)


def test_shard_listed_in_index_is_missing(model_copy):
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002\.safetensors: missing"):
        load(model_copy)


def test_corrupt_safetensors(model_copy):
    (model_copy / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: corrupt or unreadable"):
        load(model_copy)


def test_weights_that_do_not_match_the_config(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["hidden_size"] = 32
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"weights do not match config.*shape"):
        load(model_copy)


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(ModelLoadError, match=r"bad\.gguf: not a valid GGUF file"):
        load(bad)
