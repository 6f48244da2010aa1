"""Flags shared by subcommands and their parsers (asv's common_args)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from model.errors import UserError

DEFAULT_BACKENDS = "ort-cpu:*,wgpu:*"


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


def add_preset(parser: argparse.ArgumentParser, default: str = "small") -> None:
    from model.workload import preset_names

    parser.add_argument("--preset", default=default,
                        help=f"model preset: {preset_names()} (default {default})")


def check_format(fmt: str, accepted: tuple[str, ...]) -> str:
    if fmt not in accepted:
        raise UserError(f"unknown format {fmt!r}; accepted: {', '.join(accepted)}")
    return fmt


def check_out_file(path: str | Path, force: bool = False) -> Path:
    """Refuse an --out that cannot take the file, before anything is measured: a folder, a
    folder that does not exist or where no file can be made, or an existing file (unless
    `force`). The probe makes and removes a file beside the target, as the atomic save does."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; name a file")
    folder = out.parent
    if not folder.is_dir():
        raise UserError(f"--out {out}: the folder {folder} does not exist")
    if out.exists() and not force:
        raise UserError(f"--out {out}: the file exists; pass --force to replace it")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write in {folder}: {exc.strerror or exc}") from None
    return out
