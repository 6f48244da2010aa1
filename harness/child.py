"""One `python -m harness.<module>` child: a request on stdin, JSON lines back on stdout.

The runner's point workers and the wgpu adapter probe run this way so that a device or driver
that aborts the process (a Rust panic inside wgpu-native cannot unwind: SIGABRT) or hangs
takes down only the child; its exit is turned into one line of reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def run_module(module: str, request: dict | str, timeout_s: float,
               env: dict[str, str] | None = None,
               pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run `python -m module` with `request` on stdin (a dict as JSON, a string as it is:
    one JSON message, e.g. ``wire.WorkerRequest.to_json``), this checkout on its path,
    `env` added to this process's environment and `pass_fds` left open in it. Raises
    subprocess.TimeoutExpired after `timeout_s`."""
    env = {**os.environ, **(env or {})}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    text = request if isinstance(request, str) else json.dumps(request)
    return subprocess.run([sys.executable, "-m", module], input=text,
                          capture_output=True, text=True, timeout=timeout_s, env=env,
                          pass_fds=pass_fds)


def exit_reason(who: str, proc: subprocess.CompletedProcess) -> str:
    """'<who> killed by SIGABRT: <why>' or '<who> exited with status N: <why>', where why is
    a Rust panic's message when the child panicked, else its last line on stderr."""
    if proc.returncode < 0:
        why = f"{who} killed by {signal.Signals(-proc.returncode).name}"
    else:
        why = f"{who} exited with status {proc.returncode}"
    said = stderr_reason(proc.stderr)
    return f"{why}: {said}" if said else why


def stderr_reason(stderr: str) -> str:
    """The line that says why: the message after the first 'panicked at' (the Rust panic's
    own words; the last lines are a backtrace and 'aborting'), else the last non-empty line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for i, line in enumerate(lines[:-1]):
        if "panicked at" in line:
            where = line.split("panicked at", 1)[1].strip(" :")
            return f"{lines[i + 1]} (a panic at {'/'.join(where.split('/')[-3:])})"
    return lines[-1] if lines else ""
