"""`inflight bench offline --constrained-fraction F`: the cost of structured outputs.

The same workload runs twice on the same weights: unconstrained, then with a fraction F of its
requests constrained to `ORDER_SCHEMA` (nested objects, arrays, enums, bounded numbers and
strings). The schema asks for at least `MIN_ITEMS` items, so no constrained request can finish
before its `max_tokens`: both runs decode the same tokens in the same steps, and step i of one
run is step i of the other, batch for batch. The difference is the grammar's cost alone: masks
filled beside the forward pass, applied, and matchers advanced.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from inflight.sampling_params import StructuredOutputs
from inflight.structured import CompileStats
from inflight.workload.results import RunResult

MIN_ITEMS = 10_000
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1, "maximum": 999999},
        "status": {"enum": ["pending", "paid", "shipped"]},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "vip"],
        },
        "items": {
            "type": "array",
            "minItems": MIN_ITEMS,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 12},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price": {"type": "number", "minimum": 0, "maximum": 10000},
                    "tags": {
                        "type": "array",
                        "items": {"enum": ["new", "sale", "bulk"]},
                        "maxItems": 2,
                    },
                },
                "required": ["sku", "qty", "price", "tags"],
            },
        },
    },
    "required": ["order_id", "status", "customer", "items"],
}


def order_constraint() -> StructuredOutputs:
    return StructuredOutputs(json=ORDER_SCHEMA)


def is_constrained(index: int, fraction: float) -> bool:
    """Spreads a `fraction` of the requests evenly over the workload (0.5: every other one)."""
    return int((index + 1) * fraction) > int(index * fraction)


def decode_steps(run: RunResult) -> list[tuple[int, float]]:
    """(sequences, seconds) of every step that only decoded (one token per sequence)."""
    return [(s.num_scheduled_seqs, s.duration_s) for s in run.timeline
            if s.num_scheduled_seqs and s.num_batched_tokens == s.num_scheduled_seqs]  # fmt: skip


def compare(base: RunResult, constrained: RunResult, max_num_seqs: int,
            stats: CompileStats) -> dict:  # fmt: skip
    """Step time of both runs at a full batch and over all decode steps, and compile times."""
    a, b = decode_steps(base), decode_steps(constrained)
    full_a = [t for n, t in a if n == max_num_seqs]
    full_b = [t for n, t in b if n == max_num_seqs]

    def ms(values: list[float]) -> float | None:
        return round(1e3 * mean(values), 2) if values else None

    result = {
        "same_schedule": [n for n, _ in a] == [n for n, _ in b],
        "full_batch": {"sequences": max_num_seqs, "steps": len(full_a),
                       "unconstrained_ms": ms(full_a), "constrained_ms": ms(full_b)},
        "all_decode": {"steps": len(a), "unconstrained_ms": ms([t for _, t in a]),
                       "constrained_ms": ms([t for _, t in b])},
        "wall_s": {"unconstrained": round(base.wall_s, 2),
                   "constrained": round(constrained.wall_s, 2)},
        "compile": {
            "cold": stats.cold,
            "cold_ms": round(1e3 * stats.cold_seconds / max(1, stats.cold), 2),
            "cached": stats.cached,
            "cached_ms": round(1e3 * stats.cached_seconds / max(1, stats.cached), 3),
        },
    }  # fmt: skip
    for key in ("full_batch", "all_decode"):
        row = result[key]
        if row["unconstrained_ms"] and row["constrained_ms"]:
            row["ratio"] = round(row["constrained_ms"] / row["unconstrained_ms"], 3)
    return result


def write_structured_report(out: Path, result: dict, base: RunResult, constrained: RunResult,
                            fraction: float, device: str) -> str:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "structured.json").write_text(json.dumps(result, indent=2) + "\n")
    full, every, comp = result["full_batch"], result["all_decode"], result["compile"]
    lines = [
        "# Structured outputs: step time", "",
        f"- device: {device}",
        f"- {fraction:.0%} of the requests constrained to the order schema "
        f"(`inflight.bench.structured.ORDER_SCHEMA`); same schedule in both runs: "
        f"{result['same_schedule']}", "",
        "| decode steps | steps | unconstrained ms | constrained ms | ratio |",
        "|---|---|---|---|---|",
        f"| {full['sequences']} sequences | {full['steps']} | {full['unconstrained_ms']} "
        f"| {full['constrained_ms']} | {full.get('ratio', '-')} |",
        f"| all | {every['steps']} | {every['unconstrained_ms']} | {every['constrained_ms']} "
        f"| {every.get('ratio', '-')} |", "",
        f"Grammar compile: cold {comp['cold_ms']} ms ({comp['cold']}), cached "
        f"{comp['cached_ms']} ms ({comp['cached']}).", "",
    ]  # fmt: skip
    text = "\n".join(lines)
    (out / "structured.md").write_text(text)
    _plot(out / "structured.png", base, constrained)
    return text


def _plot(path: Path, base: RunResult, constrained: RunResult) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run, label in ((base, "unconstrained"), (constrained, "constrained")):
        steps = decode_steps(run)
        ax.plot(range(len(steps)), [1e3 * t for _, t in steps], lw=1, label=label)
    twin = ax.twinx()
    twin.plot([n for n, _ in decode_steps(base)], color="grey", lw=0.8, ls=":")
    twin.set_ylabel("sequences in the step (dotted)")
    ax.set_xlabel("decode step")
    ax.set_ylabel("step time (ms)")
    ax.set_title("Decode step time with and without constrained requests")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
