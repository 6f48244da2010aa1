"""`statebench speculative --backends ...`: the end-to-end loop's flags checked (bad input:
one line, exit 2, before anything slow), the sweep run, the table printed."""

from __future__ import annotations

import argparse
import os
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path

from backends.base import Backend, select
from harness.commands import common_args
from harness.draft_limits import MAX_K
from harness.speculative import e2e_render
from harness.speculative.acceptance import parse_acceptances
from harness.speculative.e2e_sweep import SpecConfig, Sweep, header, run
from model.errors import UserError

DEFAULT_PRESET = "tiny"
DEFAULT_ACCEPT = "full,partial,zero"
DEFAULT_CONTEXTS = "64"
DEFAULT_TOKENS = 32


def parse_ks(given: int | list[int]) -> list[int]:
    """``--k 4,8`` (parsed: [4, 8]) checked: each 2 .. MAX_K (a verify needs at least one
    draft), each once."""
    out: list[int] = []
    for k in [given] if isinstance(given, int) else given:
        if not 2 <= k <= MAX_K:
            raise UserError(f"--k {k}: a verify takes the newest token and K-1 drafts, so K "
                            f"is 2..{MAX_K}")
        if k not in out:
            out.append(k)
    return out


def default_out(preset_name: str) -> Path:
    """results/spec-<preset>-<date>-<time>.<µs>-<pid>.json: never another run's name."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S.%f")
    return Path("results") / f"spec-{preset_name}-{stamp}-{os.getpid()}.json"


def config_from(args: argparse.Namespace, command: str) -> SpecConfig:
    """The sweep's settings from the flags, every one checked."""
    from harness.runner import DEFAULT_WARM_S, parse_contexts
    from model.workload import preset

    common_args.refuse_two_workloads(args)
    name = args.preset or DEFAULT_PRESET
    if args.model is None:
        preset(name)  # an unknown preset: its one line
    options = None
    if args.kernel_option:
        from backends.webnn.wgpu_impl.options import KernelOptions

        try:
            options = KernelOptions.parse(args.kernel_option).as_dict()
        except ValueError as exc:
            raise UserError(f"--kernel-option: {exc}") from None
    return SpecConfig(
        preset=name, backends=select(args.backends), ks=parse_ks(args.k),
        acceptances=parse_acceptances(args.accept or DEFAULT_ACCEPT),
        contexts=parse_contexts(args.contexts or DEFAULT_CONTEXTS),
        tokens=args.tokens or DEFAULT_TOKENS,
        warmup=2 if args.warmup is None else args.warmup,
        warm_s=DEFAULT_WARM_S if args.warm_s is None else args.warm_s,
        seed=args.seed, inprocess=bool(args.inprocess),
        timeout_s=float(args.point_timeout or 3600), command=command, options=options,
        model=args.model, read=args.read or "logits")


def refusals(classes: dict[str, type[Backend]]) -> tuple[dict[str, str], dict | None]:
    """Backends the wgpu adapter probe (in a child) refuses, with why; its adapter record
    (None where no backend asks for an adapter)."""
    if not any(c.uses_wgpu_adapter for c in classes.values()):
        return {}, None
    from harness.wgpu_probe import probe_wgpu

    probe = probe_wgpu(None)
    return {n: probe.refuses(c) for n, c in classes.items() if probe.refuses(c)}, probe.adapter


def run_e2e(args: argparse.Namespace, command: str, console, err_console) -> int:
    from harness.calibrate import environment
    from harness.runner import resolve_backends, stopped_by, terminate_as_interrupt
    from harness.sources import source_for
    from model.checksum import check_cache_dir
    from model.workload import default_cache_dir

    cfg = config_from(args, command)
    source = source_for(cfg.preset, cfg.model, seed=cfg.seed)
    if cfg.model is not None:
        cfg.preset = source.label  # the model's name, where a preset's would be
    top = max(cfg.contexts)
    source.check_memory(cfg.capacity_for(top), top + 1, cfg.greedy_tokens, top)
    source.check_positions(cfg.capacity_for(top) - 1)
    classes = resolve_backends(cfg.backends)
    check_cache_dir(default_cache_dir())
    with common_args.claimed_out(args.out, args.force) if args.out else nullcontext():
        out = Path(args.out) if args.out else default_out(cfg.preset)
        if not args.out:
            out.parent.mkdir(parents=True, exist_ok=True)
        refused, adapter = refusals(classes)
        results = header(cfg, source.workload(), environment({}, adapter), source)

        def said(name: str, depth: int, points: list[dict]) -> None:
            ok = sum(p["status"] == "ok" for p in points)
            err_console.print(f"{name} @ d{depth}: {ok}/{len(points)} points measured",
                              markup=False, highlight=False)

        def progress(line: str) -> None:
            err_console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)

        with terminate_as_interrupt() as caught:
            try:
                run(cfg, Sweep(classes, refused, out=out, on_group=said, say=progress,
                               source=source), results)
            except KeyboardInterrupt:
                how, status = stopped_by(caught)
                err_console.print(f"statebench: {how}; {len(results.points)} points kept in "
                                  f"{out}", markup=False, highlight=False, soft_wrap=True)
                return status
    console.print(e2e_render.table(results))
    for line in e2e_render.notes(results):
        console.print(line, style="red" if line.startswith("✗") else "yellow",
                      markup=False, highlight=False, soft_wrap=True)
    console.print(f"results: {out}", markup=False, highlight=False, soft_wrap=True)
    return 0
