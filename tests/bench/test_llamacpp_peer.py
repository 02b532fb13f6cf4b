"""The llama.cpp peer's plumbing, without llama.cpp: the GGUF rewrite and the runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType

from inflight.bench.llamacpp_peer import convert_gguf, run_llamacpp
from inflight.model.gguf_header import read_gguf_header
from inflight.model.gguf_loader import gguf_arch_config, iter_gguf_weights
from inflight.workload.requests import WorkloadRequest
from tests.model.test_gguf import write_tiny_gguf


def _weights(path: Path) -> dict[str, torch.Tensor]:
    reader = GGUFReader(path)
    return dict(iter_gguf_weights(reader, gguf_arch_config(read_gguf_header(path), path), path))


@pytest.mark.parametrize(("dtype", "torch_dtype"), [("float32", torch.float32),
                                                    ("bfloat16", torch.bfloat16)])  # fmt: skip
def test_rewritten_gguf_holds_the_same_weights_in_the_new_type(
    tmp_path, tiny_llama, dtype, torch_dtype
):
    """A Q4_1 file rewritten as float32 is exact; as bf16 it equals inflight's own bf16 rounding
    of the Q4_1 weights; metadata (architecture, tokenizer) survives; 1-D norms stay float32."""
    q4 = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q4_1.gguf", GGMLQuantizationType.Q4_1)
    out = convert_gguf(q4, dtype, tmp_path / f"tiny-{dtype}.gguf")
    original, rewritten = _weights(q4), _weights(out)
    assert rewritten.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(rewritten[name].to(torch_dtype), tensor.to(torch_dtype)), name
    reader, source = GGUFReader(out), GGUFReader(q4)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == {"float32": "F32", "bfloat16": "BF16"}[dtype]
    assert types["blk.0.attn_norm.weight"] == "F32"
    for key in ("general.architecture", "tokenizer.ggml.tokens", "llama.block_count"):
        assert reader.fields[key].contents() == source.fields[key].contents()
    file_type = {"float32": LlamaFileType.ALL_F32, "bfloat16": LlamaFileType.MOSTLY_BF16}[dtype]
    assert source.fields["general.file_type"].contents() == LlamaFileType.MOSTLY_Q4_1
    assert reader.fields["general.file_type"].contents() == file_type
    assert convert_gguf(q4, dtype, out) == out  # cached: not rewritten


FAKE_LLAMA_CPP = '''
class Llama:
    """Echoes 5 forever after the prompt, as greedy `generate` never stopping at EOS."""

    def __init__(self, model_path, n_threads, **kwargs):
        assert model_path.endswith(".gguf") and n_threads >= 1

    def generate(self, tokens, top_k, temp, reset):
        assert top_k == 1 and temp == 0.0 and reset
        while True:
            yield 5
'''


def test_runner_serves_requests_one_after_another(tmp_path, tiny_llama, monkeypatch):
    """Against a stand-in `llama_cpp` package: every request gets exactly `max_tokens`, in
    workload order, and request i starts only after request i-1 finished (single stream)."""
    stub = tmp_path / "stub"
    (stub / "llama_cpp").mkdir(parents=True)
    (stub / "llama_cpp" / "__init__.py").write_text(FAKE_LLAMA_CPP)
    monkeypatch.setenv("PYTHONPATH", str(stub))
    q4 = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q4_1.gguf", GGMLQuantizationType.Q4_1)
    workload = [WorkloadRequest([1, 2, 3], 4), WorkloadRequest([5], 1), WorkloadRequest([9], 3)]
    result = run_llamacpp(Path(sys.executable), q4, workload, "bfloat16", as_shipped=True)
    assert result.name == "llamacpp-q4_1"
    assert [(r.prompt_tokens, r.output_tokens) for r in result.requests] == [(3, 4), (1, 1), (1, 3)]
    for before, after in zip(result.requests, result.requests[1:], strict=False):
        assert 0 <= before.ttft <= before.e2e <= after.ttft <= after.e2e <= result.wall_s


def test_peer_refuses_what_it_cannot_run(tmp_path, tiny_llama):
    staggered = [WorkloadRequest([1], 2, arrival_time=1.0)]
    with pytest.raises(ValueError, match="arrive at once"):
        run_llamacpp(Path(sys.executable), tmp_path / "m.gguf", staggered, "bfloat16", False)
    with pytest.raises(ValueError, match="needs a GGUF"):
        run_llamacpp(Path(sys.executable), tiny_llama, [WorkloadRequest([1], 2)], "bfloat16", False)
