"""`statebench speculative` (alias `spec`): speculative decoding, two ways.

- With ``--backends``: the end-to-end loop on the backends (docs/speculative.md): scripted
  drafts from the target's own greedy continuation, a K-token verify in one dispatch, m
  drafts accepted, the rest rolled back (``Backend.accept``), N tokens from each depth;
  tokens, logits and state checked every run; results ``statebench-spec/2``.
- Without: the per-layer rollback strategies on NumPy and ORT's CPU EP (DESIGN §8): bytes,
  time and a float64 check per GDN / attention layer shape and acceptance m
  (``statebench-spec/1``).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from rich.text import Text

from harness import results
from harness.commands import common_args
from harness.commands.base import Command
from model.errors import UserError

#: the flags of the end-to-end loop only, and of the per-layer simulation only
E2E_FLAGS = ("model", "accept", "contexts", "tokens", "warmup", "warm_s", "inprocess",
             "kernel_option", "point_timeout", "read")
LAYER_FLAGS = ("reps", "depth")


def draft_lengths(text: str) -> int | list[int]:
    """--k: one integer (the per-layer simulation's draft length, or one K), or a comma
    list of them (the loop's K's, with --backends)."""
    out = []
    for part in (p.strip() for p in str(text).split(",")):
        try:
            out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {part!r}") from None
    return out[0] if len(out) == 1 else out


class Speculative(Command):
    name = "speculative"
    aliases = ("spec",)
    help = "speculative decoding end to end (--backends), or rollback per layer"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        from harness.draft_limits import MAX_DRAFT, MAX_K

        common_args.add_preset(p, default="tiny", or_model=True)
        p.add_argument("--backends", default=None,
                       help="run the loop end to end on these backends (names or globs, "
                            "e.g. 'wgpu:stateless,wgpu:reuse,wgpu:stateful'); without it, "
                            "the per-layer simulation")
        p.add_argument("--k", type=draft_lengths, default=4,
                       help=f"tokens a verify takes: the newest token and K-1 drafts; with "
                            f"--backends a comma list, each 2..{MAX_K}; without, one draft "
                            f"length 1..{MAX_DRAFT} (ORT GatedDeltaNet's "
                            "state_update_capacity limit); default 4")
        e2e = p.add_argument_group("end to end (--backends)")
        e2e.add_argument("--model", default=None, metavar="MODEL",
                         help="a model you exported (an .onnx, or a folder with model.onnx "
                              "or decode.onnx) in place of --preset: its K-token graphs, ORT's "
                              "CPU EP its reference (docs/speculative.md)")
        e2e.add_argument("--accept", default=None,
                         help="comma list of acceptance schedules: full (every draft), zero "
                              "(none), partial (m = 0 .. K-1 in turn) or a RATE in [0, 1] "
                              "(each draft accepted with that probability, seeded); default "
                              "full,partial,zero")
        e2e.add_argument("--contexts", default=None,
                         help="comma list of depths the loop starts from (default 64)")
        e2e.add_argument("--tokens", type=common_args.positive_int, default=None,
                         help="tokens generated per point (default 32)")
        e2e.add_argument("--warmup", type=common_args.nonnegative_int, default=None,
                         help="untimed steps per graph before its points (default 2)")
        e2e.add_argument("--warm-s", type=common_args.nonnegative_float, default=None,
                         help="seconds of GPU load before each timed decode (default 2; "
                              "nothing runs on a CPU adapter)")
        e2e.add_argument("--inprocess", action="store_true", default=None,
                         help="measure in this process instead of a worker per backend and "
                              "depth (debugging)")
        e2e.add_argument("--kernel-option", action="append", default=None, metavar="KEY=VALUE",
                         help="a KernelOptions knob of the wgpu:* pages (as `run`'s); repeatable")
        e2e.add_argument("--read", choices=("logits", "ids"), default=None,
                         help="what each step reads back: logits (K rows, the host takes "
                              "their argmax; default) or ids (the wgpu pages' argmax on the "
                              "device, 8 bytes a row; the logits check is not made, other "
                              "backends' points unavailable)")
        e2e.add_argument("--point-timeout", type=common_args.positive_int, default=None,
                         help="seconds one worker (a backend at one depth) may take (default 3600)")
        layer = p.add_argument_group("per layer (no --backends)")
        layer.add_argument("--reps", type=common_args.positive_int, default=None,
                           help="timed repetitions per strategy and m; the median is "
                                "reported (default 5)")
        layer.add_argument("--depth", type=common_args.positive_int, default=None,
                           help="valid KV rows before the draft, for attention layers "
                                "(default 256)")
        p.add_argument("--seed", type=common_args.nonnegative_int, default=0,
                       help="draft inputs / acceptance draws seed (default 0)")
        p.add_argument("--out", default=None,
                       help="results file: with --backends statebench-spec/2 (default "
                            "results/spec-<preset>-<time>-<pid>.json), without it "
                            "statebench-spec/1 (default: none)")
        p.add_argument("--force", action="store_true", help="replace an existing --out file")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        if args.backends is not None:
            misplaced = [f for f in LAYER_FLAGS if getattr(args, f) is not None]
            if misplaced:
                raise UserError(f"--{misplaced[0]} is for the per-layer simulation, not "
                                "with --backends")
            from harness.speculative.e2e_command import run_e2e

            return run_e2e(args, cls.command_line(), console, err_console)
        misplaced = [f for f in E2E_FLAGS if getattr(args, f) is not None]
        if misplaced:
            raise UserError(f"--{misplaced[0].replace('_', '-')} needs --backends (the loop "
                            "end to end)")
        if isinstance(args.k, list):
            raise UserError(f"--k {','.join(map(str, args.k))}: without --backends one draft "
                            "length")
        k = args.k
        args.preset = args.preset or "tiny"
        reps = 5 if args.reps is None else args.reps
        depth = 256 if args.depth is None else args.depth
        from harness import speculative

        # everything the run could refuse is refused before anything slow or large
        speculative.check_args(args.preset, k, reps, depth)
        out = results.check_out_file(args.out, args.force) if args.out else None
        data = cls.run(args.preset, k, reps, depth, args.seed)
        for table in speculative.tables(data):
            console.print(table)
        for line in speculative.notes(data):
            console.print(Text(line, style="red" if line.startswith("✗") else "yellow"))
        if out:
            try:
                results.write_json_atomic(out, data)
            except OSError as exc:
                raise UserError(f"could not save {out}: {exc.strerror or exc}; the tables above "
                                "are all that is kept of this run") from None
            console.print(f"results: {out}", markup=False, highlight=False, soft_wrap=True)
        return 0

    @classmethod
    def run(cls, preset: str, k: int, reps: int = 5, depth: int = 256, seed: int = 0) -> dict:
        from harness import speculative
        from harness.calibrate import environment

        data = speculative.measure(preset, k, reps, depth, seed)
        return {"schema": data.pop("schema"),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": cls.command_line(),
                "environment": environment(), **data}

