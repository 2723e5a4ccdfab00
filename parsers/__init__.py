"""Input formats: sniffing and one parser per format. Each parser turns one file into a
:class:`tracekit.model.schema.ParsedFile`; parsers know formats, not analysis."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracekit.model.diagnostics import TraceError

from .source import Blocks

if TYPE_CHECKING:  # the package stays light (no pyarrow) until a parser is used
    from tracekit.model.schema import ParsedFile


@dataclass(frozen=True)
class Format:
    """A registered input format: its name, a sniffer over the decompressed head, and its parser."""

    name: str
    sniff: Callable[[bytes], bool]
    parse: Callable[[str], ParsedFile]
    version: str


#: (format name, module) of the registered formats, most specific sniffer first. Flight Recorder dumps first (a pickle,
#: or JSON with the dump's keys and no "traceEvents"); Horovod next: its sniffer rejects anything Kineto-like
#: ("traceEvents", "cat", "tid")
_REGISTERED = (("flight-recorder", "flight_recorder"), ("horovod", "horovod"), ("kineto", "kineto"),
               ("nccl-log", "nccl"))


def _formats() -> Iterator[Format]:
    """The registered formats in order, each parser module imported only when its turn comes (a job of
    Kineto traces never imports the NCCL-log parser)."""
    for name, module in _REGISTERED:
        mod = importlib.import_module(f".{module}", __name__)
        yield Format(name, mod.sniff, mod.parse, mod.PARSER_VERSION)


def formats() -> list[Format]:
    """The registered formats, most specific sniffer first."""
    return list(_formats())


def _head(path: str, size: int = 1 << 16) -> tuple[bytes, TraceError | None]:
    """The first decompressed bytes of ``path`` and the error that stopped reading, if any."""
    blocks = Blocks(path, block_size=size)
    head = b""
    for _, block in blocks:
        head += block
        if len(head) >= size:
            break
    return head[:size], blocks.error


def detect(path: str) -> Format | None:
    """The format of ``path`` from its content (not its name), or None."""
    head, _ = _head(path)
    if not head.strip():
        return None
    for fmt in _formats():
        if fmt.sniff(head):
            return fmt
    return None


def parse(path: str) -> ParsedFile:
    """Parse one file of any known format, or raise :class:`TraceError` naming it."""
    if not os.path.exists(path):
        raise TraceError(path, "no such file")
    if os.path.isdir(path):
        raise TraceError(path, "is a directory")
    if os.path.getsize(path) == 0:
        raise TraceError(path, "empty file")
    head, error = _head(path)
    if not head.strip():
        if error is not None:
            raise error
        raise TraceError(path, "empty file (nothing but whitespace)")
    for fmt in _formats():
        if fmt.sniff(head):
            return fmt.parse(path)
    raise TraceError(path, "not a trace tracekit can read (expected a PyTorch-profiler JSON, "
                     "an NCCL debug log, a Horovod timeline or a Flight Recorder dump)", offset=0)
