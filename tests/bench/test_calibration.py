"""`inflight bench calibrate` end to end on the tiny model (the fit's arithmetic does not depend on
the model; a real model only makes it slower): the engine and the simulation pair step for
step, the fitted profile loads back, the error table covers both workloads."""

from __future__ import annotations

import json

from inflight.cli import main
from inflight.sim.hardware import HardwareProfile


def test_calibrate_end_to_end(tiny_llama, tmp_path):
    out = tmp_path / "calibration"
    code = main(["bench", "calibrate", str(tiny_llama), "--dtype", "float32", "--max-model-len",
                 "512", "--fit-workload", "edit",
                 "--check-workload", "longtail", "--num-requests", "4",
                 "--max-num-seqs", "4", "--num-kv-blocks", "256", "--out", str(out)])  # fmt: skip
    assert code == 0
    profile = HardwareProfile.load(out / "cpu-profile.json")
    assert profile.is_cpu and profile.combine == "sum" and profile.memory_bw > 0
    text = (out / "calibration.md").read_text()
    assert "## `edit` (fit)" in text and "## `longtail` (check (not fitted on))" in text
    for name in ("edit", "longtail"):
        engine, simulated = json.loads((out / name / "results.json").read_text())["runs"]
        assert engine["steps"] == simulated["steps"]  # same schedule, step for step
        assert engine["output_tokens"] == simulated["output_tokens"]
