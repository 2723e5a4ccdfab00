"""Input formats: sniffing and one parser per format. Each parser turns one file into a
:class:`tracekit.model.schema.ParsedFile`; parsers know formats, not analysis."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import ParsedFile

from .source import Blocks


@dataclass(frozen=True)
class Format:
    """A registered input format: its name, a sniffer over the decompressed head, and its parser."""

    name: str
    sniff: Callable[[bytes], bool]
    parse: Callable[[str], ParsedFile]
    version: str


def formats() -> list[Format]:
    """The registered formats, most specific sniffer first."""
    from . import horovod, kineto, nccl_log

    # Horovod first: its sniffer rejects anything Kineto-like ("traceEvents", "cat", "tid")
    found = [
        Format("horovod", horovod.sniff, horovod.parse, horovod.PARSER_VERSION),
        Format("kineto", kineto.sniff, kineto.parse, kineto.PARSER_VERSION),
        Format("nccl-log", nccl_log.sniff, nccl_log.parse, nccl_log.PARSER_VERSION),
    ]
    return found


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
    for fmt in formats():
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
    for fmt in formats():
        if fmt.sniff(head):
            return fmt.parse(path)
    raise TraceError(path, "not a trace tracekit can read (expected a PyTorch-profiler JSON, "
                     "an NCCL debug log or a Horovod timeline)", offset=0)
