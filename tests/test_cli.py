"""The CLI as a subprocess: bad input is one line on stderr and exit 2; a tiny sweep runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "tiny", "--backends", "ort-cpu:copy,ort-cpu:shared", "--contexts", "8,16",
        "--steps", "3", "--warmup", "1", "--warm-s", "0.1"]


def statebench(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=300)


def one_line_error(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("statebench: error: ")
    return lines[0]


@pytest.mark.parametrize("args, says", [
    (["run", "--backends", "nope:*"], "unknown backend 'nope:*'; accepted: "),
    (["run", "--preset", "huge"], "unknown preset 'huge'; accepted: tiny"),
    (["run", "--contexts", "64,abc"], "bad context 'abc'"),
    (["run", "--contexts", "0"], "contexts must be positive"),
    (["run", "--contexts", "-4"], "bad context -4"),
    (["run", "--steps", "x"], "not an integer"),
    (["run", "--warm-s", "-1"], "not a number ≥ 0"),
    (["run", "--warm-s", "nan"], "not a number ≥ 0"),
    (["run", "--preset", "tiny", "--contexts", "64", "--capacity", "10", "--backends", "ort-cpu:copy"],
     "too small"),
    (["run", "--kernel-option", "q4_gemv=nope"], "--kernel-option: KernelOptions.q4_gemv = 'nope'"),
    (["run", "--kernel-option", "q4_gemv"], "--kernel-option: option 'q4_gemv' is not KEY=VALUE"),
    (["run", "--kernel-option", "frob=1"], "--kernel-option: unknown option 'frob'"),
    (["report", "missing.json"], "no such results file"),
    (["report", "x.json", "--format", "pdf"], "unknown format 'pdf'"),
    (["gate", "a.json", "--baseline", "b.json", "--max-slowdown", "lots"], "not a number"),
    (["gate", "a.json", "--baseline", "b.json", "--max-slowdown", "-1"], "fraction"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(args, says, tmp_path):
    assert says in one_line_error(statebench(*args, cwd=tmp_path))


def test_bad_results_file(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"schema": "other"}))
    assert "not a statebench results file" in one_line_error(statebench("report", tmp_path / "x.json"))


@pytest.mark.parametrize("command", [["report"], ["gate", "--baseline", "x.json"],
                                     ["baseline", "--name", "b", "--dir", "baselines"]],
                         ids=lambda c: c[0])
def test_a_binary_results_file_is_one_line(command, tmp_path):
    (tmp_path / "x.json").write_bytes(b"\xff\xfe{\x00\"schema\x00\"" + bytes(range(256)))
    proc = statebench(command[0], "x.json", *command[1:], cwd=tmp_path)
    assert one_line_error(proc).endswith("x.json: not a results file (not UTF-8 text: "
                                         "byte 0xff at offset 0)")


def test_the_readme_byom_example_expects_the_manifests_tokens():
    """The README's bring-your-own-model line gives the prompt and greedy tokens that
    tests/models/manifest.json records for the model it names (run, it passes the check)."""
    readme = (ROOT / "README.md").read_text()
    model = re.search(r"^M=(tests/models/\S+)", readme, re.M).group(1)
    prompt, tokens = re.search(r"--prompt (\S+) --expect-tokens (\S+)", readme).groups()
    entry = next(m for m in json.loads((ROOT / "tests/models/manifest.json").read_text())["models"]
                 if m["path"] == Path(model).name)
    assert prompt == ",".join(map(str, entry["prompt"]))
    want = entry["greedy_tokens"][:len(tokens.split(","))]
    assert tokens == ",".join(map(str, want))


def test_backends_lists_availability():
    proc = statebench("backends")
    assert proc.returncode == 0
    assert "ort-cpu:copy" in proc.stdout and "yes" in proc.stdout


def test_run_tiny_sweep(tmp_path):
    proc = statebench("run", *TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = list((tmp_path / "results").glob("run-tiny-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["schema"] == "statebench/2" and len(data["points"]) == 4
    assert all(p["status"] == "ok" and p["match"]["ok"] for p in data["points"]), data["points"]
    assert data["environment"]["calibration"]["host"]["copy_gbps"] > 0
    assert all(p["mbu"] and p["floor_ms"] for p in data["points"])
    out = proc.stdout
    # the speedup over ort-cpu:copy where the intervals separate, else "no difference"
    assert "ort-cpu:shared" in out and "✓" in out and ("×" in out or "no difference" in out)
    assert "At 8, per step:" in out  # the sentences under the table
    assert f"results: results/{files[0].name}" in out
    assert "Traceback" not in proc.stderr


def test_run_pins_kernel_options(tmp_path):
    """--kernel-option reaches the WebNN page of every point (recorded in its details) and
    leaves ORT's alone; the pinned 4-bit kernel still matches the reference."""
    out = tmp_path / "q4.json"
    proc = statebench("run", "--preset", "tiny+q4", "--backends", "wgpu:stateful,ort-cpu:copy",
                      "--contexts", "8", "--steps", "2", "--warmup", "1", "--warm-s", "0",
                      "--no-calibrate", "--kernel-option", "q4_gemv=multi2_l8",
                      "--kernel-option", "gemv=rows", "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    points = {p["backend"]: p for p in json.loads(out.read_text())["points"]}
    page = points["wgpu:stateful"]
    assert page["status"] == "ok" and page["match"]["ok"], page
    assert page["details"]["kernel_options"]["q4_gemv"] == "multi2_l8"
    assert page["details"]["kernel_options"]["gemv"] == "rows"
    assert "kernel_options" not in points["ort-cpu:copy"].get("details", {})


def test_every_parser_is_built_without_the_sweep_or_its_engines():
    """Each command's ``--help`` builds its parser and exits; none of them may import what
    only a run needs (ONNX and its ``ml_dtypes``, wgpu, ORT, the backends, the runner,
    ORT's GDN engines, matplotlib): a parser's imports are paid by every command, also one
    that only refuses its arguments (``results/lavapipe/2026-12-04-cb21e50-cli-start/``)."""
    heavy = ("onnx", "ml_dtypes", "wgpu", "onnxruntime", "backends.base", "backends.webnn",
             "harness.runner", "harness.speculative.gdn_ort", "matplotlib")
    code = ("import sys\nfrom harness.cli import main\nfrom harness.commands import COMMANDS\n"
            "for c in COMMANDS:\n"
            "    try:\n        main([c.name, '--help'])\n    except SystemExit:\n        pass\n"
            f"print([m for m in {heavy!r} if m in sys.modules], file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr
