"""Each `inflight bench` mode end to end on the tiny model: results.json, summary.md, plots."""

from __future__ import annotations

import json
import os

import pytest

from inflight.cli import main
from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer

TINY = ["--dtype", "float32", "--num-kv-blocks", "256", "--max-model-len", "512"]


def read(out):
    report = json.loads((out / "results.json").read_text())
    assert (out / "summary.md").read_text().startswith("# inflight bench")
    for plot in ("throughput.png", "latency_cdf.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"
    return report


def test_offline(tiny_llama, tmp_path):
    out = tmp_path / "offline"
    code = main(["bench", "offline", str(tiny_llama), "--workload", "longtail",
                 "--num-requests", "12", "--out", str(out), "--max-num-seqs", "4",
                 *TINY])  # fmt: skip
    assert code == 0
    (run,) = read(out)["runs"]
    assert run["name"] == "inflight-continuous" and run["requests"] == 12
    assert run["mean_batch_seqs"] <= 4 and 0 < run["kv_usage_time_weighted"] <= 1
    assert set(run["ttft_s"]) == {"p50", "p90", "p99", "mean"}
    assert (out / "timeline.png").exists()


def test_compare_with_peers(tiny_llama, tmp_path):
    """The peers run beside inflight; one that cannot run (vLLM without `--vllm-python`) fails
    the command with its reason and keeps every other run."""
    out = tmp_path / "compare"
    code = main(["bench", "compare", str(tiny_llama), "--workload", "longtail",
                 "--num-requests", "12", "--max-num-seqs", "4", "--peers",
                 "hf-static,hf-continuous,vllm", "--out", str(out), *TINY])  # fmt: skip
    assert code == 1
    report = read(out)
    runs = {r["name"]: r for r in report["runs"]}
    assert "--vllm-python" in runs.pop("vllm")["error"]
    assert set(runs) == {"inflight-continuous", "inflight-static", "inflight-static-padded",
                         "hf-static", "hf-continuous"}  # fmt: skip
    want = runs["inflight-continuous"]["output_tokens"]
    assert all(r["output_tokens"] == want for r in runs.values())  # same useful work
    assert runs["inflight-static"]["steps"] > runs["inflight-continuous"]["steps"]
    # the same batches, run to their longest member with every seat filled
    padded, static = runs["inflight-static-padded"], runs["inflight-static"]
    assert padded["steps"] >= static["steps"]
    assert padded["mean_batch_seqs"] > static["mean_batch_seqs"]
    # no preemption, no prefix hits: static computes exactly what is needed; padding more
    assert static["computed_per_needed_token"] == 1.0
    assert padded["computed_per_needed_token"] > 1.0
    assert "inflight-continuous / inflight-static" in report["ratios"]


def test_compare_repeats_every_run_in_rounds(tiny_llama, tmp_path):
    """Every other round runs in reverse (so that no run is always a round's first), and the
    ratios are still taken against the first mode named."""
    out = tmp_path / "rounds"
    code = main(["bench", "compare", str(tiny_llama), "--workload", "longtail", "--num-requests",
                 "4", "--repeats", "2", "--modes", "continuous,static", "--out", str(out),
                 *TINY])  # fmt: skip
    assert code == 0
    report = read(out)
    assert [r["name"] for r in report["runs"]] == [
        "inflight-continuous #1", "inflight-static #1", "inflight-static #2",
        "inflight-continuous #2"]  # fmt: skip
    assert [(r["name"], r["rounds"]) for r in report["repeats"]] == [
        ("inflight-continuous", 2), ("inflight-static", 2)]  # fmt: skip
    assert "ratio_of_first" in report["repeats"][1] and report["ratios"] == {}
    assert "Over the rounds" in (out / "summary.md").read_text()


def test_compare_with_a_draft_model(tiny_llama, tmp_path):
    """`--speculative-model` drafts in the speculative mode only (the plain run has no drafts
    for it to write)."""
    out = tmp_path / "draft"
    code = main(["bench", "compare", str(tiny_llama), "--workload", "edit", "--num-requests", "4",
                 "--modes", "continuous,speculative", "--speculative-model", str(tiny_llama),
                 "--out", str(out), *TINY])  # fmt: skip
    assert code == 0
    runs = {r["name"]: r for r in read(out)["runs"]}
    plain, spec = runs["inflight-continuous"], runs["inflight-speculative"]
    assert plain["output_tokens"] == spec["output_tokens"]
    assert plain["spec_draft_tokens"] == 0 < spec["spec_draft_tokens"]


def test_compare_runs_the_float32_mode_on_its_own_weights(tiny_llama, tmp_path, monkeypatch):
    """`float32` loads the model again in float32 where the default is bf16, and the peers and
    the report keep the first mode's dtype."""
    import inflight.engine.engine_core as engine_core

    loads = []
    real_load = engine_core.load_model

    def recording_load(path, dtype, *args, **kwargs):
        loads.append(dtype)
        return real_load(path, dtype, *args, **kwargs)

    monkeypatch.setattr(engine_core, "load_model", recording_load)
    out = tmp_path / "float32"
    code = main(["bench", "compare", str(tiny_llama), "--workload", "longtail", "--num-requests",
                 "4", "--repeats", "2", "--modes", "continuous,float32", "--out", str(out),
                 *TINY, "--dtype", "bfloat16"])  # fmt: skip
    assert code == 0
    assert [str(d) for d in loads] == ["torch.bfloat16", "torch.float32", "torch.bfloat16"]
    report = read(out)
    assert report["meta"]["dtype"] == "bfloat16"
    runs = {r["name"]: r for r in report["runs"]}
    assert runs["inflight-float32 #1"]["output_tokens"] == runs["inflight-continuous #1"][
        "output_tokens"]  # fmt: skip


def test_compare_refuses_unknown_modes_and_padding_out_of_order(tiny_llama, tmp_path, caplog):
    base = ["bench", "compare", str(tiny_llama), "--workload", "longtail", "--num-requests", "4",
            "--out", str(tmp_path / "x"), *TINY]  # fmt: skip
    assert main([*base, "--modes", "continuous,dynamic"]) == 2
    assert "--modes takes some of continuous, static, static-padded" in caplog.text
    assert main([*base, "--modes", "static-padded", "--scheduling-policy", "sjf"]) == 2
    assert "padded batches need static batching under the fcfs policy" in caplog.text
    assert main([*base, "--repeats", "0"]) == 2
    assert "--repeats must be at least 1, got 0" in caplog.text


def test_serve_sweep(tiny_llama, tmp_path):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=512, num_kv_blocks=256)
    with LiveServer(engine, served_model_name="tiny") as s:
        out = tmp_path / "serve"
        code = main(["bench", "serve", "--url", s.url, "--model", "tiny", "--tokenizer",
                     str(tiny_llama), "--workload", "longtail", "--num-requests", "8",
                     "--rates", "20,40", "--out", str(out)])  # fmt: skip
        assert code == 0
    runs = read(out)["runs"]
    assert [r["name"] for r in runs] == ["rate 20/s", "rate 40/s"]
    for r in runs:
        assert r["errors"] == 0 and r["requests"] == 8
        assert r["ttft_s"]["p50"] > 0 and r["goodput_req_per_s"] >= 0


def test_offline_profile_breaks_steps_into_phases(tiny_llama, tmp_path):
    out = tmp_path / "profile"
    code = main(["bench", "offline", str(tiny_llama), "--workload", "longtail",
                 "--num-requests", "8", "--max-num-seqs", "4", "--profile", "--out", str(out),
                 *TINY])  # fmt: skip
    assert code == 0
    profile = json.loads((out / "profile.json").read_text())
    every = profile["all_steps"]
    assert set(every["phases"]) == {"schedule", "prepare_inputs", "forward", "sample", "update",
                                    "output"}  # fmt: skip
    assert every["steps"] == read(out)["runs"][0]["steps"]
    assert sum(p["share"] for p in every["phases"].values()) == pytest.approx(1, abs=1e-3)
    assert 0 < every["overhead_share"] < 1
    assert 0 < profile["full_batch_steps"]["steps"] < every["steps"]
    assert "## steps with 4 sequences" in (out / "profile.md").read_text()


def test_roofline_bounds_the_engine(tiny_llama, tmp_path):
    out = tmp_path / "roofline"
    code = main(["bench", "roofline", str(tiny_llama), "--workload", "longtail",
                 "--num-requests", "8", "--max-num-seqs", "4", "--out", str(out),
                 *TINY])  # fmt: skip
    assert code == 0
    report = read(out)
    engine, bound = report["runs"]
    assert (engine["name"], bound["name"]) == ("inflight-continuous", "roofline")
    assert bound["steps"] == engine["steps"]  # the same schedule, timed at the limit
    assert 0 < report["meta"]["fraction of roofline reached"] <= 1
    assert bound["wall_s"] < engine["wall_s"]


def test_soak_starts_a_server_and_accounts_for_every_request(tiny_llama, tmp_path):
    out = tmp_path / "soak"
    code = main(["bench", "soak", str(tiny_llama), "--workload", "longtail", "--duration", "3",
                 "--load", "3", "--max-num-seqs", "4", "--max-queued-requests", "4",
                 "--disconnect-fraction", "0.3", "--out", str(out), *TINY])  # fmt: skip
    assert code == 0
    report = json.loads((out / "soak.json").read_text())
    summary = report["summary"]
    assert summary["sent"] == sum(
        summary[k] for k in ("completed", "rejected", "errored", "disconnected", "lost")
    )
    assert summary["sent"] == len(report["timeline"]) > 0
    assert summary["lost"] == 0 and summary["completed"] > 0 and summary["disconnected"] > 0
    assert summary["exit_code"] == 0 and summary["idle_after_s"] < 1
    assert summary["health_failed"] == 0 and summary["health_polls"] > 0
    assert summary["rss_start_mib"] > 0
    assert (out / "soak.png").read_bytes()[:4] == b"\x89PNG"


def test_slowloris_measures_trickling_clients(tiny_llama, tmp_path):
    """Every trickling client is answered 408 and let go within the read timeout, all of them
    held at once meanwhile, and the well-behaved client's completions are timed throughout."""
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    out = tmp_path / "slowloris"
    with LiveServer(engine, served_model_name="tiny", read_timeout=1.0) as s:
        code = main(["bench", "slowloris", "--url", s.url, "--served-model-name", "tiny",
                     "--server-pid", str(os.getpid()), "--clients", "20", "--interval", "0.2",
                     "--probes", "2", "--out", str(out)])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "edge.json").read_text())["summary"]
    assert summary["answers"] == {"HTTP/1.1 408 Request Timeout": 20}
    assert summary["held_max_s"] < 4 and summary["peak_open"] == 20
    assert summary["latency_under_attack_median_s"] > 0 and summary["rss_peak_mib"] > 0
    assert (out / "edge.png").read_bytes()[:4] == b"\x89PNG"


def test_memory_splits_a_real_servers_peak(tiny_llama, tmp_path):
    """`bench memory` starts `inflight serve`, runs a workload through it and splits its peak
    RSS: the pool exactly as configured, weights as the server reports them."""
    out = tmp_path / "memory"
    code = main(["bench", "memory", str(tiny_llama), "--workload", "longtail", "--num-requests",
                 "4", "--out", str(out), *TINY])  # fmt: skip
    assert code == 0
    (run,) = json.loads((out / "memory.json").read_text())["runs"]
    assert run["server"] == "inflight-serve" and run["error"] is None
    kv_per_token = 2 * 2 * 2 * 16 * 4  # layers x K,V x kv heads x head dim x float32 bytes
    assert run["kv_bytes"] == 256 * 16 * kv_per_token
    assert 0 < run["weight_bytes"] < run["peak_rss_bytes"]
    assert run["state_bytes"] == 0  # (no layer carries state in place of KV)
    assert run["runtime_bytes"] == run["peak_rss_bytes"] - run["weight_bytes"] - run["kv_bytes"]
    assert run["ready_s"] > 0 and "| inflight-serve |" in (out / "summary.md").read_text()
    assert (out / "memory.png").read_bytes()[:4] == b"\x89PNG"


def test_memory_reads_llama_servers_kv_size_from_its_log():
    from inflight.bench.memory import llama_server_kv_bytes, llama_server_state_bytes, metric

    log = ("llama_kv_cache:        CPU KV buffer size =   120.00 MiB\n"
           "llama_kv_cache: size =  120.00 MiB (  2048 cells,  30 layers,  1/1 seqs), K (f16): "
           "60.00 MiB, V (f16):   60.00 MiB\n")  # fmt: skip
    assert llama_server_kv_bytes(log, 7) == 120 * 2**20  # the total, not the buffer line too
    assert llama_server_kv_bytes("no cache here", 7) is None
    quiet = "srv    load_model: initializing, n_slots = 16, n_ctx_slot = 512, kv_unified = 'false'"
    assert llama_server_kv_bytes(quiet, 7) == 16 * 512 * 7  # slots x context, f16 bytes
    recurrent = (
        "llama_memory_recurrent:        CPU RS buffer size =    50.25 MiB\n"
        "llama_memory_recurrent: size =   50.25 MiB (     1 cells,  32 layers,  1 seqs)"
    )
    assert llama_server_state_bytes(recurrent, 9) == int(50.25 * 2**20)  # the buffer, once
    assert llama_server_state_bytes(quiet, 9) == 16 * 9  # slots x a sequence's state
    assert llama_server_state_bytes(quiet, 0) == llama_server_state_bytes(log, 9) == 0
    text = "# HELP x\ninflight_kv_cache_bytes 4.096e+03\n"
    assert metric(text, "inflight_kv_cache_bytes") == 4096


def test_fairness_runs_the_steady_tenant_alone_then_beside_a_flood(tiny_llama, tmp_path):
    """Three runs of one plan: the steady tenant's every request has a TTFT in each, the flood
    shows only where it was sent, and the engines share the first one's weights."""
    out = tmp_path / "fairness"
    code = main(["bench", "fairness", str(tiny_llama), "--steady-rate", "6",
                 "--flood-factor", "3", "--duration", "1", "--max-tokens", "4",
                 "--slo", "ttft=60,tpot=60", "--out", str(out), *TINY])  # fmt: skip
    assert code == 0
    report = json.loads((out / "fairness.json").read_text())
    alone, fcfs, fair = report["runs"]
    assert [r["policy"] for r in report["runs"]] == ["fcfs", "fcfs", "fair"]
    assert "flood" not in alone["ttft"] and fcfs["ttft"]["flood"]["n"] == fair["ttft"]["flood"]["n"]
    assert (
        alone["ttft"]["steady"]["n"] == fcfs["ttft"]["steady"]["n"] == fair["ttft"]["steady"]["n"]
    )
    # every request meets targets of a minute: goodput is each tenant's completions a second
    for run in report["runs"]:
        for tenant, q in run["ttft"].items():
            expected = q["n"] / run["elapsed_s"]
            assert run["goodput_req_s"][tenant] == pytest.approx(expected, rel=0.01, abs=2e-3)
    assert "Goodput per tenant" in (out / "summary.md").read_text()
    assert (out / "fairness.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_slo_measures_both_runs_and_the_simulator_predicts_them(tiny_llama, tmp_path):
    """The capacity burst, then the same arrivals through the server without targets and with
    them (a TTFT target nothing meets: refusals), every request accounted for, and the
    simulator's goodput beside each."""
    out = tmp_path / "slo"
    # (`edit`: every prompt and its output fit the tiny model's 512 positions)
    code = main(["bench", "slo", str(tiny_llama), "--workload", "edit", "--duration", "1",
                 "--burst-requests", "4", "--slo", "ttft=0.0001,tpot=10", "--out", str(out),
                 *TINY])  # fmt: skip
    assert code == 0
    report = json.loads((out / "slo.json").read_text())
    plain, slo = report["runs"]
    assert report["offered_req_s"] > 0 and report["capacity_req_s"] > 0
    for run in (plain, slo):
        assert run["requests"] == run["served"] + run["refused"] + run["errors"] > 0
        assert run["errors"] == 0 and "goodput_req_s" in run["simulated"]
    assert plain["refused"] == 0 and slo["refused"] > 0
    assert slo["refusal_max_ms"] > 0 and slo["simulated"]["refused"] > 0
    assert (out / "slo.png").read_bytes()[:4] == b"\x89PNG"


def test_capacity_is_the_completion_rate_while_requests_wait():
    from inflight.bench.slo import Outcome, saturated_rate

    # all sent at 0; the last first token at 10 s: completions at 2, 4, 6, 8 s count (3 in 6
    # s), the one at 12 s does not; a refusal counts for nothing
    burst = [Outcome(200, ttft=1.0, e2e=e2e, output_tokens=4) for e2e in (2.0, 4.0, 6.0, 8.0)]
    burst += [Outcome(200, ttft=10.0, e2e=12.0, output_tokens=4), Outcome(429, e2e=0.01)]
    assert saturated_rate(burst) == pytest.approx(0.5)
    # nobody waited past the first completion: the whole burst's completions (2 in 4 s)
    short = [Outcome(200, ttft=0.5, e2e=e2e, output_tokens=4) for e2e in (1.0, 2.0, 5.0)]
    assert saturated_rate(short) == pytest.approx(0.5)
    # one step finished the whole burst: 4 in 0.2 s from the send, not 3 in the microsecond
    # between the ends
    together = [Outcome(200, ttft=0.1, e2e=0.2 + i * 1e-7, output_tokens=4) for i in range(4)]
    assert saturated_rate(together) == pytest.approx(20.0, rel=1e-5)
