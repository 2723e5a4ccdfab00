"""The PyTorch profiler (Kineto) Chrome-trace JSON parser: one file → a :class:`~tracekit.model.schema.ParsedFile`.

Its public face is :func:`parse` (with :func:`sniff` and :data:`PARSER_VERSION`, what
:func:`tracekit.parsers.formats` registers); the stages a file goes through are modules named for their job:

``reader.py``   :func:`parse`: the file streamed in batches (:mod:`tracekit.parsers.json_stream`), the C scanner on
                threads, a big plain file split across processes (``__main__.py`` runs a part)
``scan.c``      the C batch scanner (the extension ``tracekit.parsers.kineto.scan``, where it is built)
``records.py``  event categories, the msgspec structs, the string table, the ``_Accumulator`` batches go into
``columns.py``  a batch → Arrow columns (the typed path, Arrow's JSON reader, the exact per-record path)
``tables.py``   the output tables: kinds, lanes, iterations, the clock base, the writer's era
``comms.py``    collective metadata → the ``collectives`` table (process groups, sizes, gloo's groups)
"""

from .reader import PARSER_VERSION, native_scan, parse, scanner_threads, sniff

__all__ = ["PARSER_VERSION", "native_scan", "parse", "scanner_threads", "sniff"]
