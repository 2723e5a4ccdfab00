"""The Horovod timeline parser: one timeline → a :class:`~tracekit.model.schema.ParsedFile` (the format's
contract, every table it writes: :mod:`tracekit.parsers.horovod.reader`).

Its public face is :func:`parse` (with :func:`sniff` and :data:`PARSER_VERSION`, what
:func:`tracekit.parsers.formats` registers); the stages a timeline goes through are modules named for their job:

``reader.py``       :func:`parse`: blocks → name repair → :mod:`tracekit.parsers.json_stream` batches → decode and pair
                    → the tables
``phases.py``       what the phases and ops are (``FORMAT``, phase kinds, ops, dtype sizes)
``name_repair.py``  tensor names written without JSON escaping, repaired in the byte stream
``records.py``      the msgspec structs, lenient decoding of rewrites
``pairing.py``      the streaming state: B/E pairing, op instances, rank ticks
``tables.py``       the output tables (``events``, ``collectives``, ``horovod_*``)
"""

from .reader import FORMAT, FUSION_TOL_NS, PARSER_VERSION, parse, phase_kind, sniff

__all__ = ["FORMAT", "FUSION_TOL_NS", "PARSER_VERSION", "parse", "phase_kind", "sniff"]
