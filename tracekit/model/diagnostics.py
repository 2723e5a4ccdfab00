"""User-facing errors and warnings: one line each, naming the file and the place."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: characters that would break a one-line message or drive the terminal: C0/C1 controls (newline, escape,
#: carriage return), line/paragraph separators and the bidirectional overrides
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` on one line, every control character shown as its escape (a file named ``a\\nb`` reads
    ``a\\\\nb``); what a message quotes from a file name or a trace cannot break the line or steer the
    terminal."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _where(offset: int | None, line: int | None) -> str:
    if line is not None:
        return f"line {line}"
    if offset is not None:
        return f"byte {offset}"
    return ""


class TraceError(Exception):
    """A problem with the user's input or arguments; the CLI prints it as one line and exits non-zero."""

    def __init__(self, path: str | None, message: str, *, offset: int | None = None,
                 line: int | None = None) -> None:
        self.path = path
        self.message = message
        self.offset = offset
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.path, _where(self.offset, self.line)) if p]
        return printable(": ".join([*parts, self.message]))

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # errors travel pickled from worker processes (local pool, Dask); the default reduction would
        # call __init__ with the formatted message only
        return (_rebuild, (self.path, self.message, self.offset, self.line))


def _rebuild(path: str | None, message: str, offset: int | None, line: int | None) -> TraceError:
    return TraceError(path, message, offset=offset, line=line)


@dataclass(frozen=True)
class Diagnostic:
    """A warning about an input that was still parsed (damage, unknown content, lost bytes)."""

    path: str
    message: str
    offset: int | None = None
    line: int | None = None
    level: str = "warning"

    def __str__(self) -> str:
        parts = [p for p in (self.path, _where(self.offset, self.line)) if p]
        return printable(": ".join([*parts, self.message]))
