"""`statebench run`: sweep backends × contexts, save the results, print the table."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import TYPE_CHECKING

from harness import sweep_args
from harness.commands import common_args
from harness.commands.base import Command
from harness.commands.common_args import parse_pairs
from harness.commands.generate import parse_prompt, token_diff
from model.errors import UserError

if TYPE_CHECKING:
    from harness.model_run import UserModel
    from harness.results import ResultsFile
    from harness.runner import RunConfig


def greedy_check(user: UserModel, args, err_console) -> bool:
    """--expect-tokens: the reference's greedy tokens after --prompt; True (and one line
    said) where they are not the expected ones."""
    from harness.greedy import generate
    from harness.model_run import REFERENCE, REFERENCE_BACKEND

    want = parse_prompt(args.expect_tokens, "--expect-tokens")
    got = generate(user, parse_prompt(args.prompt), len(want), REFERENCE_BACKEND,
                   "--expect-tokens")
    diff = token_diff(got, want)
    if diff:
        err_console.print(f"statebench: the reference ({REFERENCE}): {diff}; nothing measured",
                          markup=False, highlight=False, soft_wrap=True)
    return bool(diff)


class Run(Command):
    name = "run"
    help = "decode N tokens at each depth with each backend"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        common_args.add_preset(p, or_model=True)
        p.add_argument("--model", default=None,
                       help="a model statebench did not write, in place of --preset: an .onnx "
                            "file, or a folder holding model.onnx or decode.onnx")
        p.add_argument("--pairs", default=None,
                       help="with --model: cache pairs named by hand, INPUT=OUTPUT,... (where "
                            "no naming rule matches)")
        p.add_argument("--prompt", default=None,
                       help="with --model and --expect-tokens: token ids, comma-separated")
        p.add_argument("--expect-tokens", default=None,
                       help="with --model: the greedy tokens the reference (ORT CPU) must give "
                            "after --prompt, checked before the sweep; exit 1 where they differ")
        common_args.add_backends(p)
        p.add_argument("--contexts", default=sweep_args.DEFAULT_CONTEXTS,
                       help=f"comma list of depths L to decode at (default {sweep_args.DEFAULT_CONTEXTS})")
        p.add_argument("--steps", type=common_args.positive_int, default=16,
                       help="timed decode steps per point (default 16)")
        p.add_argument("--warmup", type=common_args.nonnegative_int, default=2,
                       help="untimed steps before timing (default 2)")
        p.add_argument("--warm-s", type=common_args.nonnegative_float, default=sweep_args.DEFAULT_WARM_S,
                       help="seconds of continuous GPU load (a streaming kernel) before each"
                            " GPU point's warm-up steps, so the GPU's clocks are up for every"
                            f" backend alike (default {sweep_args.DEFAULT_WARM_S:g}; nothing runs on"
                            " a CPU adapter)")
        p.add_argument("--repeat", type=common_args.repeat_count, default=1,
                       help="measure each point in N fresh worker processes, taken in turns"
                            " over the backends; the interval of the median then takes in the"
                            " spread between processes (default 1; 3 or more for an ordering;"
                            f" at most {common_args.MAX_REPEAT})")
        p.add_argument("--capacity", type=common_args.positive_int, default=None,
                       help="fixed cache capacity (default: context + warmup + steps)")
        p.add_argument("--seed", type=int, default=0, help="weights and token seed (default 0)")
        p.add_argument("--out", default=None,
                       help="results file, in a directory that exists (default "
                            "results/run-<preset>-<time>-<pid>.json); never an existing file "
                            "unless --force")
        p.add_argument("--force", action="store_true",
                       help="replace an existing --out file (at the first point measured)")
        p.add_argument("--inprocess", action="store_true",
                       help="measure in this process instead of a worker per point (debugging)")
        p.add_argument("--point-timeout", type=common_args.positive_int,
                       default=int(sweep_args.WORKER_TIMEOUT_S),
                       help="seconds one backend x context point may take before it is recorded as"
                            f" failed (default {int(sweep_args.WORKER_TIMEOUT_S)})")
        p.add_argument("--kernel-option", action="append", default=[], metavar="KEY=VALUE",
                       help="a KernelOptions knob of the wgpu:* pages (e.g. q4_gemv=multi; "
                            "backends/webnn/wgpu_impl/options.py), recorded per point in "
                            "details.kernel_options; repeatable; other backends ignore it")
        p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                       help="skip the bandwidth calibration (no floors or MBU)")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        model_flags = [f for f, v in (("--pairs", args.pairs), ("--prompt", args.prompt),
                                      ("--expect-tokens", args.expect_tokens)) if v is not None]
        common_args.refuse_two_workloads(args)
        if args.model is None and model_flags:
            raise UserError(f"{model_flags[0]} needs --model")
        if (args.prompt is None) != (args.expect_tokens is None):
            raise UserError("--prompt and --expect-tokens go together")
        # what a sweep runs is loaded only now (ONNX, the WebNN compiler): the parser is light
        from backends.base import select
        from backends.webnn.wgpu_impl.options import KernelOptions
        from harness import runner
        from harness.model_run import UserModel
        from harness.results import ResultsFile
        from model.checksum import check_cache_dir
        from model.workload import default_cache_dir, preset

        try:  # every knob checked before anything slow, parsed once: the pages get this record
            options = KernelOptions.parse(args.kernel_option) if args.kernel_option else None
        except ValueError as exc:
            raise UserError(f"--kernel-option: {exc}") from None
        name, user = args.preset or "small", None
        if args.model is None:
            preset(name)  # validate before anything slow
        else:
            user = UserModel.load(args.model, parse_pairs(args.pairs))
            name = f"model-{user.name}"
        rc = runner.RunConfig(
            preset=name, model=args.model, pairs=parse_pairs(args.pairs),
            backends=select(args.backends),
            contexts=runner.parse_contexts(args.contexts), steps=args.steps, warmup=args.warmup,
            warm_s=args.warm_s, repeat=args.repeat,
            capacity=args.capacity, seed=args.seed, inprocess=args.inprocess,
            calibrate=args.calibrate, timeout_s=float(args.point_timeout),
            command=cls.command_line(), kernel_options=options,
        )
        common_args.check_sweep_size(len(rc.backends), len(rc.contexts), rc.repeat)
        if user is None:  # a preset's weights and graphs live in the cache; a --model's do not
            check_cache_dir(default_cache_dir())
        # a given --out is held from here to the end (a default name is this run's own)
        with common_args.claimed_out(args.out, args.force) if args.out else nullcontext():
            if user is not None and args.expect_tokens is not None:
                # the sweep's positions first: a context beyond the model is refused before this
                user.check_positions(max(rc.contexts) + rc.warmup + rc.steps - 1)
                if greedy_check(user, args, err_console):
                    return 1
            out = ResultsFile(args.out or runner.default_out(name), force=args.force,
                              make_parent=not args.out)
            return cls.run(rc, out, console, err_console)

    @classmethod
    def run(cls, rc: RunConfig, sink: ResultsFile, console, err_console) -> int:
        from harness import report, runner

        out = sink.path
        try:
            results = runner.run_sweep(rc, sink, console=err_console)
        except runner.Interrupted as exc:
            err_console.print(f"statebench: {exc.message}", markup=False, highlight=False,
                              soft_wrap=True)
            return exc.status
        console.print(report.summary(report.label_runs([results])))
        # paths are read back by scripts: never wrapped, whatever the terminal's width
        console.print(f"results: {out}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"report:  statebench report {out} --out {out.with_suffix('')}-report",
                      markup=False, highlight=False, soft_wrap=True)
        return 0
