"""Number formats every view shares: durations, sizes, shares, rates and changes, as people read them."""

from __future__ import annotations

from rich.markup import escape

from tracekit.model.diagnostics import printable
from tracekit.model.units import format_duration


def fmt_ns(ns: float | int | None) -> str:
    """``1234567`` → ``1.23 ms`` (``–`` for None)."""
    return "–" if ns is None else format_duration(ns)


def fmt_bytes(n: float | int | None) -> str:
    """``3145728`` → ``3.15 MB`` (decimal units, as link rates are)."""
    if n is None:
        return "–"
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_share(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def fmt_gbps(x: float | None) -> str:
    """Gbit/s → ``348 Mbit/s``."""
    from tracekit.model.units import format_rate

    return "–" if x is None else format_rate(x * 1e9)


def fmt_delta_ns(ns: float | int | None) -> str:
    """``-1234567`` → ``−1.23 ms``; ``+`` for growth."""
    if ns is None:
        return "–"
    if ns == 0:
        return "0"
    return ("+" if ns > 0 else "−") + fmt_ns(abs(ns))


def fmt_change(base: float | None, new: float | None) -> str:
    """Relative change, ``+12.3 %``."""
    if base is None or new is None or not base:
        return ""
    x = 100 * (new - base) / base
    return f"{x:+.1f} %".replace("-", "−")


def text(value: object) -> str:
    """A string from the data (an op, a lane, an activity, a tensor, a file name) made safe to print with
    rich markup: brackets escaped (``[/x]`` in a kernel name is not a closing tag) and control characters
    shown as escapes (a newline or a terminal escape sequence in a name prints as ``\\n``, ``\\x1b``)."""
    return escape(printable(str(value)))
