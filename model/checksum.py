"""Content checksums of the model cache's files (weights, `.f32` weights, exported graphs).

A cached file is only reused when a checksum written beside it (``<file>.sum``) when it was
made still matches its content; a flipped, truncated or unsummed file is rebuilt with one line
on stderr, never measured (a corrupt weights file that the reference and the backends both read
would otherwise "match" everywhere). The hash is SHA-256 over 64 MiB chunks, hashed in threads
(hashlib releases the GIL), then SHA-256 over the chunk digests: the CPUs' SHA extensions make
it the fastest hashlib offers, and the threads scale it with the cores. Each process hashes a
file at most once (the verdict is kept per path, inode, size and times of the file and of its
checksum), and a worker starts with its runner's verdicts (`whole_files`, carried in its
request: ``harness.wire``) and hands its own back in its reply (`adopt`), so neither the
`.f32` weights the runner checked for the reference nor the `weights.bin` the first worker
checked are hashed again per point; the cost per GB is in docs/measuring.md's "The model
cache" section.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from model.atomic import atomic_file
from model.cpus import USABLE_CPUS
from model.errors import UserError

ALGORITHM = "sha256-tree-64MiB"
CHUNK = 64 << 20
SUFFIX = ".sum"
#: how every rebuild notice starts (the runner forwards a worker's notices with it)
NOTICE_PREFIX = "statebench: cache "

#: how many times this process hashed each file (tests count re-hashing with it)
hash_counts: Counter[str] = Counter()
_whole: dict[tuple, str] = {}  # stat key -> digest of a file found whole in this process


def check_cache_dir(directory: str | os.PathLike) -> Path:
    """The model cache `directory`, made where missing; a UserError in one line, before any
    point, where it is not a folder or no file can be made in it (else every point of a
    sweep fails on its first cached file, and the run still exits 0). The probe makes and
    removes a file, as a cache write does: it holds for root, ACLs and read-only mounts."""
    root = Path(directory)
    named = (f"STATEBENCH_CACHE={root}" if os.environ.get("STATEBENCH_CACHE")
             else f"{root} (set STATEBENCH_CACHE to move it)")
    if root.exists() and not root.is_dir():
        raise UserError(f"the model cache {named} is a file, not a folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=root).close()
    except OSError as exc:
        raise UserError(f"the model cache {named}: cannot write there "
                        f"({exc.strerror or exc})") from None
    return root


def sum_path(path: str | os.PathLike) -> Path:
    """Where the checksum of `path` is kept."""
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def file_digest(path: str | os.PathLike) -> str:
    """The file's content hash (ALGORITHM), read through one memory map."""
    path = Path(path)
    hash_counts[str(path.resolve())] += 1
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return hashlib.sha256(b"").hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                offsets = range(0, size, CHUNK)
                workers = max(1, min(len(offsets), USABLE_CPUS, 16))
                with ThreadPoolExecutor(workers) as pool:
                    parts = list(pool.map(
                        lambda o: hashlib.sha256(view[o:o + CHUNK]).digest(), offsets))
            finally:
                view.release()
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _key(path: Path) -> tuple:
    """What must stay the same for a verdict to hold: the file and its checksum file."""
    st = path.stat()
    try:
        ss = sum_path(path).stat()
        summed = (ss.st_ino, ss.st_size, ss.st_mtime_ns)
    except OSError:
        summed = None
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns, summed)


def whole_files() -> list[list]:
    """The files this process found whole, as JSON-ready data, for another process (a
    worker's request, its reply): that process then skips hashing them while they stay the
    same file (size, times, inode, checksum)."""
    return [list(k[:-1]) + [list(k[-1]) if k[-1] else None] for k in sorted(_whole, key=repr)]


def adopt(keys: list) -> None:
    """Take the files another process found whole (its `whole_files()`) as whole here too,
    while they stay the same file: the runner's for a worker, and a worker's for its runner."""
    try:
        _whole.update({(*k[:-1], tuple(k[-1]) if k[-1] else None): "" for k in keys})
    except (ValueError, TypeError, IndexError):
        pass  # a malformed hand-off only costs the hashes it would have saved


def seal(path: str | os.PathLike) -> None:
    """Write the checksum of the just-made `path` (atomically) and remember it as whole."""
    path = Path(path)
    digest = file_digest(path)
    size = path.stat().st_size
    with atomic_file(sum_path(path), "w") as f:
        json.dump({"algorithm": ALGORITHM, "size": size, "digest": digest}, f)
    _whole[_key(path)] = digest


def problem(path: str | os.PathLike, size: int | None = None) -> str | None:
    """Why the existing `path` may not be reused, or None when it is whole (hashed at most
    once per process while it stays the same file)."""
    path = Path(path)
    try:
        key = _key(path)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if size is not None and key[3] != size:
        return f"is {key[3]:,} bytes, expected {size:,}"
    if key in _whole:
        return None
    try:
        recorded = json.loads(sum_path(path).read_text())
    except FileNotFoundError:
        return f"has no checksum ({sum_path(path).name} missing)"
    except (OSError, ValueError):
        return f"has an unreadable checksum ({sum_path(path).name})"
    if not isinstance(recorded, dict) or recorded.get("algorithm") != ALGORITHM:
        return f"has a checksum of another kind ({sum_path(path).name})"
    if recorded.get("size") != key[3]:
        return f"is {key[3]:,} bytes but was made with {recorded.get('size')!r}"
    try:
        digest = file_digest(path)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if digest != recorded.get("digest"):
        return "does not match its checksum (corrupt)"
    _whole[key] = digest
    return None


def reusable(path: str | os.PathLike, what: str, size: int | None = None) -> bool:
    """True when `path` exists and is whole; a file that exists but is not says so in one
    line on stderr (the caller then rebuilds it). A missing file is simply made."""
    path = Path(path)
    if not path.exists():
        return False
    why = problem(path, size)
    if why is None:
        return True
    print(f"{NOTICE_PREFIX}{what} {path} {why}; rebuilding it", file=sys.stderr, flush=True)
    return False
