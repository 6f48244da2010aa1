"""Faults and hostile inputs through the real CLI (issue 16, parts 2 and 5): no run loses or
replaces points unsaid, sizes that cannot fit are refused before any work, bad files and
signals end in one line, and an interrupted or killed run leaves no worker or depth file.
"""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from harness import calibrate, runner
from harness.cli import main
from harness.results import load
from model import atomic

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--preset", "tiny", "--backends", "ort-cpu:copy", "--contexts", "8", "--steps", "2",
        "--warmup", "1", "--no-calibrate"]


def cli(*args) -> tuple[int, str, str]:
    """`statebench ARGS` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    rc = main([str(a) for a in args], console=Console(file=out, width=200),
              err_console=Console(file=err, width=200))
    return rc, out.getvalue(), err.getvalue()


def one_line(result, status: int = 2) -> str:
    rc, _, err = result
    assert rc == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def points_in(path: Path) -> int:
    return len(load(path).points)


@pytest.fixture
def no_calibration(monkeypatch):
    """The checks under test come before calibration: calling it fails the test."""
    def called(*a, **k):
        raise AssertionError("calibration ran before the check")

    monkeypatch.setattr(calibrate, "calibrate", called)


# -- results never lost, never silently replaced ---------------------------------------------

def test_two_default_named_runs_in_the_same_second_keep_both(tmp_path):
    cmd = [sys.executable, "-m", "harness.cli", "run", *FAST]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    files = sorted((tmp_path / "results").glob("run-tiny-*.json"))
    assert len(files) == 2 and all(points_in(f) == 1 for f in files)


def test_an_existing_out_is_refused_unless_forced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old = tmp_path / "old.json"
    old.write_text("an earlier sweep's points")
    line = one_line(cli("run", *FAST, "--out", old))
    assert line == f"statebench: error: --out {old}: the file exists; pass --force to replace it"
    assert old.read_text() == "an earlier sweep's points"
    rc, out, err = cli("run", *FAST, "--out", old, "--force")
    assert rc == 0, err
    assert points_in(old) == 1


@pytest.mark.parametrize("make, says", [
    (lambda out: out.mkdir(parents=True), "run.json: is a directory; name a file"),
    (lambda out: None, "no-such-dir does not exist"),
    (lambda out: out.parent.write_text("x"), "no-such-dir is a file, not a folder"),
    (lambda out: None, "cannot write in /proc"),
])
def test_out_checked_before_calibration(tmp_path, monkeypatch, no_calibration, make, says):
    if "/proc" in says and not Path("/proc/self").exists():
        pytest.skip("needs Linux /proc (a directory no one can write in, root included)")
    monkeypatch.chdir(tmp_path)
    out = Path("/proc/run.json") if "/proc" in says else tmp_path / "no-such-dir" / "run.json"
    make(out)
    args = [a for a in FAST if a != "--no-calibrate"]
    assert says in one_line(cli("run", *args, "--out", out))


def _fail_saves_at(monkeypatch, point: int, fault) -> None:
    """Run `fault()` just before the sweep saves its `point`-th point (1-based)."""
    real, calls = runner.finish_point, []

    def finish(*a, **k):
        calls.append(1)
        if len(calls) == point:
            fault()
        return real(*a, **k)

    monkeypatch.setattr(runner, "finish_point", finish)


def test_a_full_disk_ends_the_sweep_with_the_points_kept(tmp_path, monkeypatch):
    """RLIMIT_FSIZE makes the second save fail as a full disk would (EFBIG), for root too."""
    out = tmp_path / "run.json"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)

    def disk_full():
        size = out.stat().st_size + 64
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))

    _fail_saves_at(monkeypatch, 2, disk_full)
    try:
        line = one_line(cli("run", *FAST, "--contexts", "8,16", "--out", out))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert line.startswith(f"statebench: error: cannot save results to {out} (File too large); "
                           f"the sweep stopped: 1 point is kept in {out}")
    assert line.endswith("the last 1 lost")  # the rescue copy is too large as well
    assert points_in(out) == 1


def test_an_unsavable_point_is_rescued_to_the_temp_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    out = tmp_path / "run.json"

    def in_the_way():
        out.unlink()
        out.mkdir()

    _fail_saves_at(monkeypatch, 2, in_the_way)
    line = one_line(cli("run", *FAST, "--contexts", "8,16", "--out", out))
    assert (f"cannot save results to {out} (a directory, not a regular file; left as it is); "
            "the sweep stopped: ") in line
    rescued = list((tmp_path / "tmp").glob("run-rescued-*.json"))
    assert len(rescued) == 1 and f"all 2 points are in {rescued[0]}" in line
    assert points_in(rescued[0]) == 2


# -- --force replaces only a regular file; one run writes one file at a time ------------------

def _char_device(path: Path) -> None:
    """A character device like /dev/full's (made in the test's folder, so a regression
    replaces nothing of the machine's); only root may make one."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("making a device node needs root")


@pytest.mark.parametrize("make, kind", [
    (lambda out: os.mkfifo(out), "a named pipe"),
    (_char_device, "a character device"),
    (lambda out: (out.with_name("real.json").write_text("kept"), out.symlink_to("real.json")),
     "a symbolic link (to real.json)"),
])
@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
def test_force_replaces_only_a_regular_file(tmp_path, monkeypatch, no_calibration, make, kind,
                                            force):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run.json"
    make(out)
    before = os.lstat(out)
    args = [a for a in FAST if a != "--no-calibrate"]
    line = one_line(cli("run", *args, "--out", out, *(["--force"] if force else [])))
    assert line == (f"statebench: error: --out {out}: {kind}, not a regular file; statebench "
                    "writes results only to a new or a regular file (--force replaces only a "
                    "regular file; name the file itself)")
    after = os.lstat(out)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(
        ["run.json"] + (["real.json"] if "link" in kind else []))
    if "link" in kind:
        assert (tmp_path / "real.json").read_text() == "kept"


def test_a_pipe_put_in_place_before_the_first_save_is_left_and_the_point_rescued(
        tmp_path, monkeypatch):
    """The up-front check cannot see a path change during the sweep: model/atomic.py checks
    again before it writes and before its rename."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    out = tmp_path / "run.json"
    out.write_text("an earlier sweep")

    def pipe():
        out.unlink()
        os.mkfifo(out)

    _fail_saves_at(monkeypatch, 1, pipe)
    line = one_line(cli("run", *FAST, "--out", out, "--force"))
    assert line.startswith(f"statebench: error: cannot save results to {out} (a named pipe, not "
                           "a regular file; left as it is); the sweep stopped: no point was "
                           "saved there"), line
    assert stat.S_ISFIFO(os.lstat(out).st_mode)
    rescued = list((tmp_path / "tmp").glob("run-rescued-*.json"))
    assert len(rescued) == 1 and str(rescued[0]) in line and points_in(rescued[0]) == 1


@pytest.mark.parametrize("swap, kind", [(os.mkfifo, "a named pipe"), (os.mkdir, "a directory"),
                                        (lambda p: p.symlink_to("elsewhere"), "a symbolic link")])
def test_atomic_file_checks_again_at_the_rename(tmp_path, swap, kind):
    target = tmp_path / "file.json"
    target.write_text("old")
    with pytest.raises(atomic.NotRegularFile, match=f"{kind}, not a regular file"):
        with atomic.atomic_file(target, "w") as f:
            f.write("new")
            target.unlink()
            swap(target)  # the path changes while the file is written
    assert not stat.S_ISREG(os.lstat(target).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["file.json"]  # no temporary file left


def test_one_lock_holder_at_a_time(tmp_path):
    target = tmp_path / "run.json"
    lock = tmp_path / ".run.json.lock"
    with atomic.exclusive_lock(target):
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(BlockingIOError) as caught:  # a second open file description
            with atomic.exclusive_lock(target):
                pass
        assert caught.value.holder == str(os.getpid())
    assert not lock.exists()
    with atomic.exclusive_lock(target):  # released: taken again
        pass


# -- a sweep with no end, a cache that cannot take files ---------------------------------------

@pytest.mark.parametrize("flags, says", [
    (["--repeat", "100000000000"], "argument --repeat: 100000000000 is more than 100, the most a "
                                   "sweep takes"),
    (["--repeat", "100", "--contexts", ",".join(map(str, range(8, 109)))],
     "1 backend × 101 contexts × --repeat 100 is 10,100 worker processes, more than the 10,000 "
     "a sweep may start"),
])
def test_an_endless_sweep_is_refused(tmp_path, monkeypatch, no_calibration, flags, says):
    monkeypatch.chdir(tmp_path)
    args = [a for a in FAST if a != "--no-calibrate"]
    assert says in one_line(cli("run", *args, *flags))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("where, says", [
    ("file", "is a file, not a folder"),
    ("file/cache", "cannot write there (Not a directory)"),
    ("/proc/statebench-cache", "cannot write there"),  # no one makes a folder there, root either
])
def test_a_cache_that_cannot_take_files_is_refused_before_the_run(tmp_path, monkeypatch,
                                                                  no_calibration, where, says):
    if where.startswith("/proc") and not Path("/proc/self").exists():
        pytest.skip("needs Linux /proc")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a folder")
    cache = Path(where) if where.startswith("/") else tmp_path / where
    monkeypatch.setenv("STATEBENCH_CACHE", str(cache))
    args = [a for a in FAST if a != "--no-calibrate"]
    line = one_line(cli("run", *args, "--out", tmp_path / "run.json"))
    assert line.startswith(f"statebench: error: the model cache STATEBENCH_CACHE={cache}")
    assert says in line
    assert not (tmp_path / "run.json").exists()


# -- sizes that cannot fit ---------------------------------------------------------------------

@pytest.mark.parametrize("flag", [["--contexts", "99999999"], ["--capacity", str(10**12)],
                                  ["--steps", "99999999"]])
def test_impossible_sizes_refused_before_any_work(tmp_path, monkeypatch, no_calibration, flag):
    monkeypatch.chdir(tmp_path)
    args = [a for a in FAST if a != "--no-calibrate"]
    line = one_line(cli("run", *args, *flag))
    assert "needs at least" in line and "of memory, more than the" in line
    assert "use smaller --contexts, --capacity or --steps" in line
    assert not (tmp_path / "results").exists()


def test_memory_estimate_counts_the_state_the_reference_holds():
    from harness import memory
    from model.reference import Reference
    from model.workload import Workload, preset

    wl = Workload.build(preset("tiny"))
    ref = Reference(wl.config, wl.weights, 40)
    assert memory.state_bytes(wl.config, 40, 8) == sum(a.nbytes for a in ref.state.values())
    f16 = preset("tiny+f16kv")
    assert memory.state_bytes(f16, 40) == sum(a.nbytes for a in Reference(
        f16, wl.weights, 40).cache_arrays().values())
    from harness.sources import sweep_memory_bytes

    assert sweep_memory_bytes(wl.config, 10**12, 10**12, 1) > 10**15


# -- bad files: one line, never a traceback ----------------------------------------------------

@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("faults")
    rc, _, err = cli("run", *FAST, "--inprocess", "--out", d / "run.json")
    assert rc == 0, err
    return d / "run.json"


@pytest.mark.parametrize("content, says", [
    ('{"schema": "statebench/1", "command": "café"}'.encode("latin-1"),
     "not UTF-8 text: byte 0xe9 at offset 42"),
    (b"[" * 100_000, "not a statebench results file: maximum recursion depth"),
    (b"1" * 5000, "not a statebench results file: Exceeds the limit"),
])
@pytest.mark.parametrize("command", ["report", "gate", "baseline"])
def test_undecodable_files_are_one_line(tmp_path, monkeypatch, run_file, content,
                                                   says, command):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    args = {"report": ["report", bad], "gate": ["gate", bad, "--baseline", run_file],
            "baseline": ["baseline", bad, "--name", "x"]}[command]
    line = one_line(cli(*args))
    assert line.startswith(f"statebench: error: {bad}: ") and says in line


@pytest.mark.parametrize("doctor, says", [
    (lambda e: e.update(wgpu="NVIDIA"), "environment.wgpu has the wrong type"),
    (lambda e: e.update(wgpu={"adapter": 3}), "environment.wgpu.adapter has the wrong type"),
    (lambda e: e.update(packages=["numpy"]), "environment.packages has the wrong type"),
    (lambda e: e.update(packages={"numpy": 2}), "environment.packages.numpy has the wrong type"),
    (lambda e: e.update(calibration={"wgpu": []}), "environment.calibration.wgpu is not an object"),
    (lambda e: e.update(calibration={"host": {"copy_gbps": "fast"}}),
     "environment.calibration.host.copy_gbps is not a number"),
    (lambda e: e.update(calibration={"host": {"copy_gbps": float("nan")}}),
     "environment.calibration.host.copy_gbps is not finite"),
    (lambda e: e.update(merged_from=[{"file": "a.json"}]),
     "environment.merged_from[0] lacks 'created'"),
    (lambda e: e.update(cpu_count="two"), "environment.cpu_count has the wrong type"),
])
def test_a_malformed_environment_is_one_line(tmp_path, run_file, doctor, says):
    data = json.loads(run_file.read_text())
    doctor(data["environment"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    for fmt in ("table", "html"):
        line = one_line(cli("report", bad, "--format", fmt))
        assert line == f"statebench: error: {bad}: not a statebench results file: {says}"


@pytest.mark.parametrize("doctor, says", [
    (lambda c: c.update(parameters=[1]), "workload.config.parameters has the wrong type"),
    (lambda c: c.update(layers=[3]), "workload.config.layers[0] is 3, not a layer kind"),
])
def test_a_malformed_model_config_is_one_line(tmp_path, run_file, doctor, says):
    data = json.loads(run_file.read_text())
    doctor(data["workload"]["config"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    line = one_line(cli("report", bad, "--format", "md"))
    assert line == f"statebench: error: {bad}: not a statebench results file: {says}"


# -- report --out --------------------------------------------------------------------------------

@pytest.mark.parametrize("where, says", [
    ("file", "--dir {d}: a file, not a folder"),
    ("file/baselines", "--dir {d}: cannot write there (Not a directory)"),
    # a folder no one can make, root included (root ignores permission bits)
    ("/proc/statebench-baselines", "--dir {d}: cannot write there (No such file or directory)"),
    ("target-a-folder", "baseline {d}/b.json is a directory, not a file; --force replaces only a "
                        "regular file: remove it or give another --name or --dir"),
])
def test_a_baseline_dir_that_cannot_take_it_is_one_line(tmp_path, run_file, where, says):
    """Exit 2, never the traceback and exit 1 (the gate's regression) CI would misread."""
    if where.startswith("/proc") and not Path("/proc/self").exists():
        pytest.skip("needs Linux /proc")
    (tmp_path / "file").write_text("not a folder")
    d = Path(where) if where.startswith("/") else tmp_path / where
    if where == "target-a-folder":
        (d / "b.json").mkdir(parents=True)
    line = one_line(cli("baseline", run_file, "--name", "b", "--dir", d, "--force"))
    assert line == "statebench: error: " + says.format(d=d)
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.parametrize("old", [False, True], ids=["new", "over-an-old-one"])
def test_a_baseline_on_a_full_disk_writes_nothing(tmp_path, run_file, old):
    """RLIMIT_FSIZE fails the write as a full disk would (EFBIG for ENOSPC), for root too."""
    d = tmp_path / "baselines"
    d.mkdir()
    if old:
        (d / "b.json").write_text("the old baseline")
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, limits[1]))
    try:
        result = cli("baseline", run_file, "--name", "b", "--dir", d, "--force")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    line = one_line(result)
    assert line == (f"statebench: error: cannot write baseline {d}/b.json (File too large); "
                    "nothing written" + (", the old one left as it was" if old else ""))
    assert [f.name for f in d.iterdir()] == (["b.json"] if old else [])  # no temporary file
    if old:
        assert (d / "b.json").read_text() == "the old baseline"


def test_report_out_never_over_other_files_unasked(tmp_path, run_file):
    a_file = tmp_path / "results.json"
    a_file.write_text("keep me")
    line = one_line(cli("report", run_file, "--out", a_file))
    assert line == (f"statebench: error: --out {a_file} is a file; a report is a directory of "
                    "files: give a directory name")
    assert a_file.read_text() == "keep me"
    assert "does not exist" in one_line(cli("report", run_file, "--out", tmp_path / "a" / "b"))

    out = tmp_path / "report"
    assert cli("report", run_file, "--out", out)[0] == 0
    assert (out / "report.html").exists()
    line = one_line(cli("report", run_file, "--out", out))
    assert line == (f"statebench: error: --out {out} already holds files; pass --force to write "
                    "the report over them, or give a new directory")
    assert cli("report", run_file, "--out", out, "--force")[0] == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("report", run_file, "--out", empty)[0] == 0


# -- signals: the points kept, the worker stopped, no depth file left ----------------------------

def _start(tmp_path: Path, *extra) -> subprocess.Popen:
    """A sweep slow enough per point (2000 steps) to be caught with its worker in flight."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "tmp"))
    args = ["run", "--preset", "tiny", "--backends", "ort-cpu:copy,ort-cpu:shared",
            "--contexts", "8,16", "--steps", "2000", "--warmup", "1", "--no-calibrate",
            "--out", tmp_path / "run.json", *extra]
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _worker_in_flight(proc: subprocess.Popen, out: Path, saved: int) -> list[int]:
    """Wait until `saved` points are on disk and a worker runs; its pids."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            kids = [int(x) for x in
                    Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        except OSError:
            kids = []
        try:
            n = len(json.loads(out.read_text())["points"])
        except (OSError, ValueError):  # not there yet, or the old file a --force replaces
            n = 0
        if kids and n == saved:
            return kids
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError("no worker in flight")


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    """The process has exited (a zombie left to init counts: it runs nothing)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _last_line(err: str) -> str:
    """The line a stopped sweep ends with (a cache notice may come before it)."""
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def _depth_dirs(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "tmp").glob(f"{runner.DEPTH_DIR_PREFIX}*"))


needs_proc = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")


@needs_proc
@pytest.mark.parametrize("sig, status, word", [(signal.SIGTERM, 143, "terminated"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_a_signal_mid_sweep_keeps_the_points_and_stops_the_worker(tmp_path, sig, status, word):
    out = tmp_path / "run.json"
    proc = _start(tmp_path)
    workers = _worker_in_flight(proc, out, saved=1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert _last_line(err) == f"statebench: {word}; the 1 point measured so far is in {out}"
    assert points_in(out) == 1
    assert all(_gone(w) for w in workers)
    assert not _depth_dirs(tmp_path)


@needs_proc
def test_a_signal_before_the_first_save_names_no_file(tmp_path):
    proc = _start(tmp_path)
    _worker_in_flight(proc, tmp_path / "run.json", saved=0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert _last_line(err) == ("statebench: terminated before any point was saved; no results "
                           "file was written")
    assert not (tmp_path / "run.json").exists() and not _depth_dirs(tmp_path)


@needs_proc
def test_a_forced_run_stopped_before_its_first_point_leaves_the_old_file(tmp_path):
    out = tmp_path / "run.json"
    out.write_text("an earlier sweep")
    proc = _start(tmp_path, "--force")
    _worker_in_flight(proc, out, saved=0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert _last_line(err) == f"statebench: terminated before any point was saved; {out} is as it was"
    assert out.read_text() == "an earlier sweep"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _worker_running(proc: subprocess.Popen, tmp_path: Path) -> list[int]:
    """After the first point is saved: wait until a live worker has run for a moment with a
    depth file on disk (its context's, which the second point reads; the first point's
    worker may still be exiting, or
    already gone with the next not yet started, when the point is saved, and a runner
    killed then has no worker to clean its directory up: a later run's
    ``remove_stale_depth_dirs`` does). Its pids."""
    deadline = time.monotonic() + 120
    seen: set[int] = set()
    while time.monotonic() < deadline:
        kids = [k for k in _worker_in_flight(proc, tmp_path / "run.json", saved=1) if _alive(k)]
        second = [f for d in _depth_dirs(tmp_path) for f in d.glob("depth-*.npz")]
        if kids and second and seen & set(kids):
            return kids
        seen = set(kids) if second else set()
        time.sleep(0.3)
    raise AssertionError("no worker running")


@needs_proc
def test_a_killed_runner_takes_its_worker_and_depth_file_with_it(tmp_path):
    proc = _start(tmp_path)
    workers = _worker_running(proc, tmp_path)
    assert _depth_dirs(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert all(_gone(w) for w in workers), "the worker outlived its runner"
    deadline = time.monotonic() + 10
    while _depth_dirs(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _depth_dirs(tmp_path)
    assert points_in(tmp_path / "run.json") == 1


def test_stale_depth_directories_of_dead_runs_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"{runner.DEPTH_DIR_PREFIX}{dead}-abc"
    live = tmp_path / f"{runner.DEPTH_DIR_PREFIX}{os.getpid()}-abc"
    other = tmp_path / "statebench-cache"
    for d in (stale, live, other):
        d.mkdir()
        (d / "depth.npz").write_bytes(b"x")
    runner.remove_stale_depth_dirs()
    assert not stale.exists() and live.exists() and other.exists()


# -- two runs given one --out: the second refused, in real processes ---------------------------

def test_a_file_system_without_locks_runs_unlocked(tmp_path, monkeypatch):
    """flock's ENOLCK (a network mount without locks, injected here) is no reason to refuse."""
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(atomic.fcntl, "flock", no_locks)
    ran = []
    with atomic.exclusive_lock(tmp_path / "run.json"):
        ran.append(1)
    assert ran and not list(tmp_path.iterdir())


def _holds_lock(proc: subprocess.Popen, lock: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if lock.read_text().strip() == str(proc.pid):
                return
        except OSError:
            pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("the run never took its lock")


def _statebench(cwd: Path, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def _popen(cwd: Path, *args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_forced_run_on_one_file_is_refused(tmp_path):
    """Two real processes, both given --force: the second is refused while the first runs
    (held with SIGSTOP once it has its lock, so the order does not hang on timing), and the
    first, let go on, keeps its point."""
    out = tmp_path / "run.json"
    out.write_text("an earlier sweep")
    first = _popen(tmp_path, "run", *FAST, "--out", out, "--force")
    try:
        _holds_lock(first, tmp_path / ".run.json.lock")
        os.kill(first.pid, signal.SIGSTOP)
        second = _statebench(tmp_path, "run", *FAST, "--out", out, "--force")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip() == (f"statebench: error: --out {out}: another statebench run "
                                     f"(pid {first.pid}) is writing it; wait for it to end or "
                                     "name another file")
    stdout, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert f"results: {out}" in stdout and points_in(out) == 1
    assert not (tmp_path / ".run.json.lock").exists()  # released on the way out


def test_a_killed_runs_lock_holds_no_one_back(tmp_path):
    """SIGKILL leaves the lock file behind, but the kernel released the lock with the
    process: the next run takes it."""
    out = tmp_path / "run.json"
    first = _popen(tmp_path, "run", *FAST, "--out", out)
    _holds_lock(first, tmp_path / ".run.json.lock")
    first.kill()
    first.communicate(timeout=60)
    assert (tmp_path / ".run.json.lock").exists()
    rc, _, err = cli("run", *FAST, "--out", out, "--force")
    assert rc == 0, err
    assert points_in(out) == 1
    assert not (tmp_path / ".run.json.lock").exists()
