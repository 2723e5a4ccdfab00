"""Decoding the records of a Horovod timeline (step 3 of :mod:`tracekit.parsers.horovod`): the msgspec
structs of the fast typed decoder and of the lenient one for third-party rewrites, the phase codes, and
:class:`_Columns`, one batch of records as numpy columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

# ---------------------------------------------------------------------------------------------------
# Record decoding

_NO_TS = -(1 << 63)
_NO_PID = -(1 << 63)
_MAX_TS_US = (1 << 63) // 1000 - 1
_PID_TABLE_MAX = 1 << 22

PH_B, PH_E, PH_X, PH_I, PH_M, PH_OTHER = 0, 1, 2, 3, 4, 5
_PH_CODES = {"B": PH_B, "E": PH_E, "X": PH_X, "i": PH_I, "I": PH_I, "M": PH_M}


class _Args(msgspec.Struct, gc=False):
    name: str | None = None
    dtype: str | None = None
    shape: str | None = None
    start_time_since_epoch_in_micros: int | None = None


class _Rec(msgspec.Struct, gc=False):
    """The fields of a Horovod record this parser uses (unknown keys are ignored)."""

    ph: str = ""
    name: str = ""
    ts: int = _NO_TS
    pid: int = _NO_PID
    dur: int = 0
    args: _Args | None = None


class _LooseRec(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    ts: Any = None
    pid: Any = None
    dur: Any = None
    args: Any = None


_FAST = msgspec.json.Decoder(list[_Rec])
_GET_PH, _GET_NAME, _GET_TS, _GET_PID, _GET_DUR, _GET_ARGS = (
    attrgetter(f) for f in ("ph", "name", "ts", "pid", "dur", "args"))
_GET_DTYPE, _GET_SHAPE = attrgetter("dtype"), attrgetter("shape")


class _Codes(dict):
    """str -> dense int code; a missing key gets the next code (so lookups can run in ``map``)."""

    def __missing__(self, key: str | None) -> int:
        code = self[key] = len(self)
        return code


class _PhCodes(dict):
    def __missing__(self, key: str) -> int:
        return PH_OTHER


_PH_LOOKUP = _PhCodes(_PH_CODES)
_LOOSE = msgspec.json.Decoder(list[_LooseRec])
_LOOSE_ONE = msgspec.json.Decoder(_LooseRec)
#: what a damaged batch or record raises in the decoders
_DAMAGE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


def _loose_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and np.isfinite(v):
        return round(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                return None
            return round(f) if np.isfinite(f) else None
    return None


def _loose_ts_ns(v: Any) -> int:
    """``ts`` in µs (int, float or numeric string) to ns; ``_NO_TS`` when unusable."""
    if isinstance(v, bool) or v is None:
        return _NO_TS
    if isinstance(v, int):
        return v * 1000 if abs(v) <= _MAX_TS_US else _NO_TS
    if isinstance(v, str):
        try:
            v = float(v) if any(c in v for c in ".eE") else int(v)
        except ValueError:
            return _NO_TS
        return _loose_ts_ns(v)
    if isinstance(v, float) and np.isfinite(v) and abs(v) <= _MAX_TS_US:
        return round(v * 1000)
    return _NO_TS


def _loose_args(v: Any) -> _Args | None:
    if not isinstance(v, dict):
        return None

    def s(key: str) -> str | None:
        x = v.get(key)
        return None if x is None else str(x)

    start = _loose_int(v.get("start_time_since_epoch_in_micros"))
    return _Args(name=s("name"), dtype=s("dtype"), shape=s("shape"), start_time_since_epoch_in_micros=start)


@dataclass
class _Columns:
    """One batch of records as columns (``ts`` already in ns; ``_NO_TS``/``_NO_PID`` when absent)."""

    ph: np.ndarray
    name: np.ndarray
    ts: np.ndarray
    pid: np.ndarray
    dur_nonzero: np.ndarray
    meta: dict[int, _Args]  # position -> args of the M records (one or two per tensor)
    end_idx: np.ndarray  # positions of the E records carrying args (the top-level ends) ...
    end_dtype: np.ndarray  # ... their dtype and shape as codes of _Parser.dtypes / .shapes
    end_shape: np.ndarray
