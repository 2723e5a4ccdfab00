"""A worker of :func:`tracekit.parsers.kineto.reader._parse_split`: ``python -m tracekit.parsers.kineto --part PATH
START END OUT_DIR FRACTION`` parses one part of a big plain trace into ``OUT_DIR``."""

import sys

from .reader import _parse_part

if sys.argv[1:2] == ["--part"]:
    _parse_part(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1")
