"""`statebench backends`: every backend, whether it can run here, and why not; wgpu's adapter
and the backend API it runs on (a warning where that is OpenGL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from harness.commands.base import Command

if TYPE_CHECKING:
    from harness.wgpu_probe import WgpuProbe


class Backends(Command):
    name = "backends"
    help = "list backends and whether each is available here"

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        from harness.wgpu_probe import probe_wgpu

        probe = probe_wgpu()  # in a child: a driver that aborts must not end this listing
        console.print(cls.table(probe))
        console.print(cls.adapter_line(probe), markup=False, highlight=False, soft_wrap=True)
        if probe.warning:
            err_console.print(f"statebench: warning: {probe.warning}", markup=False,
                              highlight=False, soft_wrap=True)
        return 0

    @staticmethod
    def adapter_line(probe: WgpuProbe) -> str:
        ok, why = probe.available
        if not ok:
            return f"wgpu adapter: none ({why})"
        return f"wgpu adapter: {probe.adapter['adapter']}; backend API: {probe.backend_type}"

    @staticmethod
    def availability(probe: WgpuProbe) -> list[tuple[str, bool, str, str, str]]:
        """(name, available, why not, what it is, the engine and backend API it runs on); a
        backend that asks wgpu for an adapter is asked only where the child found one."""
        from backends.base import registry

        rows = []
        for name, klass in sorted(registry().items()):
            refused = probe.refuses(klass)
            if refused:
                ok, why = False, refused
            else:
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
    def table(cls, probe: WgpuProbe) -> Table:
        t = Table(title="statebench backends")
        t.add_column("backend", style="bold")
        t.add_column("available")
        t.add_column("runs on")
        t.add_column("why not / what it is")
        rows = cls.availability(probe)
        for name, ok, why, doc, engine in rows:
            t.add_row(name, "[green]yes[/]" if ok else "[red]no[/]", engine, doc if ok else why)
        if not rows:
            t.add_row("(none registered)", "", "", "")
        return t
