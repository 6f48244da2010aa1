"""Flags shared by subcommands and their parsers (asv's common_args)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from model.atomic import exclusive_lock, file_kind
from model.errors import UserError

DEFAULT_BACKENDS = "ort-cpu:*,wgpu:*"
#: the most --repeat takes: each repeat is a fresh worker process at every point, and the
#: median's interval over n processes narrows only as 1/sqrt(n), so past 100 (a tenth of the
#: spread between processes) more repeats cost time and buy almost nothing
MAX_REPEAT = 100
#: the most worker processes (points × repeats) one sweep starts: each loads its model
#: afresh, so a sweep past this spends hours in start-up alone (docs/results.md "Nothing lost")
MAX_POINT_PROCESSES = 10_000


def _integer(text: str, minimum: int, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < minimum:
        raise argparse.ArgumentTypeError(f"{n} is not {what}")
    return n


def positive_int(text: str) -> int:
    return _integer(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _integer(text, 0, "≥ 0")


def repeat_count(text: str) -> int:
    """--repeat: 1 to MAX_REPEAT."""
    n = positive_int(text)
    if n > MAX_REPEAT:
        raise argparse.ArgumentTypeError(
            f"{n} is more than {MAX_REPEAT}, the most a sweep takes (each repeat is a fresh "
            f"worker process at every point; past {MAX_REPEAT} the median's interval barely "
            "narrows)")
    return n


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def check_sweep_size(backends: int, contexts: int, repeat: int) -> None:
    """Refuse a sweep that would start more than MAX_POINT_PROCESSES worker processes."""
    processes = backends * contexts * repeat
    if processes > MAX_POINT_PROCESSES:
        raise UserError(
            f"{_count(backends, 'backend')} × {_count(contexts, 'context')} × --repeat {repeat}"
            f" is {processes:,} "
            f"worker processes, more than the {MAX_POINT_PROCESSES:,} a sweep may start (each "
            "loads its model afresh); use fewer repeats, backends or contexts, or several runs")


@contextlib.contextmanager
def claimed_out(path: str | os.PathLike, force: bool) -> Iterator[Path]:
    """Hold a given --out for the life of a run: refused in one line where something other
    than a regular file is there (a device, a named pipe, a socket or a symbolic link: --force
    replaces only a regular file, and model/atomic.py checks again at the rename), or where
    another run holds it (an exclusive lock beside it, released when this run ends however it
    ends): two runs never write one file, forced or not."""
    out = Path(path)
    kind = file_kind(out)
    if kind and kind != "a directory":  # a directory: the results check's own line says so
        if kind == "a symbolic link":
            kind = f"a symbolic link (to {os.readlink(out)})"
        raise UserError(f"--out {out}: {kind}, not a regular file; statebench writes results "
                        "only to a new or a regular file (--force replaces only a regular file; "
                        "name the file itself)")
    from harness.results import check_out_file  # the folder, an existing file, writable

    check_out_file(out, force)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exclusive_lock(out))
        except BlockingIOError as exc:
            holder = f" (pid {exc.holder})" if getattr(exc, "holder", "") else ""
            raise UserError(f"--out {out}: another statebench run{holder} is writing it; wait "
                            "for it to end or name another file") from None
        except OSError as exc:
            raise UserError(f"--out {out}: cannot write in {out.parent}: "
                            f"{exc.strerror or exc}") from None
        yield out


def _number(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    return x


def nonnegative_float(text: str) -> float:
    x = _number(text)
    if not (0 <= x < float("inf")):
        raise argparse.ArgumentTypeError(f"{x} is not a number ≥ 0")
    return x


def fraction(text: str) -> float:
    x = _number(text)
    if not (0 <= x < 100):
        raise argparse.ArgumentTypeError(f"{x} is not a fraction ≥ 0 (e.g. 0.25 for 25%)")
    return x


def add_backends(parser: argparse.ArgumentParser, default: str = DEFAULT_BACKENDS) -> None:
    parser.add_argument("--backends", default=default,
                        help=f"comma list of backend names or globs (default {default!r}); "
                             "see `statebench backends`")


def add_preset(parser: argparse.ArgumentParser, default: str = "small",
               or_model: bool = False) -> None:
    """--preset; ``or_model``: the flag is left None when not given, so a command that also
    takes --model can tell the two apart (the default then applies without --model)."""
    from model.workload import preset_names

    parser.add_argument("--preset", default=None if or_model else default,
                        help=f"model preset: {preset_names()} (default {default})")


def refuse_two_workloads(args: argparse.Namespace) -> None:
    """A command that takes --model in place of --preset (``add_preset(or_model=True)``)
    refuses both given, in one line."""
    if getattr(args, "model", None) is not None and args.preset is not None:
        raise UserError("--model and --preset name two workloads; give one")


def check_format(fmt: str, accepted: tuple[str, ...]) -> str:
    if fmt not in accepted:
        raise UserError(f"unknown format {fmt!r}; accepted: {', '.join(accepted)}")
    return fmt


def parse_pairs(text: str | None) -> dict[str, str]:
    """``in=out,in=out`` -> {in: out} (the --pairs flag)."""
    out: dict[str, str] = {}
    for item in filter(None, (text or "").split(",")):
        name, eq, present = item.partition("=")
        if not eq or not name.strip() or not present.strip():
            raise UserError(f"--pairs: {item!r} is not INPUT=OUTPUT")
        out[name.strip()] = present.strip()
    return out


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """MODEL, the positional argument of the commands on a model statebench did not write."""
    p.add_argument("model", help="an .onnx file, or a folder holding model.onnx or decode.onnx")
