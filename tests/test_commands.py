"""The `Command` base: every subcommand is one, and the parser the base builds routes each
name (and alias) to that command's `run_from_args`."""

from __future__ import annotations

import pytest

from harness.cli import make_parser
from harness.commands import COMMANDS
from harness.commands.base import Command


def test_every_command_is_a_command_with_a_name_and_one_line_of_help():
    names = [c.name for c in COMMANDS] + [a for c in COMMANDS for a in c.aliases]
    assert len(set(names)) == len(names), names
    for cmd in COMMANDS:
        assert issubclass(cmd, Command), cmd
        assert cmd.name and cmd.help and "\n" not in cmd.help, cmd
        assert cmd.run_from_args.__func__ is not Command.run_from_args.__func__, cmd


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.name)
def test_the_parser_routes_each_name_to_its_command(cmd):
    parser = make_parser()
    for word in (cmd.name, *cmd.aliases):
        sub = parser._subparsers._group_actions[0].choices[word]  # noqa: SLF001 - argparse has no public way
        assert sub.get_default("func") == cmd.run_from_args, word
        assert cmd.help in sub.format_help(), word


def test_the_base_refuses_to_run():
    class Nothing(Command):
        name, help = "nothing", "does nothing"

    with pytest.raises(NotImplementedError):
        Nothing.run_from_args(None, None, None)
