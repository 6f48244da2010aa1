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
import threading
from collections.abc import Callable
from pathlib import Path


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, `extra` added, with this checkout on PYTHONPATH."""
    env = {**os.environ, **(extra or {})}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run_module(module: str, request: dict | str, timeout_s: float,
               env: dict[str, str] | None = None,
               pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run `python -m module` with `request` on stdin (a dict as JSON, a string as it is:
    one JSON message, e.g. ``wire.WorkerRequest.to_json``), this checkout on its path,
    `env` added to this process's environment and `pass_fds` left open in it. Raises
    subprocess.TimeoutExpired after `timeout_s`."""
    env = child_env(env)
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


def stream_module(module: str, request: str, timeout_s: float,
                  on_line: Callable[[str], None],
                  on_stderr: Callable[[str], None] | None = None) -> tuple[int, str]:
    """`python -m module` as `run_module`, each stdout line handed to `on_line` as it comes
    (a long worker's results kept as they are made) and each stderr line to `on_stderr`;
    returns (exit status, all of stderr). Raises subprocess.TimeoutExpired after `timeout_s`
    (the child killed first), and kills the child on any exception (an interrupt)."""
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    err: list[str] = []

    def drain_stderr() -> None:
        for line in proc.stderr:
            err.append(line)
            if on_stderr:
                on_stderr(line.rstrip("\n"))

    reader = threading.Thread(target=drain_stderr, daemon=True)
    reader.start()
    fired: list[bool] = []

    def expire() -> None:
        fired.append(True)
        proc.kill()

    timer = threading.Timer(timeout_s, expire)
    timer.start()
    try:
        proc.stdin.write(request)
        proc.stdin.close()
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        status = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
    if fired:
        raise subprocess.TimeoutExpired(module, timeout_s, stderr="".join(err))
    return status, "".join(err)
