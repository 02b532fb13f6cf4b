"""`inflight simulate run | plan` end to end: files written, figures consistent."""

from __future__ import annotations

import json

from inflight.cli import main
from inflight.sim.hardware import PROFILES, HardwareProfile


def test_run_compare_writes_the_bench_report(tmp_path):
    out = tmp_path / "run"
    code = main(["simulate", "run", "--model", "smollm2-135m", "--hardware", "l40s",
                 "--workload", "mixed64", "--num-requests", "16", "--max-num-seqs", "8",
                 "--compare", "--out", str(out)])  # fmt: skip
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    continuous, static = report["runs"]
    assert (continuous["name"], static["name"]) == ("simulated-continuous", "simulated-static")
    assert continuous["requests"] == static["requests"] == 16
    assert continuous["output_tokens"] == static["output_tokens"]
    assert static["steps"] > continuous["steps"]
    assert report["meta"]["hardware"] == "l40s" and report["meta"]["max_num_seqs"] == 8
    for plot in ("throughput.png", "latency_cdf.png", "timeline.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"


def test_run_on_a_saved_profile_with_overrides(tmp_path):
    path = tmp_path / "gpu.json"
    PROFILES["a100-80gb"].save(path)
    assert HardwareProfile.load(path) == PROFILES["a100-80gb"]
    out = tmp_path / "run"
    args = ["simulate", "run", "--model", "llama-3.1-8b", "--workload", "chat",
            "--num-requests", "8", "--out", str(out), "--hardware", str(path)]  # fmt: skip
    assert main(args) == 0
    fast = json.loads((out / "results.json").read_text())["runs"][0]
    assert main([*args, "--step-overhead-ms", "50", "--compute-efficiency", "0.5"]) == 0
    slow = json.loads((out / "results.json").read_text())["runs"][0]
    assert slow["wall_s"] > fast["wall_s"] + 0.05 * slow["steps"] * 0.99


def test_plan_writes_table_and_choice(tmp_path):
    out = tmp_path / "plan"
    code = main(["simulate", "plan", "--model", "llama-3.1-8b", "--workload", "chat",
                 "--rate", "4", "--num-requests", "40", "--slo-ttft-p99", "1.0",
                 "--seqs-grid", "8,32", "--tokens-grid", "4096", "--max-replicas", "2",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    result = json.loads((out / "plan.json").read_text())
    assert result["best"]["replicas"] == 1 and result["best"]["meets"]
    assert "**Cheapest:** 1 replica(s)" in (out / "plan.md").read_text()


def test_bad_input_is_a_clear_error(tmp_path, caplog):
    code = main(["simulate", "run", "--model", "llama-3.3-70b", "--workload", "chat",
                 "--num-requests", "4", "--out", str(tmp_path)])  # fmt: skip
    assert code == 2
    assert "no room for a KV cache" in caplog.text
    assert main(["simulate", "run", "--hardware", "tpu-v9", "--out", str(tmp_path)]) == 2
    assert "unknown hardware 'tpu-v9'" in caplog.text
