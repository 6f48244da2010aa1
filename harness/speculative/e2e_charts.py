"""Charts of end-to-end speculative files (matplotlib, Agg, as harness/charts.py makes run's):
one panel per file × depth, one colour per backend (the same in every panel), one line
style and marker per K. Each function returns a Figure; `write_all` saves PNG and SVG.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from harness.charts import LINESTYLES, PALETTE, write_charts  # noqa: E402
from harness.speculative.e2e_report import SpecRun, ordered  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P")


def _colours(runs: list[SpecRun]) -> dict[str, tuple]:
    names = sorted({p["backend"] for run in runs for p in run.results.points})
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(names)}


def _panels(runs: list[SpecRun]) -> list[tuple[str, list[dict]]]:
    """(title, measured points) per file × depth, in file then depth order."""
    out = []
    for run in runs:
        measured = [p for p in ordered(run.results) if p["status"] == "ok"]
        for depth in sorted({p["depth"] for p in measured}):
            head = f"{run.results.workload.get('preset')} · depth {depth}"
            out.append((f"{run.label} · {head}" if run.label else head,
                        [p for p in measured if p["depth"] == depth]))
    return out


def _figure(runs: list[SpecRun], what: str, draw: Callable[[Axes, list[dict]], None]) -> Figure:
    """A grid of panels, `draw(ax, points)` filling each; titled with what and the adapter."""
    panels = _panels(runs)
    n = max(len(panels), 1)
    ncols = min(n, 3)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4.5 * nrows), squeeze=False,
                             layout="constrained")
    for ax, (name, pts) in zip(axes.flat, panels, strict=False):
        ax.set_title(name, fontsize=9)
        ax.grid(True, alpha=0.3)
        draw(ax, pts)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if not panels:
        axes.flat[0].set_visible(True)
        axes.flat[0].text(0.5, 0.5, "no measured points", ha="center", va="center",
                          transform=axes.flat[0].transAxes)
    adapters = dict.fromkeys(str(r.results.environment.get("wgpu", {}).get("adapter") or "no adapter")
                             for r in runs)
    fig.suptitle(f"{what}\n{' | '.join(adapters)}", fontsize=10)
    return fig


def ms_per_token(runs: list[SpecRun]) -> Figure:
    """ms per generated token against the acceptance measured (drafts accepted per verify
    over the K-1 drafts a verify checks: 0 for `zero`, 1 for `full`), a line per backend × K;
    dotted in the backend's colour: its one-token decode's ms per token, the figure the loop
    has to beat; dash-dotted, where the page read ids: the same decode chained on the
    device (``plain_chained_ms_per_token``), the fairer one."""
    colours = _colours(runs)

    def draw(ax: Axes, pts: list[dict]) -> None:
        backends = list(dict.fromkeys(p["backend"] for p in pts))
        ks = sorted({p["k"] for p in pts})
        for b in backends:
            for i, k in enumerate(ks):
                line = sorted((p["mean_accepted"] / max(k - 1, 1), p["ms_per_token"],
                               p["acceptance"])
                              for p in pts if p["backend"] == b and p["k"] == k
                              and p.get("mean_accepted") is not None
                              and p.get("ms_per_token") is not None)
                if not line:
                    continue
                xs, ys, names = zip(*line, strict=True)
                ax.plot(xs, ys, color=colours[b], linestyle=LINESTYLES[i % len(LINESTYLES)],
                        marker=MARKERS[i % len(MARKERS)], label=f"{b} K={k}")
                for x, y, name in line:
                    ax.annotate(name, (x, y), textcoords="offset points", xytext=(3, 3),
                                fontsize=6, color=colours[b])
            plain = [p["plain_ms_per_token"] for p in pts
                     if p["backend"] == b and p.get("plain_ms_per_token") is not None]
            if plain:
                ax.axhline(statistics.median(plain), color=colours[b], linestyle=":",
                           linewidth=1.2, label=f"{b} one-token decode")
            chained = [p["plain_chained_ms_per_token"] for p in pts if p["backend"] == b
                       and p.get("plain_chained_ms_per_token") is not None]
            if chained:  # the fairer baseline where the page read ids
                ax.axhline(statistics.median(chained), color=colours[b], linestyle="-.",
                           linewidth=1.0, label=f"{b} one-token decode, chained")
        ax.set_xlabel("acceptance measured (drafts accepted per verify ÷ the K−1 drafted)")
        ax.set_ylabel("ms per generated token")
        ax.set_ylim(bottom=0)

    return _figure(runs, "ms per token vs acceptance (dotted: one-token decode, dash-dot: "
                         "chained)",
                   draw)


def verify_ratio(runs: list[SpecRun]) -> Figure:
    """The K-token verify over the one-token step against K, a line per backend (the median
    over acceptances; dashed: the same by GPU time, where recorded); grey: 1 (a verify as
    cheap as one step) and K (as dear as K steps)."""
    colours = _colours(runs)

    def draw(ax: Axes, pts: list[dict]) -> None:
        ks = sorted({p["k"] for p in pts})
        for b in dict.fromkeys(p["backend"] for p in pts):
            for field, style, marker, what in (("verify_over_plain", "-", "o", "wall"),
                                               ("verify_over_plain_gpu", "--", "s", "GPU")):
                line = [(k, statistics.median(vs)) for k in ks
                        if (vs := [p[field] for p in pts if p["backend"] == b and p["k"] == k
                                   and p.get(field) is not None])]
                if line:
                    ax.plot(*zip(*line, strict=True), color=colours[b], linestyle=style,
                            marker=marker, markerfacecolor="white" if what == "GPU" else None,
                            label=f"{b} ({what})")
        if ks:
            ax.plot(ks, ks, color="grey", linestyle=":", linewidth=0.8, marker="_",
                    markersize=14, label="K one-token steps")
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
            ax.set_xticks(ks)
        ax.set_xlabel("draft length K (tokens a verify)")
        ax.set_ylabel("verify time ÷ one-token step (×)")
        ax.set_ylim(bottom=0)

    return _figure(runs, "K-token verify over the one-token step vs K (median over acceptances)",
                   draw)


CHARTS = {"spec_ms_per_token": ms_per_token, "spec_verify_ratio": verify_ratio}


def write_all(runs: list[SpecRun], out_dir: Path) -> dict[str, dict[str, Path]]:
    """Every chart as PNG and SVG under `out_dir`; returns {chart: {format: path}}."""
    return write_charts(CHARTS, runs, out_dir)
