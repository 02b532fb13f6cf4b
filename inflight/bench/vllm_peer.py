"""vLLM's CPU build as a peer: run in its own virtual environment (`--vllm-python`), on the same
weights exported as a Hugging Face folder, in its best configuration for this machine.

What "best" means here (measured, see FIELD_NOTES): OpenMP threads bound to every core
(`VLLM_CPU_OMP_THREADS_BIND`), tcmalloc and Intel OpenMP preloaded when found, bfloat16.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

from inflight.bench.stats import RequestRecord, RunResult
from inflight.bench.workloads import WorkloadRequest, save_jsonl
from inflight.model.loader import is_gguf
from inflight.tokenizer import cache_dir, load_tokenizer

logger = logging.getLogger("inflight.bench")

_TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
             "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")  # fmt: skip


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
    preload = [p for p in _TCMALLOC if Path(p).is_file()][:1]
    venv = python.parent.parent
    iomp = sorted(venv.glob("lib/libiomp5.so")) + sorted(venv.glob("lib/python3*/**/libiomp5.so"))
    preload += [str(p) for p in iomp[:1]]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def run_vllm(
    python: Path, model_path: Path, workload: list[WorkloadRequest], dtype: str, max_num_seqs: int
) -> RunResult:
    if any(r.arrival_time > 0 for r in workload):
        raise ValueError("the vllm peer only runs workloads whose requests all arrive at once")
    folder = export_hf_folder(model_path, dtype)
    runner = Path(__file__).with_name("vllm_runner.py")
    with tempfile.TemporaryDirectory() as tmp:
        work, result = Path(tmp) / "workload.jsonl", Path(tmp) / "result.json"
        save_jsonl(workload, work)
        command = [str(python), str(runner), str(folder), str(work), str(result),
                   "--dtype", dtype, "--max-num-seqs", str(max_num_seqs)]  # fmt: skip
        logger.info("vllm peer: %s", " ".join(command))
        with tempfile.TemporaryFile("w+") as stderr:
            process = subprocess.Popen(command, env=_environment(python), text=True,
                                       stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
            peak_mb = _watch_tree_rss(process)
            if process.returncode != 0:
                stderr.seek(0)
                raise RuntimeError(f"vLLM exited with {process.returncode}: "
                                   f"{stderr.read()[-2000:]}")  # fmt: skip
        data = json.loads(result.read_text())
    wall = data["wall_s"]
    records = [RequestRecord(*row) for row in data["requests"]]
    return RunResult("vllm-cpu", wall, records, peak_rss_mb=peak_mb)


def _tree_rss_kib(root: int) -> int:
    """Resident memory of a process and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue  # the process ended meanwhile
        pid = int(status.parent.name)
        children.setdefault(int(fields["PPid"]), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack += children.get(pid, [])
    return total


def _watch_tree_rss(process: subprocess.Popen, interval_s: float = 0.25) -> float:
    """Waits for `process`, sampling its tree's RSS; returns the peak in MB. (The runner cannot
    measure itself: on Linux a child's ru_maxrss starts at its parent's, ours, at fork.)"""
    peak = 0
    while process.poll() is None:
        peak = max(peak, _tree_rss_kib(process.pid))
        time.sleep(interval_s)
    return peak / 1024
