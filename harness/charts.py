"""Charts (matplotlib, Agg) over one or more runs; each function returns a Figure.

One colour per backend everywhere (the same backend in two files gets the same colour and a
different line style), units on every axis, titled with the workload and device.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from harness import metrics, stats, verdicts  # noqa: E402
from harness.report import LabelledResults, point_speedup, series, series_name  # noqa: E402
from harness.results import BYTE_CATEGORIES  # noqa: E402

PALETTE = plt.get_cmap("tab10").colors
LINESTYLES = ("-", "--", ":", "-.")
CATEGORY_COLOURS = {"h2d": "#d62728", "d2h": "#ff7f0e", "d2d": "#9467bd", "kernel": "#1f77b4"}
CATEGORY_LABELS = {"h2d": "host→device", "d2h": "device→host", "d2d": "device→device copy",
                   "kernel": "kernel read+write"}
FORMATS = ("png", "svg")


def backend_colours(runs: list[LabelledResults]) -> dict[str, tuple]:
    names = sorted({b for run in runs for b in run.results.backends})
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(names)}


def _title(runs: list[LabelledResults], what: str) -> str:
    return f"{what}\n" + " | ".join(dict.fromkeys(r.results.label for r in runs))


def _lines(runs: list[LabelledResults], what: str, ylabel: str, value, logy: bool = True,
           hline: float | None = None, band=None, level=None) -> Figure:
    """One line per run × backend of value(run, point) against context. `band(run, point)`:
    (low, high) drawn as error bars; `level(run, point)`: True where the point is within the
    noise of its baseline, drawn as a hollow marker."""
    colours = backend_colours(runs)
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    drawn = 0
    for run, b in series(runs):
        pts = [(p.context, value(run, p)) for p in run.results.points if p.backend == b]
        pts = sorted((c, v) for c, v in pts if v is not None)
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        ls = LINESTYLES[[r.label for r in runs].index(run.label) % len(LINESTYLES)]
        ax.plot(xs, ys, marker="o", color=colours[b], linestyle=ls, label=series_name(run, b))
        by_ctx = {p.context: p for p in run.results.points if p.backend == b}
        if band is not None:
            bands = [band(run, by_ctx[c]) for c in xs]
            keep = [(c, y, lh) for c, y, lh in zip(xs, ys, bands, strict=True) if lh]
            if keep:
                ax.errorbar([c for c, _, _ in keep], [y for _, y, _ in keep],
                            yerr=[[y - lo for _, y, (lo, _) in keep],
                                  [hi - y for _, y, (_, hi) in keep]],
                            fmt="none", ecolor=colours[b], capsize=3, linewidth=1)
        if level is not None:
            flat = [(c, y) for c, y in zip(xs, ys, strict=True) if level(run, by_ctx[c])]
            if flat:
                ax.plot(*zip(*flat, strict=True), marker="o", linestyle="none", markersize=9,
                        markerfacecolor="white", markeredgecolor=colours[b])
        drawn += 1
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("context depth L (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(_title(runs, what), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no measured points", ha="center", va="center", transform=ax.transAxes)
    return fig


def _interval(run: LabelledResults, p) -> tuple[float, float] | None:
    iv = verdicts.interval_of(p)
    return (iv.low, iv.high) if iv else None


def _no_difference(run: LabelledResults, p) -> bool:
    c = verdicts.over_baseline(run.results, p)
    return c is not None and c.verdict == stats.NO_DIFFERENCE


def step_time(runs: list[LabelledResults]) -> Figure:
    return _lines(runs, "Decode step time vs context (bars: interval of the median)",
                  "step time, median (ms)",
                  lambda run, p: p.step_ms.median if p.measured else None, band=_interval)


def speedup(runs: list[LabelledResults]) -> Figure:
    base = runs[0].baseline or "stateless"
    return _lines(runs, f"Speedup over {base} (matching points only; hollow: no difference, "
                  "the intervals overlap)", "speedup (×)",
                  lambda run, p: point_speedup(run, p), logy=False, hline=1.0,
                  level=_no_difference)


def mbu(runs: list[LabelledResults]) -> Figure:
    return _lines(runs, "Memory-bandwidth utilisation vs context", "MBU (floor time / step time)",
                  lambda run, p: (metrics.plausible_mbu(p.mbu)
                                  if p.measured and not run.calibration_problems else None),
                  logy=False)


def bytes_per_step(runs: list[LabelledResults]) -> Figure:
    """Stacked bars by category, one panel per file × backend, shared log-free y axis."""
    cols = series(runs)
    n = max(len(cols), 1)
    ncols = min(n, 4)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 3.0 * nrows), squeeze=False,
                             sharey=True, layout="constrained")
    colours = backend_colours(runs)
    for ax, (run, b) in zip(axes.flat, cols, strict=False):
        pts = sorted((p for p in run.results.points if p.backend == b and p.measured),
                     key=lambda p: p.context)
        labels = [str(p.context) for p in pts]
        bottom = [0.0] * len(pts)
        for k in BYTE_CATEGORIES:
            vals = [p.bytes_per_step[k] / 2**20 for p in pts]
            ax.bar(labels, vals, bottom=bottom, color=CATEGORY_COLOURS[k], label=CATEGORY_LABELS[k])
            bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
        ax.set_title(series_name(run, b), fontsize=9, color=colours[b])
        ax.set_xlabel("context depth L (tokens)")
        ax.grid(True, axis="y", alpha=0.3)
        if not pts:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[:, 0]:
        ax.set_ylabel("bytes per step (MiB)")
    for ax in list(axes.flat)[len(cols):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=8)
    fig.suptitle(_title(runs, "Bytes moved per decode step, by category"), fontsize=10)
    return fig


CHARTS = {"step_time": step_time, "bytes_per_step": bytes_per_step, "speedup": speedup, "mbu": mbu}


def write_all(runs: list[LabelledResults], out_dir: Path) -> dict[str, dict[str, Path]]:
    """Every chart as PNG and SVG under `out_dir`; returns {chart: {format: path}}."""
    return write_charts(CHARTS, runs, out_dir)


def write_charts(charts: dict, runs: list, out_dir: Path) -> dict[str, dict[str, Path]]:
    """Each of ``charts`` (name: a function of ``runs`` making a figure) as PNG and SVG under
    `out_dir`; returns {chart: {format: path}}. The speculative report's charts too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict[str, Path]] = {}
    for name, make in charts.items():
        fig = make(runs)
        written[name] = {}
        for fmt in FORMATS:
            path = out_dir / f"{name}.{fmt}"
            fig.savefig(path, dpi=120, metadata={"Date": None} if fmt == "svg" else None)
            written[name][fmt] = path
        plt.close(fig)
    return written
