"""scripts/gpu_sweep.sh, the script the recorded H200 runs come from, run as is on this
machine's adapter for one tiny point: it writes its results under a file name the H200
machine sends back (no '+': `tiny+f16kv` -> `tiny_f16kv.json`) and prints the summary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sweep_script_writes_safe_names(tmp_path):
    pytest.importorskip("wgpu")
    # a copy of the scripts away from the checkout's .whl/ and .gl/ (this machine's wheels
    # are for the H200's Python), run against the checkout's packages
    (tmp_path / "scripts").mkdir()
    for name in ("gpu_sweep.sh", "gpu_env.sh"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT),
               STATEBENCH_GPU_BACKENDS="wgpu:stateful", STATEBENCH_GPU_CONTEXTS="16",
               STATEBENCH_GPU_STEPS="2", STATEBENCH_GPU_REPEAT="2", STATEBENCH_GPU_REPORT="0",
               STATEBENCH_GPU_TARBALL=str(tmp_path / "out.tgz"))
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_sweep.sh"), str(out),
                           "tiny+f16kv"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert "tiny_f16kv.json" in files and not any("+" in f for f in files), files
    with tarfile.open(tmp_path / "out.tgz") as tar:  # the whole folder, in one file
        assert sorted(Path(n).name for n in tar.getnames() if n != ".") == files
    point = json.loads((out / "tiny_f16kv.json").read_text())["points"][0]
    if point["status"] == "unavailable" or "has no 'shader-f16'" in (point["reason"] or ""):
        pytest.skip(f"the wgpu point cannot run here: {point['reason']}")
    assert point["backend"] == "wgpu:stateful" and point["match"]["ok"], point
    assert len(point["repeats"]) == 2  # the script's --repeat reaches the run
    assert "# statebench report" in done.stdout
