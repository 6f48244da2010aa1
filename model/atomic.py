"""Files that are either whole or absent: results, baselines, exported graphs, weight caches.

DESIGN §10: nothing is ever half-written. Each writer goes through `atomic_file`, which writes a
temporary file beside the target, flushes it to disk and renames it over the target, and only
over a regular file: a device, a named pipe, a socket, a folder or a symbolic link at the
target is left as it is (`NotRegularFile`). `exclusive_lock` keeps two processes from writing
one file at once (two runs given `--force` on one `--out`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

#: what flock says on a file system that has no locks
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


class NotRegularFile(OSError):
    """The target exists and is not a regular file; nothing was written over it."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(errno.EEXIST, f"{what}, not a regular file; left as it is", str(path))
        self.what = what


def file_kind(path: str | os.PathLike) -> str | None:
    """What is at `path` without following a link ("a symbolic link", "a named pipe", ...),
    "" for a regular file, None where nothing is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a component of the path is a file: nothing can be there
        return None
    if stat.S_ISREG(mode):
        return ""
    return {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a directory",
            stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
            }.get(stat.S_IFMT(mode), "not a file")


def require_regular(path: str | os.PathLike) -> None:
    """NotRegularFile where `path` exists and is not a regular file (a link is not one)."""
    kind = file_kind(path)
    if kind:
        raise NotRegularFile(Path(path), kind)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", replace: bool = True) -> Iterator[IO]:
    """Open a temporary file beside `path`; on a clean exit it replaces `path` (mode 0644),
    on an exception it is removed and `path` is left as it was. With `replace` False the
    file is linked into place only where `path` does not exist (FileExistsError if it
    does): two writers cannot both create it. Only a regular file is ever replaced: anything
    else at `path` (checked first and again just before the rename, as it can change while
    the file is written) raises NotRegularFile and stays."""
    path = Path(path)
    require_regular(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if replace:
            require_regular(path)
            os.replace(tmp, path)
        else:
            _create(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create(tmp: str, path: Path) -> None:
    """Move `tmp` to `path` where no `path` exists: a hard link is atomic and never replaces
    a file; where the file system has none (FAT, some network mounts), an exclusive create
    claims the name first."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock for writing `path` (an flock on the hidden `.NAME.lock` beside
    it, which holds the holder's pid) for the life of the block; BlockingIOError, naming the
    holder's pid in its `holder` attribute ("" unknown), where another process holds it. The
    kernel releases it when the holder exits, however it exits; the holder removes the lock
    file on the way out, and a taker that finds the file it locked unlinked meanwhile takes
    the new one instead, so no two processes ever both hold it. Where the file system has
    no locks, the block runs unlocked."""
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            exc.holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise
            # a file system without locks (some network mounts): the run goes on unlocked,
            # and its first save still never takes a file another run made (`_create`)
            with contextlib.suppress(OSError):
                os.unlink(lock)
            yield
            return
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:  # its holder removed it as we locked it: take the next
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)
