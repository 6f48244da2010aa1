"""Flags shared by subcommands and their parsers (asv's common_args)."""

from __future__ import annotations

import argparse

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


def add_preset(parser: argparse.ArgumentParser, default: str = "small",
               or_model: bool = False) -> None:
    """--preset; ``or_model``: the flag is left None when not given, so a command that also
    takes --model can tell the two apart (the default then applies without --model)."""
    from model.workload import preset_names

    parser.add_argument("--preset", default=None if or_model else default,
                        help=f"model preset: {preset_names()} (default {default})")


def check_format(fmt: str, accepted: tuple[str, ...]) -> str:
    if fmt not in accepted:
        raise UserError(f"unknown format {fmt!r}; accepted: {', '.join(accepted)}")
    return fmt


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """MODEL, the positional argument of the commands on a model statebench did not write."""
    p.add_argument("model", help="an .onnx file, or a folder holding model.onnx or decode.onnx")
