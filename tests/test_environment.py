"""Where the wgpu backends run: on a native backend API where one can be had, and never at
the mercy of a driver that aborts the process asking it for an adapter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.child import stderr_reason
from harness.wgpu_probe import NATIVE_BACKEND_TYPES, probe_wgpu

ROOT = Path(__file__).resolve().parents[1]
#: Mesa's GL driver with this GLSL version panics inside wgpu-native while wgpu enumerates
#: adapters (SIGABRT): the crash the sweep and `statebench backends` must survive
CRASHING_DRIVER = {"MESA_GL_VERSION_OVERRIDE": "4.3", "MESA_GLSL_VERSION_OVERRIDE": "110"}


def apt_candidate(policy: str) -> tuple[str, str]:
    """(installed, candidate) versions from `apt-cache policy PACKAGE`; "(none)" for none."""
    got = {"Installed": "(none)", "Candidate": "(none)"}
    for line in policy.splitlines():
        key, _, value = line.strip().partition(":")
        if key in got and value.strip():
            got[key] = value.strip()
    return got["Installed"], got["Candidate"]


def vulkan_driver_installable() -> tuple[bool, str]:
    """(True, "") where statebench.sh could install lavapipe here (root, apt, a candidate
    for mesa-vulkan-drivers that is not installed), else (False, why that is not so)."""
    if not shutil.which("apt-cache"):
        return False, "no apt-cache here: whether a Vulkan driver is installable is unknown"
    if os.geteuid() != 0:
        return False, "not root: statebench.sh cannot install mesa-vulkan-drivers"
    proc = subprocess.run(["apt-cache", "policy", "mesa-vulkan-drivers"], capture_output=True,
                          text=True, timeout=60)
    installed, candidate = apt_candidate(proc.stdout)
    if installed != "(none)":
        return False, f"mesa-vulkan-drivers {installed} is installed, yet wgpu did not use it"
    if candidate == "(none)":
        return False, "apt has no candidate for mesa-vulkan-drivers"
    return True, ""


def test_apt_policy_is_read_for_the_installed_and_candidate_versions():
    policy = ("mesa-vulkan-drivers:\n  Installed: (none)\n  Candidate: 22.3.6-1+deb12u1\n"
              "  Version table:\n     22.3.6-1+deb12u1 500\n")
    assert apt_candidate(policy) == ("(none)", "22.3.6-1+deb12u1")
    assert apt_candidate("N: Unable to locate package mesa-vulkan-drivers\n") == ("(none)", "(none)")


def test_wgpu_backends_run_on_a_native_api_where_a_vulkan_driver_is_installable():
    """The CI's proof that set-up did its job: an OpenGL adapter (no 'shader-f16', no
    subgroups) fails this test where a Vulkan driver could have been installed."""
    probe = probe_wgpu()
    ok, why = probe.available
    if not ok:
        pytest.skip(f"no WebGPU adapter: {why}")
    if probe.backend_type in NATIVE_BACKEND_TYPES:
        return
    installable, why = vulkan_driver_installable()
    if not installable:
        pytest.skip(f"wgpu runs on {probe.backend_type}; {why}")
    pytest.fail(f"the wgpu backends run on {probe.backend_type} ({probe.adapter['adapter']}) "
                "while mesa-vulkan-drivers is installable: ./statebench.sh did not install it")


def _fake_tools(tmp_path: Path) -> Path:
    """dpkg that finds nothing installed, id that says root, apt-get that records its
    arguments: statebench.sh's set-up decision, without touching the system's packages."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("dpkg", "exit 1"), ("id", "echo 0"),
                       ("apt-get", f'echo "$@" >> {tmp_path}/apt-get.log')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("backend_type, installs", [("OpenGL", True), ("Vulkan", False)])
def test_setup_installs_lavapipe_unless_the_adapter_is_native(tmp_path, backend_type, installs):
    """statebench.sh installs mesa-vulkan-drivers where wgpu finds only an OpenGL adapter
    (WGPU_BACKEND_TYPE forces wgpu-py onto one), not where it finds a Vulkan one."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("statebench.sh's .venv is not set up")
    if probe_wgpu().backend_type != "Vulkan":
        pytest.skip("this machine has no Vulkan adapter to choose between")
    from backends.webnn.adapter import wgpu_adapter

    if wgpu_adapter("dawn")[0] is None:  # setup_dawn would then change the apt sources
        pytest.skip(f"Dawn finds no adapter here ({wgpu_adapter('dawn')[1]})")
    env = {**os.environ, "WGPU_BACKEND_TYPE": backend_type,
           "PATH": f"{_fake_tools(tmp_path)}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "statebench.sh"), "run", "--help"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "apt-get.log"
    if installs:
        assert "install -y -qq mesa-vulkan-drivers" in log.read_text(), proc.stderr
        assert "only an OpenGL WebGPU adapter: installing mesa-vulkan-drivers" in proc.stderr
    else:
        assert not log.exists(), log.read_text()


def _crashing_driver_or_skip(monkeypatch) -> None:
    for k, v in CRASHING_DRIVER.items():
        monkeypatch.setenv(k, v)
    ok, why = probe_wgpu().available
    if ok or "killed by" not in why:
        pytest.skip(f"this machine's driver does not abort under {CRASHING_DRIVER} ({why or 'ok'})")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "240"})


def test_a_driver_that_aborts_only_loses_the_wgpu_points(tmp_path, monkeypatch):
    """The sweep's parent never asks wgpu itself: a driver that panics while enumerating
    adapters marks the wgpu backends unavailable with the panic's message, and the ORT
    points are measured, checked and saved."""
    _crashing_driver_or_skip(monkeypatch)
    out = tmp_path / "run.json"
    proc = _cli("run", "--preset", "tiny", "--backends", "ort-cpu:copy,wgpu:stateful",
                "--contexts", "16", "--steps", "2", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    points = {p["backend"]: p for p in data["points"]}
    assert points["ort-cpu:copy"]["status"] == "ok" and points["ort-cpu:copy"]["match"]["ok"]
    wgpu = points["wgpu:stateful"]
    assert wgpu["status"] == "unavailable" and "killed by SIGABRT" in wgpu["reason"], wgpu
    env = data["environment"]
    assert env["wgpu"]["adapter"] is None and "SIGABRT" in env["wgpu"]["reason"]
    assert "SIGABRT" in env["calibration"]["wgpu"]["reason"]
    assert env["calibration"]["host"]["copy_gbps"] > 0
    assert "Traceback" not in proc.stderr


def test_backends_listing_survives_a_driver_that_aborts(tmp_path, monkeypatch):
    _crashing_driver_or_skip(monkeypatch)
    proc = _cli("backends", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines()
            if line.count("│") > 2}
    assert "yes" in rows["ort-cpu:copy"]
    assert "no" in rows["wgpu:stateful"] and "SIGABRT" in rows["wgpu:stateful"]
    assert "wgpu adapter: none (wgpu adapter probe killed by SIGABRT" in proc.stdout


def test_backends_names_the_backend_api_and_warns_on_opengl(tmp_path, monkeypatch):
    probe = probe_wgpu()
    if not probe.available[0]:
        pytest.skip(f"no WebGPU adapter: {probe.available[1]}")
    proc = _cli("backends", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"backend API: {probe.backend_type}" in proc.stdout
    assert ("warning" in proc.stderr) == (probe.backend_type not in NATIVE_BACKEND_TYPES)
    monkeypatch.setenv("WGPU_BACKEND_TYPE", "OpenGL")
    gl = probe_wgpu()
    if gl.backend_type != "OpenGL":
        pytest.skip(f"wgpu has no OpenGL adapter here ({gl.available[1] or gl.backend_type})")
    proc = _cli("backends", cwd=tmp_path)
    assert "backend API: OpenGL" in proc.stdout
    assert "statebench: warning: wgpu's adapter runs on OpenGL" in proc.stderr
    assert "'shader-f16'" in proc.stderr


def test_a_panic_is_reported_by_its_message_not_its_backtrace():
    stderr = ("thread '<unnamed>' (1) panicked at /root/.cargo/registry/src/x/glow-0.17.0/"
              "src/native.rs:2313:13:\nGet parameter string 0x8B8C failed.\nstack backtrace:\n"
              "   0: rust_begin_unwind\nthread caused non-unwinding panic. aborting.\n")
    assert stderr_reason(stderr) == ("Get parameter string 0x8B8C failed. (a panic at "
                                     "glow-0.17.0/src/native.rs:2313:13)")
    assert stderr_reason("one\n\nValueError: two\n") == "ValueError: two"
    assert stderr_reason("") == ""
