"""The model cache's checksums: a damaged file is found, rebuilt once with a notice, never used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model import checksum
from model import export as E
from model.workload import Workload, cached_weights, config_key, make_weights, preset

ROOT = Path(__file__).resolve().parents[1]
CAPACITY = 16


def flip(path: Path) -> None:
    """Overwrite 4 KiB (or the whole file, if smaller) in the middle with other bytes."""
    data = bytearray(path.read_bytes())
    n = min(4096, len(data) // 2)
    start = (len(data) - n) // 2
    data[start:start + n] = bytes((b + 1) % 256 for b in data[start:start + n])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def drop_sum(path: Path) -> None:
    checksum.sum_path(path).unlink()


DAMAGE = {"flipped": flip, "truncated": truncate, "checksum deleted": drop_sum}


def notices(err: str, path: Path) -> list[str]:
    return [ln for ln in err.splitlines()
            if ln.startswith(checksum.NOTICE_PREFIX) and str(path) in ln]


def test_digest_is_the_content_and_chunked(tmp_path, monkeypatch):
    monkeypatch.setattr(checksum, "CHUNK", 1000)  # several chunks hashed in threads
    a, b = tmp_path / "a", tmp_path / "b"
    payload = np.random.default_rng(1).bytes(10_500)
    a.write_bytes(payload)
    b.write_bytes(payload)
    assert checksum.file_digest(a) == checksum.file_digest(b)
    b.write_bytes(payload[:-1] + bytes([payload[-1] ^ 1]))
    assert checksum.file_digest(a) != checksum.file_digest(b)
    (tmp_path / "empty").write_bytes(b"")
    assert checksum.file_digest(tmp_path / "empty")


@pytest.mark.parametrize("damage", DAMAGE)
def test_f32_weights_rebuilt_once_with_notice(damage, tmp_path, capsys):
    cfg = preset("tiny")
    expect = make_weights(cfg, 3)
    cached_weights(cfg, 3, tmp_path)
    path = tmp_path / "weights" / f"{config_key(cfg, 3)}.f32"
    assert checksum.sum_path(path).exists() and not capsys.readouterr().err
    DAMAGE[damage](path)
    got = cached_weights(cfg, 3, tmp_path)
    assert len(notices(capsys.readouterr().err, path)) == 1
    for name, arr in expect.items():
        np.testing.assert_array_equal(got[name], arr)
    # whole again: reused without a notice
    cached_weights(cfg, 3, tmp_path)
    assert not capsys.readouterr().err
    assert checksum.problem(path) is None


#: what is damaged -> (preset, flavour, MatMulNBits accuracy level) of the graph exported
TARGETS = {"weights.bin": ("tiny", "standard", None), "graph": ("tiny", "standard", None),
           "level-0 graph": ("tiny+q4", "ort", E.FLOAT_ACCURACY_LEVEL)}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("target", TARGETS)
def test_export_rebuilds_a_damaged_file(target, damage, tmp_path, capsys):
    name, flavour, level = TARGETS[target]
    wl = Workload.build(preset(name), seed=2)

    def export() -> Path:
        return E.export(wl, flavour, CAPACITY, tmp_path, accuracy_level=level)

    graph = export()
    path = graph.parent / "weights.bin" if target == "weights.bin" else graph
    fresh = path.read_bytes()
    capsys.readouterr()
    DAMAGE[damage](path)
    assert export() == graph
    assert len(notices(capsys.readouterr().err, path)) == 1
    assert path.read_bytes() == fresh and checksum.problem(path) is None
    export()
    assert not capsys.readouterr().err


def _sweep(out: Path) -> subprocess.CompletedProcess:
    """A real tiny run, each point in its own worker process (which does the export)."""
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--preset", "tiny", "--backends",
         "ort-cpu:copy", "--contexts", "8", "--steps", "3", "--warmup", "1", "--warm-s", "0",
         "--no-calibrate", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)


#: the whole-run check of each damage: one in the fast tier, the others (each damage is also
#: checked at the loader by the tests above) in the slow tier
RUN_DAMAGE = [d if d == "checksum deleted" else pytest.param(d, marks=pytest.mark.slow)
              for d in DAMAGE]


@pytest.mark.parametrize("damage", RUN_DAMAGE)
def test_a_run_on_a_damaged_cache_rebuilds_and_matches(damage, tmp_path, monkeypatch):
    monkeypatch.setenv("STATEBENCH_CACHE", str(tmp_path / "cache"))
    first = _sweep(tmp_path / "a.json")
    assert first.returncode == 0, first.stderr
    (model_dir,) = (tmp_path / "cache").iterdir()
    damaged = [model_dir / "weights.bin", *model_dir.glob("*.onnx")]
    for path in damaged:
        DAMAGE[damage](path)
    second = _sweep(tmp_path / "b.json")
    assert second.returncode == 0, second.stderr
    for path in damaged:  # said once, by the worker, through the runner
        assert len(notices(second.stderr, path)) == 1, second.stderr
    (point,) = json.loads((tmp_path / "b.json").read_text())["points"]
    assert point["status"] == "ok" and point["match"]["ok"] and point["reason"] == ""
    third = _sweep(tmp_path / "c.json")
    assert third.returncode == 0 and checksum.NOTICE_PREFIX not in third.stderr


HASH_ONCE = """
import json, pathlib, sys
from model import checksum
from model import export as E
from model.workload import Workload, cached_weights, preset
cfg = preset("tiny")
root = pathlib.Path(sys.argv[1])
for _ in range(3):
    cached_weights(cfg, 0, root)
    wl = Workload(cfg, 0, cached_weights(cfg, 0, root))
    for flavour in E.FLAVOURS:
        for capacity in (16, 32):
            E.export(wl, flavour, capacity, root)
print(json.dumps(checksum.hash_counts))
"""


def test_another_process_hashes_each_file_at_most_once(tmp_path):
    def counts() -> dict[str, int]:
        proc = subprocess.run([sys.executable, "-c", HASH_ONCE, str(tmp_path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, check=True)
        assert checksum.NOTICE_PREFIX not in proc.stderr
        return json.loads(proc.stdout)

    made = counts()  # the process that makes them hashes each once, as it seals it
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".f32", ".bin", ".onnx")]
    assert len(files) == 6 and all(made[str(p.resolve())] == 1 for p in files), made
    reused = counts()  # a second process verifies each once, however often it is asked
    assert sorted(reused) == sorted(str(p.resolve()) for p in files)
    assert set(reused.values()) == {1}, reused


def test_a_corrupt_weights_file_never_reaches_the_reference_or_an_export(tmp_path, capsys):
    """The `.f32` cache feeds both the reference and the exported weights.bin: a damaged one
    must be rebuilt before either reads it, or both would agree on a wrong model."""
    cfg = preset("tiny")
    cached_weights(cfg, 0, tmp_path)
    path = tmp_path / "weights" / f"{config_key(cfg, 0)}.f32"
    flip(path)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    wl = Workload(cfg, 0, cached_weights(cfg, 0, tmp_path))
    assert len(notices(capsys.readouterr().err, path)) == 1
    graph = E.export(wl, "ort", CAPACITY, tmp_path)
    stored = np.fromfile(graph.parent / "weights.bin", np.float32)
    expect = make_weights(cfg, 0)["embed_tokens"].reshape(-1)
    np.testing.assert_array_equal(stored[: expect.size], expect)


WORKER = """
import json, pathlib, sys
from model import checksum
from model.workload import cached_weights, preset
checksum.adopt(json.loads(sys.argv[2]))  # as a worker takes its request's whole_files
cached_weights(preset("tiny"), 0, pathlib.Path(sys.argv[1]))
print(json.dumps(checksum.hash_counts))
"""


def test_a_worker_trusts_its_runners_verdict_only_for_the_same_file(tmp_path):
    """The runner hands its workers the files it found whole (the `.f32` weights it read for
    the reference): a worker skips hashing those, but not a file changed since."""
    cfg = preset("tiny")
    cached_weights(cfg, 0, tmp_path)
    path = tmp_path / "weights" / f"{config_key(cfg, 0)}.f32"
    whole = json.dumps(checksum.whole_files())

    def worker() -> tuple[dict, str]:
        proc = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), whole], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, check=True)
        return json.loads(proc.stdout), proc.stderr

    assert worker() == ({}, "")
    flip(path)
    counts, err = worker()  # hashed to find it damaged, then to seal the rebuilt one
    assert counts == {str(path.resolve()): 2} and len(notices(err, path)) == 1
    assert worker() == ({str(path.resolve()): 1}, "")  # a new file: verified once
