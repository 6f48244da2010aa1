"""scripts/real_export.py --summary, as scripts/gpu_real_exports.sh prints a call's points: a
run file's and a speculative file's points one line each, read from the recorded files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "results/h100/2026-12-05-5bde1d9/call2/graph-d512.json"
SPEC = ROOT / "results/h100/2026-12-05-5bde1d9/call3/spec-llama-1b_q4f16-d8192.json"


def test_a_line_a_point_for_run_and_speculative_files():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/real_export.py"), "--summary",
                           str(RUN), str(SPEC)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    run, spec = (json.loads(f.read_text())["points"] for f in (RUN, SPEC))
    assert len(lines) == len(run) + len(spec)
    for line, p in zip(lines, run, strict=False):
        assert p["backend"] in line and f"{p['step_ms']['median']:.3f} ms" in line
    for line, p in zip(lines[len(run):], spec, strict=True):
        assert f"K={p['k']} {p['acceptance']}" in line
        assert f"{p['ms_per_token']:.3f} ms/token" in line and line.endswith("ok")
