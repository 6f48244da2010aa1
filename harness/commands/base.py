"""The `Command` base every subcommand derives from (asv's `asv.commands.Command`).

A command names itself and says what it does in one line; the base makes its subparser,
lets the command add its own flags, and routes the parsed arguments to `run_from_args`.
So a command holds only its flags and its work, and `cli.main` needs no list of flags.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import ClassVar


class Command:
    """One `statebench` subcommand: `name`, `help`, its flags and what it does with them."""

    #: the word after `statebench`
    name: ClassVar[str]
    #: one line for `statebench --help` (and the top of `statebench NAME --help`)
    help: ClassVar[str]
    #: other words accepted for the same command
    aliases: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def add_parser(cls, subparsers) -> argparse.ArgumentParser:
        """Make this command's subparser: its name, aliases, help, flags and entry point."""
        p = subparsers.add_parser(cls.name, aliases=list(cls.aliases), help=cls.help,
                                  description=cls.help)
        cls.setup_arguments(p)
        p.set_defaults(func=cls.run_from_args)
        return p

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        """Add this command's own flags to its parser; a command without flags adds none."""

    @classmethod
    def run_from_args(cls, args: argparse.Namespace, console, err_console) -> int:
        """Do the command's work from parsed arguments: results on `console`, progress and
        notices on `err_console`; return the exit status."""
        raise NotImplementedError(f"{cls.__name__}.run_from_args")

    @staticmethod
    def command_line() -> str:
        """The command as typed, for the provenance a results file records."""
        return "statebench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
