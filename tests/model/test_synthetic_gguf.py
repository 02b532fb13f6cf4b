"""`scripts/synthetic_gguf.py --like`: a file of another GGUF's architecture, metadata and
tensor shapes with random weights, made from that file or from its header alone (how a model's
shape reaches a machine its file cannot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFReader

from inflight import LLM, SamplingParams
from tests.gguf_files import write_tiny_gguf

SCRIPT = Path(__file__).parents[2] / "scripts" / "synthetic_gguf.py"


def synthesize(*args) -> None:
    subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], check=True,
                   capture_output=True)  # fmt: skip


def metadata(reader: GGUFReader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items()
            if not k.startswith(("GGUF.", "general."))}  # fmt: skip


def test_a_header_carries_a_files_shapes_to_a_file_of_random_weights(tmp_path, tiny_model_factory):
    original = write_tiny_gguf(tiny_model_factory("gemma3"), tmp_path / "g.gguf",
                               GGMLQuantizationType.Q8_0)  # fmt: skip
    header, made = tmp_path / "header.gguf", tmp_path / "made.gguf"
    synthesize("--like", original, "--header-only", "--out", header)
    synthesize("--like", header, "--type", "Q8_0", "--out", made)
    source, header_reader, copy = GGUFReader(original), GGUFReader(header), GGUFReader(made)
    assert len(header_reader.tensors) == 0 and header.stat().st_size < original.stat().st_size
    assert metadata(copy) == metadata(source)
    assert copy.fields["general.architecture"].contents() == "gemma3"
    shapes = {t.name: (t.shape.tolist(), t.tensor_type) for t in source.tensors}
    assert {t.name: (t.shape.tolist(), t.tensor_type) for t in copy.tensors} == shapes
    # its weights are others, and it serves as the original does
    assert any((a.data != b.data).any() for a, b in zip(source.tensors, copy.tensors, strict=True))
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    out = LLM(str(made), dtype="float32", num_kv_blocks=16).generate([[5, 6, 7]], params)
    assert len(out[0].outputs[0].token_ids) == 4


def test_a_shape_or_a_file_to_be_like_is_asked_for(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.gguf")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and "name a shape or --like FILE" in run.stderr
