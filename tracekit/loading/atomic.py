"""Writing outputs so that a crash or a kill never damages what was there: files and directories are
written under a temporary name and swapped in with one atomic rename.

- :func:`atomic_write` — one file: temp file beside it, fsync, ``os.replace``.
- :func:`publish_dir` — a directory (cache entry, dataset): the name is a symlink to a hidden data
  directory, swapped with ``os.replace`` (directories cannot be renamed over non-empty ones, and a
  rename-aside-then-rename-in would leave an instant with neither).
- :func:`sweep_stale` — removes what killed writers left behind (temp files, unreferenced data
  directories), once it is old enough that no live writer can still own it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

#: leftovers of killed writers are removed after this long
STALE_SECONDS = 3600
DATA_PREFIX = ".data-"
TMP_PREFIX = ".tmp-"


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` for a temporary file beside ``path`` and rename it into place.

    A crash or kill mid-write leaves any previous ``path`` intact and no partial file under its name.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{target.name}.", suffix=".tmp", dir=target.parent or ".")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def new_data_dir(link: Path) -> Path:
    """A fresh hidden directory beside ``link`` to write a directory's new content into."""
    link.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{DATA_PREFIX}{link.name}.", dir=link.parent))


def publish_dir(data: Path, link: Path) -> None:
    """Make ``link`` name the finished directory ``data`` (from :func:`new_data_dir`), atomically.

    ``link`` becomes a relative symlink to ``data``; the directory it named before is removed after
    the swap. Readers see the old content or the new, never a mix and never nothing.
    """
    old = None
    if link.is_symlink():
        old = link.parent / os.readlink(link)
    elif link.is_dir():  # a real directory (older layout): move it aside first
        old = link.parent / f"{DATA_PREFIX}{link.name}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.replace(link, old)
    tmp_link = link.parent / f"{TMP_PREFIX}link-{link.name}-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(data.name, tmp_link)
    os.replace(tmp_link, link)
    if old is not None and old.resolve() != data.resolve():
        shutil.rmtree(old, ignore_errors=True)


def remove_dir(link: Path) -> None:
    """Remove a published directory and its data."""
    if link.is_symlink():
        target = link.parent / os.readlink(link)
        link.unlink()
        shutil.rmtree(target, ignore_errors=True)
    elif link.is_dir():
        shutil.rmtree(link, ignore_errors=True)


def sweep_stale(root: Path, max_age: float = STALE_SECONDS) -> None:
    """Remove leftovers of killed writers in ``root``: temp files and links, and data directories no
    link points to, older than ``max_age`` seconds."""
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
