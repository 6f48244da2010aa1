"""`statebench`: one module per subcommand in `harness.commands`; user errors caught here only.

A `UserError` (bad backend, preset, context list, threshold, results file) prints one line on
stderr and exits 2, without a traceback. Commands return their exit status; the gate returns 1
for a regression.
"""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console

from harness.commands import COMMANDS
from model.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """argparse's own errors become UserErrors too: one line, exit 2."""

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message}")


def make_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="statebench",
        description="Decode-step benchmark for stateful ML graphs (WebNN useStateful/kvCachePairs) "
                    "on wgpu and ONNX Runtime.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for cmd in COMMANDS:
        cmd.add_parser(sub)
    return parser


def _stdout_console() -> Console:
    """Piped or redirected output gets a wide table instead of rich's default 80 columns."""
    c = Console()
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(width=200)
    return c


def main(argv: list[str] | None = None, console: Console | None = None,
         err_console: Console | None = None) -> int:
    err = err_console or Console(stderr=True)
    out = console or _stdout_console()
    try:
        parser = make_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args, out, err) or 0)
    except UserError as exc:
        err.print(f"statebench: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("statebench: interrupted", markup=False, highlight=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
