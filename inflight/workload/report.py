"""Benchmark reports: results.json, summary.md and PNG plots in one results folder.

Plots: output throughput per run, latency CDFs, and the batch timeline (sequences and tokens
per step, KV usage, queue depth) of every inflight run: static batching's idle seats, drawn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from inflight.workload.results import RunResult, summarize


def write_mode_report(out_dir: Path, stem: str, report: dict[str, Any],
                      markdown_of: Callable[[dict[str, Any]], str],
                      plot: Callable[[dict[str, Any], Path], None]) -> None:  # fmt: skip
    """A bench mode's own report: `stem`.json, summary.md (`markdown_of(report)`) and
    `stem`.png (`plot(report, path)`) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "summary.md").write_text(markdown_of(report))
    plot(report, out_dir / f"{stem}.png")


def write_report(
    out_dir: Path, title: str, runs: list[RunResult], meta: dict[str, Any], plots: bool = True
) -> dict:
    """results.json and summary.md, and with `plots` the figures (a second or two each: a
    report rewritten after every run of a long comparison draws them only at its end)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = [summarize(r) for r in runs]
    ok = [s for s in summaries if "error" not in s]
    repeats = repeat_stats(ok)
    ratios = {}
    if ok and ok[0]["output_tok_per_s"] and not repeats:  # every run against the first
        base_name, base = ok[0]["name"], ok[0]["output_tok_per_s"]
        ratios = {f"{base_name} / {s['name']}": round(base / s["output_tok_per_s"], 2)
                  for s in ok[1:] if s["output_tok_per_s"]}  # fmt: skip
    report = {"title": title, "meta": meta, "runs": summaries, "ratios": ratios}
    if repeats:
        report["repeats"] = repeats
    (out_dir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "summary.md").write_text(markdown(report))
    if not plots:
        return report
    plot_throughput(out_dir / "throughput.png", ok)
    plot_latency_cdfs(out_dir / "latency_cdf.png", [r for r in runs if not r.error])
    timelines = [r for r in runs if r.timeline]
    if timelines:
        plot_timeline(out_dir / "timeline.png", timelines)
    return report


def split_round(name: str) -> tuple[str, int | None]:
    """'inflight-continuous #2' -> ('inflight-continuous', 2); a name without a round -> None."""
    match = re.fullmatch(r"(.*) #(\d+)", name)
    return (match[1], int(match[2])) if match else (name, None)


def repeat_stats(summaries: list[dict]) -> list[dict]:
    """Runs repeated in rounds (names ending ' #k'): each one's median output tok/s and range,
    and its ratio to the first run, taken within each round (runs of one round are minutes
    apart, so the ratio shares their drift) and summed up as median and range. Empty when
    nothing was repeated."""
    by_run: dict[str, dict[int, float]] = {}
    for s in summaries:
        name, round_ = split_round(s["name"])
        if round_ is not None and s["output_tok_per_s"]:
            by_run.setdefault(name, {})[round_] = s["output_tok_per_s"]
    if not any(len(rounds) > 1 for rounds in by_run.values()):
        return []
    base = next(iter(by_run.values()))
    stats = []
    for name, rounds in by_run.items():
        values = list(rounds.values())
        row = {"name": name, "rounds": len(values), "median": float(np.median(values)),
               "min": min(values), "max": max(values)}  # fmt: skip
        ratios = [base[k] / v for k, v in rounds.items() if k in base]
        if rounds is not base and ratios:
            row["ratio_of_first"] = {
                "median": round(float(np.median(ratios)), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            }
        stats.append(row)
    return stats


def _fmt(p: dict[str, float], key: str) -> str:
    return f"{p[key]:.3f}" if key in p else "-"


def markdown(report: dict) -> str:
    lines = [f"# {report['title']}", ""]
    lines += [f"- {k}: {v}" for k, v in report["meta"].items()]
    lines += ["", "| run | output tok/s | req/s | wall s | TTFT p50/p99 s | TPOT p50 s "
              "| e2e p50/p99 s | mean seqs/step | KV use | computed / needed tokens | preempt "
              "| peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in report["runs"]:
        if "error" in s:
            lines.append(f"| {s['name']} | error: {s['error']} |" + " |" * 10)
            continue
        ttft, tpot, e2e = s["ttft_s"], s["tpot_s"], s["e2e_s"]
        lines.append(
            f"| {s['name']} | {s['output_tok_per_s']} | {s['requests_per_s']} | {s['wall_s']} "
            f"| {_fmt(ttft, 'p50')} / {_fmt(ttft, 'p99')} | {_fmt(tpot, 'p50')} "
            f"| {_fmt(e2e, 'p50')} / {_fmt(e2e, 'p99')} | {s.get('mean_batch_seqs', '-')} "
            f"| {s.get('kv_usage_time_weighted', '-')} "
            f"| {s.get('computed_per_needed_token', '-')} | {s['preemptions']} "
            f"| {round(s['peak_rss_mb']) if s['peak_rss_mb'] else '-'} |"
        )
    if report["ratios"]:
        lines += ["", "Ratios of output tokens/s, measured in this one run:", ""]
        lines += [f"- {k}: **{v}x**" for k, v in report["ratios"].items()]
    if report.get("repeats"):
        first = report["repeats"][0]["name"]
        lines += ["", f"Over the rounds (each run once per round; ratio: {first}'s output tok/s "
                  "over the run's, within each round):", "",
                  "| run | rounds | output tok/s median (min - max) | ratio median (min - max) |",
                  "|---|---|---|---|"]  # fmt: skip
        for r in report["repeats"]:
            q = r.get("ratio_of_first")
            ratio = f"**{q['median']}x** ({q['min']} - {q['max']})" if q else "-"
            lines.append(f"| {r['name']} | {r['rounds']} | {r['median']:.2f} "
                         f"({r['min']:.2f} - {r['max']:.2f}) | {ratio} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot_throughput(path: Path, summaries: list[dict]) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [s["name"] for s in summaries]
    values = [s["output_tok_per_s"] for s in summaries]
    bars = ax.barh(names, values, color="tab:blue")
    ax.bar_label(bars, fmt="%.1f", padding=3)
    ax.set_xlim(0, max(values, default=1) * 1.12)  # room for the longest bar's label
    ax.set_xlabel("output tokens / s")
    ax.set_title("Throughput")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_latency_cdfs(path: Path, runs: list[RunResult]) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, attr, label in ((axes[0], "ttft", "time to first token (s)"),
                            (axes[1], "e2e", "end-to-end latency (s)")):  # fmt: skip
        for i, run in enumerate(runs):  # one colour per run in both panels
            values = np.sort([v for r in run.requests if (v := getattr(r, attr)) is not None])
            if len(values):
                ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post",
                        label=run.name, color=f"C{i % 10}")  # fmt: skip
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_timeline(path: Path, runs: list[RunResult]) -> None:
    panels = (("num_running", "running sequences"), ("num_batched_tokens", "tokens per step"),
              ("kv_usage", "KV cache usage"), ("num_waiting", "queue depth"))  # fmt: skip
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 9), sharex=True)
    for ax, (attr, label) in zip(axes, panels, strict=True):
        for run in runs:
            t = [s.t for s in run.timeline]
            ax.step(t, [getattr(s, attr) for s in run.timeline], where="post", label=run.name)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("seconds since start")
    fig.suptitle("The batch over time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_soak(result: Any, path: Path, window_s: float = 10.0) -> None:
    """A soak over time: request outcomes per window, /health latency, server RSS."""
    fig, (ax_out, ax_health, ax_rss) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    end = max([t for t, _ in result.timeline] + [window_s])
    edges = np.arange(0.0, end + window_s, window_s)
    bottom = np.zeros(len(edges) - 1)
    for outcome in ("completed", "rejected", "disconnected", "errored", "lost"):
        times = [t for t, o in result.timeline if o == outcome]
        counts, _ = np.histogram(times, bins=edges)
        if counts.any():
            ax_out.bar(edges[:-1], counts / window_s, width=window_s, bottom=bottom,
                       align="edge", label=outcome)  # fmt: skip
            bottom += counts / window_s
    ax_out.set_ylabel("requests/s ended")
    ax_out.legend(loc="upper right", fontsize=8)
    health = [(t, s * 1000) for t, s in result.health if s != float("inf")]
    if health:
        ax_health.plot(*zip(*health, strict=True), ".", markersize=2)
    ax_health.set_ylabel("/health + /metrics, ms")
    ax_health.set_yscale("log")
    if result.rss:
        ax_rss.plot(*zip(*result.rss, strict=True))
    ax_rss.set_ylabel("server RSS, MiB")
    ax_rss.set_xlabel("seconds")
    fig.suptitle(f"soak at {result.rate_req_per_s:.2f} req/s "
                 f"(saturation {result.saturation_req_per_s:.2f} req/s)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
