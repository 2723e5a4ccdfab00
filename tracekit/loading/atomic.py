"""Writing outputs so that a crash or a kill never damages what was there: files and directories are
written under a temporary name and swapped in with one atomic rename.

- :func:`atomic_write` — one file: temp file beside it, fsync, ``os.replace``.
- :func:`publish_dir` — a directory (cache entry, dataset): the name is a symlink to a hidden data
  directory, swapped with ``os.replace`` (directories cannot be renamed over non-empty ones, and a
  rename-aside-then-rename-in would leave an instant with neither).
- :func:`sweep_stale` — removes what killed writers left behind (temp files, unreferenced data
  directories), once it is old enough that no live writer can still own it.

Caches may be shared (several processes, several users of one group): a published name is trusted only
when it is a link to a ``.data-NAME.*`` directory beside it (:func:`data_dir`), so a symbolic link planted
in the directory is never followed, read through or deleted through; subdirectories must be real
directories (:func:`real_dir`); published directories get the modes of :func:`share_modes`
(group-writable directories in a group-writable cache, files writable by their owner only, nothing
world-writable).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: leftovers of killed writers are removed after this long
STALE_SECONDS = 3600
DATA_PREFIX = ".data-"
TMP_PREFIX = ".tmp-"


def current_umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``; else set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_modes(root: str | os.PathLike) -> tuple[int, int]:
    """``(directory mode, file mode)`` for what is published under ``root``: what ``mkdir``/``open`` would
    give under the umask, plus group read/write of directories when ``root`` is group-writable but not
    world-writable (a cache shared by a group: any member may replace or remove an entry), and never
    world-writable. Files are
    never group-writable: nothing is modified in place once published, and a file truncated under a
    reader that has it memory-mapped would kill the reader."""
    umask = current_umask()
    try:
        mode = os.stat(root).st_mode
    except OSError:
        mode = 0
    # group-writable and not world-writable: a group's directory (/tmp, world-writable, is nobody's group)
    shared = bool(mode & stat.S_IWGRP) and not mode & stat.S_IWOTH
    dir_mode = (0o777 & ~umask) | (0o070 if shared else 0)
    file_mode = (0o666 & ~umask) | (0o044 if shared else 0)
    return dir_mode & ~0o002, file_mode & ~0o022


def apply_modes(path: str | os.PathLike, root: str | os.PathLike) -> None:
    """Give ``path`` (a file, or a directory and everything in it) the :func:`share_modes` of ``root``;
    directories keep their set-group-ID bit (inherited from a shared cache). Links are left alone."""
    dir_mode, file_mode = share_modes(root)

    def fix(p: str) -> None:
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(p, dir_mode | (st.st_mode & stat.S_ISGID))
        elif stat.S_ISREG(st.st_mode):
            os.chmod(p, file_mode)

    fix(os.fspath(path))
    if os.path.isdir(path) and not os.path.islink(path):
        for top, dirs, files in os.walk(path):
            for name in dirs + files:
                fix(os.path.join(top, name))


def atomic_write(path: str | os.PathLike, write: Callable[[str], None], *, share: str | os.PathLike | None = None
                 ) -> None:
    """Call ``write(tmp_path)`` for a temporary file beside ``path`` and rename it into place.

    A crash or kill mid-write leaves any previous ``path`` intact and no partial file under its name. The
    file gets the mode ``open()`` would have given it (not the temporary file's 0600), or with ``share``
    the :func:`share_modes` of that directory.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{target.name}.", suffix=".tmp", dir=target.parent or ".")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if share is not None:
            apply_modes(tmp, share)
        else:
            os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def real_dir(path: Path, create: bool = True) -> Path:
    """``path`` as a real directory (created, with its parents, when ``create``), never a symbolic link:
    a subdirectory of a shared cache that someone replaced with a link raises OSError(ELOOP) instead of
    leading the writes (or the removals) elsewhere."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir()
            apply_modes(path, path.parent)  # a subdirectory of a group's cache is the group's too
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ELOOP, "not a directory of its own (a symbolic link or a file): not used", str(path))
    return path


def data_dir(link: Path) -> Path | None:
    """The directory the published name ``link`` stands for, or None when there is none or ``link`` is
    not one of ours: a symbolic link is followed only to a real directory ``.data-NAME.*`` beside it (a link
    planted to lead anywhere else is never followed); a real directory (an older layout) is itself."""
    try:
        st = os.lstat(link)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return link
    if not stat.S_ISLNK(st.st_mode):
        return None
    try:
        target = os.readlink(link)
    except OSError:
        return None
    if "/" in target or not target.startswith(f"{DATA_PREFIX}{link.name}."):
        return None
    d = link.parent / target
    try:
        return d if stat.S_ISDIR(os.lstat(d).st_mode) else None
    except OSError:
        return None


def new_data_dir(link: Path) -> Path:
    """A fresh hidden directory beside ``link`` to write a directory's new content into."""
    link.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{DATA_PREFIX}{link.name}.", dir=link.parent))


def publish_dir(data: Path, link: Path) -> None:
    """Make ``link`` name the finished directory ``data`` (from :func:`new_data_dir`), atomically.

    ``link`` becomes a relative symlink to ``data``; the directory it named before is removed after
    the swap. Readers see the old content or the new, never a mix and never nothing. ``data`` first gets
    the :func:`share_modes` of the directory it is published in. Whatever else had the name (a link that
    is not ours, a file) is replaced without following it.
    """
    apply_modes(data, link.parent)
    # the swap runs under the directory's lock: two processes publishing the same name at once would each
    # take the same directory as the old one, and the first one's data would be left behind unreferenced
    with _locked(link.parent):
        old = None
        try:
            st = os.lstat(link)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            old = data_dir(link)  # None for a link that is not ours: only the link itself is replaced
        elif st is not None and stat.S_ISDIR(st.st_mode):  # a real directory (older layout): move it aside first
            old = link.parent / f"{DATA_PREFIX}{link.name}.old-{os.getpid()}-{time.monotonic_ns()}"
            os.replace(link, old)
        tmp_link = link.parent / f"{TMP_PREFIX}link-{link.name}-{os.getpid()}-{time.monotonic_ns()}"
        os.symlink(data.name, tmp_link)
        try:
            os.replace(tmp_link, link)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_link)
            raise
    if old is not None and old != data:
        shutil.rmtree(old, ignore_errors=True)


LOCK_NAME = ".publish.lock"


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory/.publish.lock`` (created if need be, never through a link) for
    the few system calls of a swap; where locks are unavailable, the swap runs unlocked."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError:
        fd = None
    try:
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def remove_dir(link: Path) -> None:
    """Remove a published directory and its data (never what a link that is not ours points to)."""
    target = data_dir(link)
    if os.path.islink(link):
        link.unlink()
    if target is not None:
        shutil.rmtree(target, ignore_errors=True)


#: directories swept by this process: a sweep lists the whole directory, so it runs once per process and
#: directory (a job of 100 000 files stores 100 000 cache entries: a sweep per store was quadratic)
_SWEPT: set[str] = set()


def sweep_stale(root: Path, max_age: float = STALE_SECONDS, *, once: bool = True) -> None:
    """Remove leftovers of killed writers in ``root``: temp files and links, and data directories no
    link points to, older than ``max_age`` seconds. With ``once``, only the first call per directory in
    this process sweeps."""
    if once:
        if str(root) in _SWEPT:
            return
        _SWEPT.add(str(root))
    now = time.time()
    try:
        names = os.listdir(root)
    except OSError:
        return
    referenced = set()
    for name in names:
        p = root / name
        if p.is_symlink():
            with contextlib.suppress(OSError):
                referenced.add(os.readlink(p))
    for name in names:
        if not name.startswith((TMP_PREFIX, DATA_PREFIX)) or name in referenced:
            continue
        p = root / name
        with contextlib.suppress(OSError):
            if now - p.lstat().st_mtime > max_age:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink()
