"""A run's report directory: summary JSON and PNG plots over time with fault events marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from loadtest.stats import summarize, timeseries


def _mark_faults(ax: Any, faults: list[dict[str, Any]]) -> None:
    for f in faults:
        ax.axvline(f["t"], color="tab:red", linestyle="--", linewidth=1, alpha=0.8)
        ax.annotate(f["event"], xy=(f["t"], 1.0), xycoords=("data", "axes fraction"), rotation=90,
                    fontsize=7, color="tab:red", ha="right", va="top")


def plot(series: list[dict[str, Any]], faults: list[dict[str, Any]], out_dir: Path, title: str = "") -> list[Path]:
    """throughput.png, latency.png, staleness.png (and all three stacked in timeline.png)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    t = [b["t"] for b in series]
    nan = float("nan")

    def col(name: str) -> list[float]:
        return [nan if b[name] is None else b[name] for b in series]

    def throughput(ax: Any) -> None:
        ax.plot(t, col("answered_rps"), label="answered/s", color="tab:blue")
        ax.plot(t, col("failed_rps"), label="failed/s", color="tab:red")
        ax.set_ylabel("requests/s")
        ax.legend(loc="lower left", fontsize=8)

    def latency(ax: Any) -> None:
        ax.plot(t, col("p50_ms"), label="p50", color="tab:green")
        ax.plot(t, col("p99_ms"), label="p99", color="tab:orange")
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms)")
        ax.legend(loc="upper left", fontsize=8)

    def staleness(ax: Any) -> None:
        ax.plot(t, col("lag_ms_max"), label="max lag ms served", color="tab:purple")
        ax.plot(t, col("lag_ms_p50"), label="p50 lag ms served", color="tab:pink")
        ax.set_ylabel("staleness (ms)")
        ax2 = ax.twinx()
        ax2.plot(t, col("lag_offsets_max"), label="max lag offsets served", color="tab:gray", linestyle=":")
        ax2.set_ylabel("lag (offsets)")
        ax.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="upper right", fontsize=8)

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("throughput", throughput), ("latency", latency), ("staleness", staleness)):
        fig, ax = plt.subplots(figsize=(10, 3.5))
        draw(ax)
        _mark_faults(ax, faults)
        ax.set_xlabel("time since start (s)")
        ax.set_title(f"{title} {name}".strip())
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for ax, draw in zip(axes, (throughput, latency, staleness)):
        draw(ax)
        _mark_faults(ax, faults)
    axes[0].set_title(title)
    axes[-1].set_xlabel("time since start (s)")
    fig.tight_layout()
    path = out_dir / "timeline.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


def write_report(records: list[dict[str, Any]], faults: list[dict[str, Any]], duration_s: float, out_dir: Path,
                 title: str = "", extra: dict[str, Any] | None = None, plots: bool = True) -> dict[str, Any]:
    """Write ``summary.json`` (+ ``timeseries.json`` and plots) into ``out_dir``; return the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, duration_s, faults)
    if extra:
        summary.update(extra)
    bucket = 1.0 if duration_s <= 300 else duration_s / 300  # at most ~300 points per plot
    series = timeseries(records, bucket, duration_s)
    (out_dir / "timeseries.json").write_bytes(orjson.dumps(series))
    if plots:
        summary["plots"] = [p.name for p in plot(series, faults, out_dir, title)]
    (out_dir / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary
