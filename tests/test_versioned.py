"""A directory of versions behind an atomically swapped ``current`` (tracekit/loading/versioned.py): what a dataset is
on disk. Readers keep the version they hold; killed writers' versions go; a planted link is never followed."""

from __future__ import annotations

import os
from pathlib import Path

from tracekit.loading import versioned


def _publish(home: Path, text: str) -> tuple[Path, versioned.Reading]:
    v = versioned.Version.start(home)
    (v.path / "data.txt").write_text(text)
    return v.publish()


def test_a_version_is_published_and_the_old_one_goes_unless_read(tmp_path: Path) -> None:
    home = tmp_path / "ds"
    first, held = _publish(home, "one")
    assert versioned.current(home) == first and (home / "current" / "data.txt").read_text() == "one"
    second, held2 = _publish(home, "two")  # the first is held by its writer's reading: it stays
    assert versioned.current(home) == second and first.is_dir()
    held.close()
    held2.close()
    third, held3 = _publish(home, "three")  # nobody holds the second: removed at the swap; the first by the sweep
    held3.close()
    assert not second.exists() and not first.exists()
    assert sorted(os.listdir(home)) == sorted(["current", third.name])


def test_a_reader_keeps_its_version(tmp_path: Path) -> None:
    home = tmp_path / "ds"
    _, h = _publish(home, "one")
    h.close()
    got = versioned.Reading.of(home)
    assert got is not None
    old, reading = got
    _, h = _publish(home, "two")
    h.close()
    assert (old / "data.txt").read_text() == "one"  # still there for its reader
    reading.close()
    v = versioned.Version.start(home)  # the next writer sweeps it
    assert not old.exists()
    v.abort()


def test_a_killed_writers_version_is_swept_and_a_failed_one_leaves_nothing(tmp_path: Path) -> None:
    home = tmp_path / "ds"
    _, h = _publish(home, "one")
    h.close()
    dead = home / f"{versioned.VERSION_PREFIX}killed"
    dead.mkdir()  # no writer holds it
    (dead / "half.parquet").write_bytes(b"x")
    versioned.Version.start(home).abort()
    assert not dead.exists() and versioned.current(home) is not None
    fresh = tmp_path / "new"
    versioned.Version.start(fresh).abort()
    assert not fresh.exists()  # made by the failed writer, removed with it


def test_a_live_writers_version_is_not_swept(tmp_path: Path) -> None:
    home = tmp_path / "ds"
    writing = versioned.Version.start(home)
    other = versioned.Version.start(home)  # sweeps, but the first is held
    assert writing.path.is_dir()
    other.abort()
    writing.abort()


def test_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    home = tmp_path / "ds"
    home.mkdir()
    os.symlink(victim, home / "current")
    assert versioned.current(home) is None and versioned.Reading.of(home) is None
    os.symlink(home, tmp_path / "link")
    _, h = _publish(home, "one")
    h.close()
    assert versioned.current(tmp_path / "link") is not None
    assert versioned.current(tmp_path / "link", follow=False) is None  # in a shared cache, a link is no home
    assert os.listdir(victim) == []
