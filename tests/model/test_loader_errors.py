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


def test_a_truncated_gguf_names_the_tensor_that_runs_past_its_end(tmp_path, tiny_llama):
    from gguf import GGMLQuantizationType

    from tests.gguf_files import write_tiny_gguf

    whole = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", GGMLQuantizationType.Q4_1)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-100])
    want = r"cut\.gguf: tensor '[\w.]+' \(.*\) runs past the end of the file: its \d+ bytes at"
    with pytest.raises(ModelLoadError, match=want + r" offset \d+, the file has \d+"):
        load(cut)


def test_tensor_headers_are_checked_against_their_blocks_and_the_file():
    from inflight.model.gguf_loader import check_tensor

    check_tensor("w", 2, [64, 8], 0, 8 * 2 * 18)  # Q4_0: 2 blocks of 18 bytes per row
    with pytest.raises(ModelLoadError, match=r"'w': rows of 40 values do not divide into Q4_0"):
        check_tensor("w", 2, [40, 8], 0, 10**6)
    with pytest.raises(ModelLoadError, match=r"'w' has unknown type 99"):
        check_tensor("w", 99, [64, 8], 0, 10**6)
    with pytest.raises(ModelLoadError, match=r"'w' has shape \[64, 0\]"):
        check_tensor("w", 2, [64, 0], 0, 10**6)
    with pytest.raises(ModelLoadError, match="runs past the end"):  # sizes past 2**64 too
        check_tensor("w", 2, [64, 2**62], 0, 10**6)


def test_block_tensors_that_do_not_make_the_configs_weight_are_named(tmp_path, tiny_llama):
    import torch
    from gguf import GGMLQuantizationType

    from inflight.attention import make_backend
    from inflight.model.gguf_loader import read_gguf_index
    from inflight.model.llama import LlamaModel
    from inflight.model.loader import drop_block_weights, gguf_entries
    from tests.gguf_files import write_tiny_gguf

    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", GGMLQuantizationType.Q4_1)
    index = read_gguf_index(path)
    entry = next(e for e in index.entries if e["name"] == "blk.1.attn_k.weight")
    entry["shape"] = [entry["shape"][0], entry["shape"][1] * 2]  # twice the config's K rows
    with torch.device("meta"):
        model = LlamaModel(index.arch, make_backend("torch", 16, torch.device("cpu")))
    with pytest.raises(ModelLoadError, match=r"tensors .*'blk\.1\.attn_k\.weight'.* do not "
                       r"make the \[\d+, 64\] weight of layers\.1\.qkv_proj"):  # fmt: skip
        drop_block_weights(model, gguf_entries(index), [GGMLQuantizationType.Q4_1], path)


def test_a_model_that_will_not_fit_is_refused_before_loading(tiny_llama, monkeypatch):
    from inflight.engine import engine_core
    from inflight.model import loader

    monkeypatch.setattr(engine_core, "load_model", lambda *a, **k: pytest.fail("loaded"))
    monkeypatch.setattr(loader, "available_memory_bytes", lambda: 3 * 2**30)
    # 2 layers x K and V x 2 heads x 16 x 4 bytes = 512 bytes a token: 4 GiB in 2**19 blocks
    want = r"\w+ needs about 0\.00 GiB for its weights, 4\.00 GiB for the KV pool, and "
    with pytest.raises(ModelLoadError, match=want + r"3\.00 GiB of memory is available"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=2**19, kv_block_size=16)


@pytest.mark.parametrize("swap", [2**32, 2**63])
def test_a_swap_space_that_will_not_fit_is_refused_before_loading(tiny_llama, monkeypatch, swap):
    """The swap space is host memory (where preemption swaps): one past what is available is
    refused with the numbers, naming its knob, not a failed allocation after loading."""
    from inflight.engine import engine_core
    from inflight.model import loader

    monkeypatch.setattr(engine_core, "load_model", lambda *a, **k: pytest.fail("loaded"))
    monkeypatch.setattr(loader, "available_memory_bytes", lambda: 3 * 2**30)
    want = rf"{swap / 2**30:.2f} GiB for the swap space, .* swap_space_bytes"
    with pytest.raises(ModelLoadError, match=want):
        LLM(str(tiny_llama), dtype="float32", preemption_mode="swap", swap_space_bytes=swap)
    monkeypatch.undo()  # (recompute preemption holds no swap space, whatever its size)
    LLM(str(tiny_llama), dtype="float32", swap_space_bytes=swap, num_kv_blocks=64)
