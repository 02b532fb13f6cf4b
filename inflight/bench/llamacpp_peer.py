"""llama.cpp as a peer, single stream: `llama-cpp-python` in its own virtual environment
(`--llamacpp-python`), never our dependency.

Two peers: `llamacpp` runs the same weights in the same dtype as inflight (the GGUF's tensors
dequantized and rewritten as a bf16/f16/f32 GGUF, cached), `llamacpp-gguf` runs the GGUF file as
shipped (for the default model, Q4_1: llama.cpp's home ground, a quarter of the bytes per step).
Threads: one per core, for prompts and decodes alike.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from inflight.bench.external_peer import run_runner
from inflight.file_cache import cache_dir
from inflight.model.loader import is_gguf
from inflight.workload.requests import WorkloadRequest, require_simultaneous
from inflight.workload.results import RunResult

logger = logging.getLogger("inflight.bench")

_FLOAT_TYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_FILE_TYPES = {"bfloat16": "MOSTLY_BF16", "float16": "MOSTLY_F16", "float32": "ALL_F32"}


def convert_gguf(path: Path, dtype: str, out: Path | None = None) -> Path:
    """`path` with every quantized or differently typed matrix rewritten in `dtype` (1-D tensors,
    the norms, stay float32 as llama.cpp expects); metadata and tokenizer copied. Cached."""
    import gguf

    target = gguf.GGMLQuantizationType[_FLOAT_TYPES[dtype]]
    out = out or cache_dir() / "gguf-export" / f"{path.stem}-{dtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by the writer itself
        vtype = field.types[0]
        value = field.contents()
        if name == "general.file_type":
            value = int(gguf.LlamaFileType[_FILE_TYPES[dtype]])
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        qtype = gguf.GGMLQuantizationType.F32 if values.ndim == 1 else target
        writer.add_tensor(tensor.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(out)
    logger.info("rewrote %s as %s for llama.cpp", path.name, out)
    return out


def run_llamacpp(
    python: Path, model_path: Path, workload: list[WorkloadRequest], dtype: str, as_shipped: bool
) -> RunResult:
    require_simultaneous(workload, "the llama.cpp peer")
    if not is_gguf(model_path):
        raise ValueError("the llama.cpp peer needs a GGUF model (convert it with llama.cpp)")
    if as_shipped:
        gguf_file, name = model_path, f"llamacpp-{_file_type(model_path)}"
    else:
        gguf_file, name = convert_gguf(model_path, dtype), f"llamacpp-{_FLOAT_TYPES[dtype].lower()}"
    runner = Path(__file__).with_name("llamacpp_runner.py")
    args = ["--model", str(gguf_file), "--threads", str(os.cpu_count() or 1)]
    return run_runner(name, python, runner, args, workload, dict(os.environ))


def _file_type(path: Path) -> str:
    """The type most of the file's matrices have ("q4_1" for the default model)."""
    import gguf

    types = [t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) > 1]
    return max(set(types), key=types.count).lower()
