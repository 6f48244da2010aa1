"""`statebench backends`: every backend, whether it can run here, and why not."""

from __future__ import annotations

from rich.table import Table

from backends.base import registry
from harness.commands.base import Command


class Backends(Command):
    name = "backends"
    help = "list backends and whether each is available here"

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        console.print(cls.table())
        return 0

    @staticmethod
    def availability() -> list[tuple[str, bool, str, str, str]]:
        """(name, available, why not, what it is, the engine and backend API it runs on)."""
        rows = []
        for name, klass in sorted(registry().items()):
            try:
                ok, why = klass.available()
            except Exception as exc:  # noqa: BLE001 - a broken probe is a reason, not a crash
                ok, why = False, f"{type(exc).__name__}: {exc}"
            try:
                engine = klass.runs_on() if ok else ""
            except Exception as exc:  # noqa: BLE001 - a broken probe is a reason, not a crash
                engine = f"{type(exc).__name__}: {exc}"
            doc = (klass.__doc__ or "").strip().splitlines()
            rows.append((name, bool(ok), why, doc[0] if doc else "", engine))
        return rows

    @classmethod
    def table(cls) -> Table:
        t = Table(title="statebench backends")
        t.add_column("backend", style="bold")
        t.add_column("available")
        t.add_column("runs on")
        t.add_column("why not / what it is")
        rows = cls.availability()
        for name, ok, why, doc, engine in rows:
            t.add_row(name, "[green]yes[/]" if ok else "[red]no[/]", engine, doc if ok else why)
        if not rows:
            t.add_row("(none registered)", "", "", "")
        return t
