"""Line rates as people write them: ``100Gbit``, ``25GB/s``, ``200mbit``, ``1e9`` — parsed to bits per
second, and printed back.

Bits and bytes are told apart by the unit, never guessed: ``bit``, ``b/s`` and a bare number are bits;
``B/s`` and ``Bps`` are bytes (×8). Spellings that mean bits to some people and bytes to others are refused
with a suggestion: ``tc`` reads ``100mbps`` as *megabytes* per second while most people mean megabits.
Decimal prefixes are powers of 1000 (link rates are quoted that way); ``Ki``/``Mi``/``Gi``/``Ti`` are
powers of 1024.
"""

from __future__ import annotations

import math
import os
import re

from tracekit.model.diagnostics import TraceError
from tracekit.model.options import naming

_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 1024.0, "mi": 1024.0**2, "gi": 1024.0**3, "ti": 1024.0**4}
#: rates outside this range are almost certainly a typo (1 kbit/s .. 100 Tbit/s)
MIN_BPS = 1e3
MAX_BPS = 1e14

_UNIT = re.compile(r"^(?P<prefix>[kmgtKMGT]i?)?(?P<unit>bits?(?:/s)?|b/s|B/s|Bps|bytes?/s|bps)?$")


def parse_rate(text: str, *, option: str = "link_bw=") -> float:
    """Parse a line rate into bits per second.

    Accepted: ``100Gbit``, ``100gbit``, ``100 Gbit/s``, ``100Gb/s``, ``200mbit``, ``25GB/s``,
    ``25GBps``, ``3.125GiB/s``, ``1e9`` (bits/s), ``1e9bit``. Raises :class:`TraceError` with a one-line
    explanation for anything else (unknown or ambiguous units, zero, negative, absurd values).
    """
    s = text.strip()
    m = re.fullmatch(rf"(?P<num>{_NUMBER})\s*(?P<rest>.*)", s)
    if not m:
        raise TraceError(None, f"{naming(option, text)}: expected a number and a unit, e.g. 100Gbit or 25GB/s")
    value = float(m.group("num"))
    rest = m.group("rest").strip()
    u = _UNIT.fullmatch(rest)
    if not u and re.fullmatch(r"[kmgtKMGT]?i?[bB](?:ytes?|its?)?", rest):
        raise TraceError(None, f"{naming(option, text)} is a size, not a rate: did you mean {m.group('num')}{rest}/s?")
    if not u:
        raise TraceError(None, f"{naming(option, text)}: unknown unit {rest!r}; write bits as 100Gbit (or 100Gb/s) "
                               "and bytes as 12.5GB/s")
    prefix = (u.group("prefix") or "").lower()
    unit = u.group("unit") or ""
    if unit == "bps":
        raise TraceError(None, f"{naming(option, text)} is ambiguous: tc reads '{rest}' as bytes per second, most "
                               f"people as bits; write {m.group('num')}{prefix.upper()}bit or "
                               f"{m.group('num')}{prefix.upper()}B/s")
    if unit == "" and prefix:
        raise TraceError(None, f"{naming(option, text)}: say bits or bytes, e.g. {m.group('num')}{prefix.upper()}bit "
                               f"or {m.group('num')}{prefix.upper()}B/s")
    is_bytes = unit.startswith(("B", "byte"))
    bps = value * _PREFIX[prefix] * (8.0 if is_bytes else 1.0)
    if not math.isfinite(bps) or bps <= 0:
        raise TraceError(None, f"{naming(option, text)}: a line rate must be a positive number")
    if bps < MIN_BPS or bps > MAX_BPS:
        raise TraceError(None, f"{naming(option, text)} = {format_rate(bps)} is outside "
                               f"{format_rate(MIN_BPS)}..{format_rate(MAX_BPS)}; is the unit right?")
    return bps


_SELECTOR = re.compile(r"^[A-Za-z0-9_.:/\-]+$")


def parse_link_rates(text: str, *, option: str = "link_bw=") -> tuple[float | None, dict[str, float]]:
    """``100Gbit`` (every link), ``dp=25Gbit,tp=900GB/s`` (the links of process groups, link classes or transports
    by name: ``inter=400gbit``, ``net=100gbit``, ``nvlink=900GB/s``) or both, comma-separated: returns (the rate of
    every link not named, ``{selector: rate}``)."""
    default: float | None = None
    named: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise TraceError(None, f"{naming(option, text)}: an empty item")
        sel, eq, rate = part.partition("=")
        if not eq:
            if default is not None:
                raise TraceError(None, f"{naming(option, text)}: two rates for every link; name the links of the "
                                       "others, e.g. dp=25Gbit")
            default = parse_rate(part, option=option)
            continue
        sel = sel.strip()
        if not _SELECTOR.match(sel):
            raise TraceError(None, f"{naming(option, part)}: {sel!r} is not a process group name, description, "
                                   "intra, inter or a transport (net, ib, socket, nvlink, p2p, shm)")
        named[sel] = parse_rate(rate, option=option)
    return default, named


def count(n: int, noun: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """``1 rank``, ``3 ranks`` (``1,024 ranks`` with ``grouped``): a count and its noun in the number it takes;
    ``plural`` where that is not the noun + s."""
    word = noun if n == 1 else plural or noun + "s"
    return f"{n:,} {word}" if grouped else f"{n} {word}"



def format_rate(bps: float | None) -> str:
    """``1e11`` → ``100 Gbit/s``; ``3e8`` → ``300 Mbit/s`` (three significant digits)."""
    if bps is None:
        return "–"
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if abs(bps) >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")
_DURATION_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def format_duration(ns: float | int) -> str:
    """``1234567`` → ``1.23 ms``: three significant digits, or whole units from 100 up."""
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            v = ns / scale
            return f"{v:.3g} {unit}" if abs(v) < 100 else f"{v:.0f} {unit}"
    return f"{ns:.0f} ns"


def parse_duration(text: str, *, option: str = "latency=") -> int:
    """``20us``, ``1.5ms``, ``300ns`` → nanoseconds; a unit is required (one-line error otherwise)."""
    m = _DURATION.match(text)
    if not m:
        raise TraceError(None, f"{naming(option, text)} is not a duration (write e.g. 20us, 1.5ms or 300ns)")
    return round(float(m.group(1)) * _DURATION_NS[m.group(2)])


#: default memory budget of one unit of work (a rank); a file whose in-memory parse and analysis would need
#: more (about 1.5x its JSON size) is parsed and analysed in bounded memory instead
DEFAULT_BUDGET = 1 << 30


def parse_size(text: str | int | None) -> int | None:
    """``"1G"``, ``"512M"``, ``"2048"`` → bytes (binary units)."""
    if text is None or isinstance(text, int):
        return text
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if t[-1:] in "KMGT" else t)
    except ValueError:
        raise TraceError(None, f"not a size: {text!r} (e.g. 1G, 512M)") from None
    if value <= 0:
        raise TraceError(None, f"not a size: {text!r}")
    return int(value * scale)


def memory_budget(explicit: str | int | None = None) -> int:
    """``explicit``, else ``$TRACEKIT_MEMORY_BUDGET``, else :data:`DEFAULT_BUDGET` (bytes per unit)."""
    return parse_size(explicit) or parse_size(os.environ.get("TRACEKIT_MEMORY_BUDGET")) or DEFAULT_BUDGET
