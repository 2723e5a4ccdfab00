"""Small tmpfs file systems for tests of full and read-only disks (tests/test_shared_cache.py, tests/test_faults.py):
whether this machine lets the suite mount one (root and mount rights), and one mounted for the length of a block."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@functools.cache
def can_mount() -> bool:
    """Root, ``mount`` found, and a 64 KiB tmpfs mounts (asked once per process)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    with tempfile.TemporaryDirectory() as d:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True).returncode:
            return False
        subprocess.run(["umount", d], capture_output=True)
    return True


needs_mount = pytest.mark.skipif(not can_mount(), reason="needs root and the right to mount a tmpfs")


@contextlib.contextmanager
def tmpfs(options: str) -> Iterator[Path]:
    """A tmpfs mounted with ``options`` (``size=400k``) on a fresh directory; unmounted and removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="tracekit-tmpfs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()
