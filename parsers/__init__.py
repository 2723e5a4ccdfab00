"""Input formats: sniffing and one parser per format. Each parser turns one file into a
:class:`tracekit.schema.ParsedFile`; parsers know formats, not analysis."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from tracekit.diagnostics import TraceError
from tracekit.schema import ParsedFile

from .source import read_head


@dataclass(frozen=True)
class Format:
    """A registered input format: its name, a sniffer over the decompressed head, and its parser."""

    name: str
    sniff: Callable[[bytes], bool]
    parse: Callable[[str], ParsedFile]
    version: str


def formats() -> list[Format]:
    """The registered formats, most specific sniffer first."""
    from . import horovod, kineto

    found = [
        Format("horovod", horovod.sniff, horovod.parse, horovod.PARSER_VERSION),
        Format("kineto", kineto.sniff, kineto.parse, kineto.PARSER_VERSION),
    ]
    return found


def detect(path: str) -> Format | None:
    """The format of ``path`` from its content (not its name), or None."""
    head = read_head(path)
    if not head.strip():
        return None
    for fmt in formats():
        if fmt.sniff(head):
            return fmt
    return None


def parse(path: str) -> ParsedFile:
    """Parse one file of any known format, or raise :class:`TraceError` naming it."""
    if not os.path.exists(path):
        raise TraceError(path, "no such file")
    if os.path.getsize(path) == 0:
        raise TraceError(path, "empty file")
    fmt = detect(path)
    if fmt is None:
        raise TraceError(path, "not a trace tracekit can read (expected a PyTorch-profiler JSON, "
                         "an NCCL debug log or a Horovod timeline)", offset=0)
    return fmt.parse(path)
