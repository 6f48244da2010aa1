"""Stopping a statebench run part way, as a device call's time limit does (SIGTERM), once it
has saved something: the tests that check a stopped run keeps what it measured."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stop_once_saved(args: list[str], out: Path, saved: Callable[[Path], bool],
                    wait_s: float = 300) -> tuple[int, str]:
    """``python -m harness.cli *args`` sent SIGTERM as soon as ``saved(out)`` holds (``out``
    exists first): (its exit status, its stderr). Fails if the run ends before that."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and saved(out):
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr
