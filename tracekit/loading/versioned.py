"""A directory whose content is replaced atomically, and which is all in one place: ``rm -rf HOME`` removes it all.

Layout::

    HOME/
      current -> .version-XXXX     the published content (a relative link, swapped with one rename)
      .version-XXXX/               a version: what was published, never modified in place afterwards

A writer builds a new version inside ``HOME`` (:meth:`Version.start`), then swaps ``current`` to it
(:meth:`Version.publish`): readers see the old content or the new, never a mix and never nothing. Locks are
``flock`` on directories (no lock file to leave behind): ``HOME`` itself for the few calls of a swap or a sweep, a
version's directory exclusively while it is written and shared while it is read (:class:`Reading`), so that an old
version is removed only once no reader holds it, and a version no live writer holds (a killed build) is removed by
the next writer. Where ``flock`` is not available (some network file systems), versions left over are removed once
older than :data:`tracekit.loading.atomic.STALE_SECONDS`.

A link planted as ``HOME/current`` is never followed: it must name a real directory ``.version-*`` of ``HOME``
(:func:`current`).
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

from tracekit.loading.atomic import STALE_SECONDS, TMP_PREFIX, apply_modes

POINTER = "current"
VERSION_PREFIX = ".version-"


def current(home: Path, *, follow: bool = True) -> Path | None:
    """The version ``HOME/current`` publishes, or None (none yet, or not one of ours: a link named ``current`` is
    followed only to a real directory ``.version-*`` inside ``HOME``). Without ``follow``, a ``HOME`` that is itself a
    symbolic link is not one (a name in a shared cache)."""
    try:
        if not stat.S_ISDIR(os.stat(home).st_mode) or (not follow and os.path.islink(home)):
            return None
        target = os.readlink(home / POINTER)
    except OSError:
        return None
    if "/" in target or not target.startswith(VERSION_PREFIX):
        return None
    v = home / target
    try:
        return v if stat.S_ISDIR(os.lstat(v).st_mode) else None
    except OSError:
        return None


def _lock(fd: int, how: int) -> bool | None:
    """``flock``: True when taken, False when another holds it (non-blocking), None where locks are unavailable."""
    try:
        fcntl.flock(fd, how)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``HOME`` for a swap or a sweep (unlocked where locks are unavailable)."""
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _lock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open_dir(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None


class Reading:
    """A shared lock on a published version for as long as it is read (released by :meth:`close`, or with the
    object): a writer publishing another version leaves this one in place until then."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    @classmethod
    def of(cls, home: Path, *, follow: bool = True) -> tuple[Path, Reading] | None:
        """The current version of ``HOME``, held; None when there is none."""
        for _ in range(8):  # a swap and a removal between reading the link and locking: read it again
            v = current(home, follow=follow)
            if v is None:
                return None
            fd = _open_dir(v)
            if fd is None:
                continue
            _lock(fd, fcntl.LOCK_SH)
            if os.path.isdir(v) and os.path.samestat(os.fstat(fd), os.lstat(v)):
                return v, cls(fd)
            os.close(fd)
        return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


class Version:
    """A new version of ``HOME`` being written (at :attr:`path`), held exclusively until published or abandoned."""

    def __init__(self, home: Path, path: Path, fd: int | None, created_home: bool) -> None:
        self.home, self.path, self._fd, self._created_home = home, path, fd, created_home

    @classmethod
    def start(cls, home: Path) -> Version:
        """A fresh version directory inside ``HOME`` (made, with its parents, if need be); versions and pointers
        that killed writers left are removed first."""
        created = not os.path.lexists(home)
        home.mkdir(parents=True, exist_ok=True)
        if created:
            apply_modes(home, home.parent)  # in a group's cache, the group's too (it may replace versions)
        with _locked(home):  # made and locked at once: a sweep never sees a live writer's version unlocked
            sweep(home)
            path = Path(tempfile.mkdtemp(prefix=VERSION_PREFIX, dir=home))
            fd = _open_dir(path)
            if fd is not None:
                _lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(home, path, fd, created)

    def publish(self, keep: Callable[[Path], bool] | None = None) -> tuple[Path, Reading]:
        """Make this version current and return it, held for reading. ``keep(old)``: whether the version already
        current (another writer's, published meanwhile) serves instead; this one is then dropped and that one
        returned. The version replaced is removed unless a reader holds it (then the next writer's sweep does)."""
        apply_modes(self.path, self.home.parent)
        with _locked(self.home):
            old = current(self.home)
            if old is not None and keep is not None and keep(old):
                held = Reading.of(self.home)
                if held is not None:
                    self.abort()
                    return held
            tmp = self.home / f"{TMP_PREFIX}{POINTER}-{os.getpid()}-{time.monotonic_ns()}"
            os.symlink(self.path.name, tmp)
            try:
                os.replace(tmp, self.home / POINTER)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            if self._fd is not None:
                _lock(self._fd, fcntl.LOCK_SH)  # readable now; held on by the caller
            if old is not None and old != self.path:
                _remove_unheld(old)
        fd, self._fd = self._fd, None
        return self.path, Reading(fd)

    def abort(self) -> None:
        """Remove this version (a failed or superseded build); a ``HOME`` this writer made and left empty goes too."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._created_home:
            with contextlib.suppress(OSError):
                self.home.rmdir()  # only when empty: another writer's version or a published one stays


def _remove_unheld(version: Path, max_age: float | None = None) -> None:
    """Remove ``version`` unless someone holds it (a reader, or a live writer); where locks are unavailable, only
    when ``max_age`` is given and it is older than that."""
    fd = _open_dir(version)
    if fd is None:
        return
    try:
        got = _lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if got is None and max_age is not None:
            with contextlib.suppress(OSError):
                got = time.time() - os.fstat(fd).st_mtime > max_age
        if got:
            shutil.rmtree(version, ignore_errors=True)
    finally:
        os.close(fd)


def sweep(home: Path, max_age: float = STALE_SECONDS) -> None:
    """Remove what killed writers left in ``HOME`` (call under its lock): versions that are not current and that no
    one holds, and temporary pointers."""
    cur = current(home)
    try:
        names = os.listdir(home)
    except OSError:
        return
    for name in names:
        p = home / name
        if name.startswith(VERSION_PREFIX) and (cur is None or name != cur.name):
            _remove_unheld(p, max_age)
        elif name.startswith(f"{TMP_PREFIX}{POINTER}-"):
            with contextlib.suppress(OSError):
                p.unlink()


def is_home(home: Path) -> bool:
    """Whether ``HOME`` is laid out as here (it has a pointer, or a version being written)."""
    try:
        return any(n == POINTER or n.startswith(VERSION_PREFIX) for n in os.listdir(home))
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return False
        raise
