"""The command's allocator settings: set once, a user's own settings kept, freed memory given back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tracekit import allocators


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> _FakeLibc:
    fake = _FakeLibc()
    monkeypatch.setattr(allocators, "_libc", lambda: fake)
    for name in allocators._GLIBC_ENV:
        monkeypatch.delenv(name, raising=False)
    return fake


def test_configure_sets_glibc_heap(libc: _FakeLibc) -> None:
    allocators.configure()
    assert libc.calls == [("mallopt", p, v) for p, v in allocators.GLIBC_HEAP.items()]


@pytest.mark.parametrize("name", allocators._GLIBC_ENV)
def test_users_glibc_setting_wins(libc: _FakeLibc, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "2")
    allocators.configure()
    assert libc.calls == []


def test_release_memory_trims_glibc_heap(libc: _FakeLibc) -> None:
    allocators.release_memory()
    assert libc.calls == [("malloc_trim", 0)]


def test_without_glibc_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocators, "_libc", lambda: None)
    allocators.configure()
    allocators.release_memory()


def _polars_conf(env: dict[str, str]) -> str:
    """``_RJEM_MALLOC_CONF`` as polars sees it when the command line configured the process first."""
    code = ("from tracekit import allocators; allocators.configure(); import os, polars; "
            "print(os.environ['_RJEM_MALLOC_CONF'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_polars_allocator_set_before_polars_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    # polars puts its own defaults first; jemalloc reads the options in order, so the last word is ours (or the user's)
    assert _polars_conf(env).endswith(allocators.POLARS_ALLOCATOR)
    assert _polars_conf({**env, "_RJEM_MALLOC_CONF": "dirty_decay_ms:7"}).endswith(",dirty_decay_ms:7")


@pytest.mark.skipif(allocators._libc() is None, reason="glibc only")
def test_real_glibc_accepts_the_settings() -> None:
    code = ("from tracekit import allocators; libc = allocators._libc(); "
            "print(all(libc.mallopt(p, v) == 1 for p, v in allocators.GLIBC_HEAP.items()))")
    env = {k: v for k, v in os.environ.items() if k not in allocators._GLIBC_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_arrow_allocator_without_huge_pages() -> None:
    code = ("from tracekit import allocators; allocators.configure(); import os, pyarrow; "
            "print(os.environ['MIMALLOC_ALLOW_THP'])")
    env = {k: v for k, v in os.environ.items() if k != "MIMALLOC_ALLOW_THP"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "0"
    env["MIMALLOC_ALLOW_THP"] = "1"  # a user's own setting wins
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "1"
