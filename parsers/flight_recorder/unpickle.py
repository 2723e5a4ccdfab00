"""Reading a pickled Flight Recorder dump without trusting it.

A pickle is a program: ``pickle.load`` runs whatever callable it names (``os.system`` through ``__reduce__``).
:func:`loads` runs the standard unpickler with every way to reach a callable refused — ``find_class`` (the
GLOBAL, STACK_GLOBAL, INST and EXT opcodes ask it for every class or function; OBJ, NEWOBJ and REDUCE can only
call what it returned) and ``persistent_load`` (PERSID, BINPERSID) — and without out-of-band buffers (NEXT_BUFFER).
What is left builds plain data only: dicts, lists, tuples, sets, str, bytes, numbers, bool and None, which is all a
dump holds (torch writes them with its own pickler, protocol 2).

It is Python's own pure-Python unpickler (``pickle._Unpickler``), not the C one: the C unpickler keeps its memo in an
array sized by the largest index a PUT opcode names, so five bytes (``LONG_BINPUT`` of a billion) allocate gigabytes
(21 s of CPU here); the Python one keeps a dict. A dump is kilobytes to a few megabytes, read in well under a second.
"""

from __future__ import annotations

import io
import pickle
from typing import Any


class RefusedPickle(pickle.UnpicklingError):
    """The pickle asked for something a dump never holds (a class, a function, a persistent object)."""


class _PlainData(pickle._Unpickler):
    """An unpickler that builds containers and numbers and refuses every global and persistent reference."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"it names the global {module[:60]}.{name[:60]}, which a dump never holds "
                            "(refused: reading it would run code)")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("it holds a persistent reference, which a dump never holds (refused)")


def loads(data: bytes) -> Any:
    """The plain data of a pickle, or :class:`pickle.UnpicklingError` (:class:`RefusedPickle` for a pickle that names
    code), ``EOFError``, ``ValueError``, ... for damaged ones; never runs code from ``data``."""
    return _PlainData(io.BytesIO(data)).load()
