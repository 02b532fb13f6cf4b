"""vLLM's CPU build as a peer: run in its own virtual environment (`--vllm-python`), on the same
weights exported as a Hugging Face folder, in its best configuration for this machine.

What "best" means here (measured, see FIELD_NOTES): OpenMP threads bound to every core
(`VLLM_CPU_OMP_THREADS_BIND`), tcmalloc and Intel OpenMP preloaded when found, bfloat16.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from inflight.bench.external_peer import run_runner
from inflight.file_cache import cache_dir
from inflight.model.loader import is_gguf
from inflight.process_setup import find_tcmalloc
from inflight.tokenizer import load_tokenizer
from inflight.workload.requests import WorkloadRequest, require_simultaneous
from inflight.workload.results import RunResult

logger = logging.getLogger("inflight.bench")


def export_hf_folder(path: Path, dtype: str) -> Path:
    """A GGUF model as an HF folder (safetensors + config + tokenizer), cached; an HF folder is
    returned as it is."""
    if not is_gguf(path):
        return path
    out = cache_dir() / "hf-export" / f"{path.stem}-{dtype}"
    if (out / "config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM

    from inflight.bench.peers import load_hf_model

    loaded = load_hf_model(path, dtype)
    # transformers refuses to save a model loaded from GGUF: copy it into a plain one.
    plain = AutoModelForCausalLM.from_config(loaded.config, dtype=loaded.dtype)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    # The config still names the GGUF "quantization" it was read from; the folder is plain.
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    load_tokenizer(path).save_pretrained(out)
    logger.info("exported %s to %s for vLLM", path.name, out)
    return out


def _environment(python: Path) -> dict[str, str]:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="4")
    env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{(os.cpu_count() or 1) - 1}"
    preload = [str(p) for p in [find_tcmalloc()] if p is not None]
    venv = python.parent.parent
    iomp = sorted(venv.glob("lib/libiomp5.so")) + sorted(venv.glob("lib/python3*/**/libiomp5.so"))
    preload += [str(p) for p in iomp[:1]]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def run_vllm(
    python: Path, model_path: Path, workload: list[WorkloadRequest], dtype: str, max_num_seqs: int
) -> RunResult:
    require_simultaneous(workload, "the vllm peer")
    folder = export_hf_folder(model_path, dtype)
    runner = Path(__file__).with_name("vllm_runner.py")
    args = ["--model", str(folder), "--dtype", dtype, "--max-num-seqs", str(max_num_seqs)]
    return run_runner("vllm-cpu", python, runner, args, workload, _environment(python))
