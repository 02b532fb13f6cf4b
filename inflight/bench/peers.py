"""Peers run on the same model, dtype and workload: Hugging Face transformers `generate` with
padded static batches, and transformers' own continuous batching (`init_continuous_batching`).

Both only support workloads that arrive all at once. Static `generate` runs each batch until
its longest member is done (that waste is the point); only each request's own `max_tokens`
count as output. Peers report throughput and end-to-end latency; their TTFT is not observable
from outside `generate` and is left empty.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from inflight.bench.offline import peak_rss_mb, reset_peak_rss
from inflight.config import SchedulerConfig
from inflight.model.loader import is_gguf
from inflight.workload.requests import WorkloadRequest, require_simultaneous
from inflight.workload.results import RequestRecord, RunResult

HF_PAGE_TOKENS = 256  # tokens per block of transformers' paged cache (its default)
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def load_hf_model(path: Path, dtype: str, device: str = "cpu"):
    """On `device`: the peers run where inflight ran, or the comparison says nothing."""
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": _DTYPES[dtype]}
    if is_gguf(path):
        model = load_hf_gguf(path.parent, path.name, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model.to(device).eval()


def load_hf_gguf(folder: Path, gguf_file: str, **kwargs):
    """transformers' `AutoModelForCausalLM` from a GGUF file, with `gguf`'s tensor-name map
    built once per (architecture, layers) instead of once per submodule: transformers asks for
    it at every module of the model (~400 times for SmolLM2, each a fresh map of thousands of
    formatted names), which is 15 of the 20 s the load takes otherwise."""
    import gguf
    from transformers import AutoModelForCausalLM

    build = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(build)
    try:
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, **kwargs)
    finally:
        gguf.get_tensor_name_map = build


@torch.inference_mode()
def run_hf_static(
    path: Path,
    workload: list[WorkloadRequest],
    dtype: str,
    batch_size: int,
    device: str = "cpu",
    progress: bool = True,
) -> RunResult:
    require_simultaneous(workload, "hf-static")
    reset_peak_rss()
    model = load_hf_model(path, dtype, device)
    pad_id = 0
    records = []
    start = time.perf_counter()
    batches = [workload[i : i + batch_size] for i in range(0, len(workload), batch_size)]
    for batch in tqdm(batches, desc="hf-static", unit="batch", disable=not progress):
        width = max(len(r.prompt_token_ids) for r in batch)
        # left padding, so every row's last prompt token sits in the last column
        ids = torch.tensor([[pad_id] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids
                            for r in batch], device=device)  # fmt: skip
        mask = torch.tensor([[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids)
                             for r in batch], device=device)  # fmt: skip
        longest = max(r.max_tokens for r in batch)
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=longest,
                       eos_token_id=None, pad_token_id=pad_id)  # fmt: skip
        done = time.perf_counter() - start
        records += [RequestRecord(len(r.prompt_token_ids), r.max_tokens, None, done) for r in batch]
    return RunResult("hf-static", time.perf_counter() - start, records, peak_rss_mb=peak_rss_mb())


@torch.inference_mode()
def run_hf_continuous(
    path: Path,
    workload: list[WorkloadRequest],
    dtype: str,
    device: str = "cpu",
    progress: bool = True,
) -> RunResult:
    """transformers gets the whole workload at once, and a KV cache of the blocks it needs to
    hold all of it (sized by itself, it takes most of the free memory and spends seconds of
    the measured run allocating it) and inflight's default step budget. A request it fails (it
    logs the error and returns what it has, e.g. nothing after running out of GPU memory) fails
    the run: a short result must never be reported as a fast one."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    require_simultaneous(workload, "hf-continuous")
    reset_peak_rss()
    model = load_hf_model(path, dtype, device)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max(r.max_tokens for r in workload),
        eos_token_id=-1,  # an id no token has: ignore EOS, as the inflight runs do
        pad_token_id=0,
    )  # fmt: skip
    page = HF_PAGE_TOKENS
    cache = ContinuousBatchingConfig(
        page_size=page,
        num_blocks=sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // page) for r in workload),
        max_batch_tokens=SchedulerConfig.max_num_batched_tokens,
    )
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=cache
    )
    start = time.perf_counter()
    manager.start()
    records = []
    try:
        for i, r in enumerate(workload):
            manager.add_request(r.prompt_token_ids, request_id=str(i), max_new_tokens=r.max_tokens)
        for _ in tqdm(range(len(workload)), desc="hf-continuous", unit="req", disable=not progress):
            result = manager.get_result(timeout=3600)
            if result is None:
                raise RuntimeError("transformers continuous batching returned no result")
            r = workload[int(result.request_id)]
            if result.error is not None or len(result.generated_tokens) != r.max_tokens:
                raise RuntimeError(
                    f"transformers continuous batching failed request {result.request_id}: "
                    f"{len(result.generated_tokens)} of {r.max_tokens} tokens"
                    + (f" ({result.error})" if result.error else "")
                )
            records.append(RequestRecord(len(r.prompt_token_ids), len(result.generated_tokens),
                                         None, time.perf_counter() - start))  # fmt: skip
    finally:
        manager.stop(block=True)
    return RunResult(
        "hf-continuous", time.perf_counter() - start, records, peak_rss_mb=peak_rss_mb()
    )
