"""`statebench prefill --preset P --backends B --chunks 1,16,64 --contexts 512,8192 [--out FILE]`:
time to depth through the decode graph, K tokens a dispatch (``harness.prefill``), a table
(ms to depth, tokens/s, GPU ms, the check) and a ``statebench-prefill/1`` JSON file."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from datetime import UTC, datetime

from rich.table import Table
from rich.text import Text

from harness import prefill, results
from harness.commands import common_args
from harness.commands.base import Command
from harness.sweep_args import parse_contexts
from model.errors import UserError
from model.workload import preset

CAPTION = ("ms to depth: the median wall time of the prefills from an empty cache (min–max) · "
           "GPU ms: the dispatches' own\n"
           "how: dispatched (reach_depth, the last chunk's logits read) or stepped (every "
           "chunk's read) · ✓ the next K tokens' logits match the reference's")


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}" if x >= 10 else f"{x:.3f}"


def table(data: dict) -> Table:
    """A row per point, as measured."""
    t = Table(title=f"statebench prefill · {data['workload'].get('preset')}", caption=CAPTION)
    for col in ("backend", "context", "K", "dispatches", "ms to depth", "tokens/s", "GPU ms",
                "how", "check"):
        t.add_column(col, justify="left" if col in ("backend", "how") else "right",
                     no_wrap=True)
    for p in data["points"]:
        if p["wall_ms"] is None:
            t.add_row(p["backend"], str(p["context"]), str(p["chunk"]), str(p["dispatches"]),
                      f"[dim]{p['status']}[/]", "", "", p["how"], "")
            continue
        lo, hi = min(p["wall_samples_ms"]), max(p["wall_samples_ms"])
        mark = "[green]✓[/]" if p["status"] == "ok" else "[red]✗[/]"
        t.add_row(p["backend"], str(p["context"]), str(p["chunk"]), str(p["dispatches"]),
                  f"{_ms(p['wall_ms'])} ({_ms(lo)}–{_ms(hi)})", f"{p['tokens_per_s']:,.0f}",
                  _ms(p["gpu_ms"]), p["how"], mark)
    return t


def notes(data: dict) -> list[str]:
    """One line per point that did not run or failed its check."""
    mark = {"failed": "✗", "unavailable": "–"}
    return [f"{mark.get(p['status'], '?')} {p['backend']} K={p['chunk']} at {p['context']}: "
            f"{p['status']}: {p['reason']}" for p in data["points"] if p["status"] != "ok"]


class Prefill(Command):
    name = "prefill"
    help = "time to depth by chunked prefill through the decode graph"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        common_args.add_preset(p, default="tiny", or_model=True)
        p.add_argument("--model", default=None, metavar="MODEL",
                       help="a model you exported (an .onnx, or a folder with model.onnx or "
                            "decode.onnx) in place of --preset: its K-token graphs, ORT's CPU "
                            "EP its reference")
        common_args.add_backends(p, default="wgpu:stateful")
        p.add_argument("--chunks", default=prefill.DEFAULT_CHUNKS,
                       help=f"tokens a dispatch, K (comma list, 1..{prefill.MAX_CHUNK}; "
                            f"default {prefill.DEFAULT_CHUNKS})")
        p.add_argument("--contexts", default=prefill.DEFAULT_CONTEXTS,
                       help="depths to reach, each a multiple of every K (default "
                            f"{prefill.DEFAULT_CONTEXTS})")
        p.add_argument("--reps", type=common_args.repeat_count, default=3,
                       help="timed prefills per point; the median is reported (default 3)")
        p.add_argument("--seed", type=common_args.nonnegative_int, default=0,
                       help="weights and tokens seed (default 0)")
        p.add_argument("--out", default=None,
                       help=f"write the results as JSON ({prefill.SCHEMA})")
        p.add_argument("--force", action="store_true", help="replace an existing --out file")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        from backends.base import select

        # everything the run could refuse is refused before anything slow or large
        common_args.refuse_two_workloads(args)
        args.preset = args.preset or "tiny"
        if args.model is None:
            preset(args.preset)
        backends = select(args.backends)
        chunks = prefill.parse_chunks(args.chunks)
        contexts = parse_contexts(args.contexts)
        prefill.check_multiples(contexts, chunks)
        from harness.runner import stopped_by, terminate_as_interrupt  # only when it runs

        head = {"created": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": cls.command_line(), "environment": cls._environment()}
        kept: list[dict] = []  # the body so far, saved after each point

        def data_of(body: dict, complete: bool) -> dict:
            body = dict(body)
            return {"schema": body.pop("schema"), **head, **body, "complete": complete}

        with common_args.claimed_out(args.out, args.force) if args.out else nullcontext():
            def progress(p: prefill.PrefillPoint, body: dict) -> None:
                what = (f"{p.wall_ms:.1f} ms" if p.wall_ms is not None else p.status)
                err_console.print(f"prefill: {p.backend} K={p.chunk} at {p.context}: {what}",
                                  markup=False, highlight=False)
                kept[:] = [body]
                if args.out:
                    _save(args.out, data_of(body, complete=False))

            with terminate_as_interrupt() as caught:
                try:
                    body = prefill.measure(args.preset, backends, chunks, contexts, args.reps,
                                           args.seed, progress, args.model)
                except KeyboardInterrupt:
                    how, status = stopped_by(caught)
                    n = len(kept[0]["points"]) if kept else 0
                    where = f" in {args.out}" if args.out and kept else ""
                    err_console.print(f"statebench: {how}; {n} points kept{where}",
                                      markup=False, highlight=False, soft_wrap=True)
                    return status
            data = data_of(body, complete=True)
            console.print(table(data))
            for line in notes(data):
                console.print(Text(line, style="red" if line.startswith("✗") else "yellow"))
            if args.out:
                _save(args.out, data)
                console.print(f"results: {args.out}", markup=False, highlight=False,
                              soft_wrap=True)
        return 1 if any(p["status"] == "failed" for p in data["points"]) else 0

    @staticmethod
    def _environment() -> dict:
        from harness.calibrate import environment

        return environment()


def _save(out: str, data: dict) -> None:
    """``data`` written to ``out`` whole or not at all; a failed write is one line."""
    try:
        results.write_json_atomic(out, data)
    except OSError as exc:
        raise UserError(f"could not save {out}: {exc.strerror or exc}; the progress lines are "
                        "all that is kept of this run") from None
