"""How an error message names an option. tracekit's library code (``tracekit.load``, ``Job.whatif`` and what they
call) names its keyword arguments as a Python caller writes them (``link_bw=``); the command line and the terminal
app, whose users typed flags, turn those names into the flags before printing (``--link-bw``): :func:`as_flags`."""

from __future__ import annotations

import re

__all__ = ["KEYWORDS", "as_flags", "naming"]

#: the keyword arguments of the Python API that are flags of the command line, ``link_bw`` → ``--link-bw``
#: (``tests/test_options.py`` checks that each is one)
KEYWORDS = ("link_bw", "step_marker", "iterations", "jobs", "engine", "scheduler", "dataset", "memory_budget",
            "bandwidth", "compression", "workers", "efficiency", "latency", "codec_cost")

_KEYWORD = re.compile(rf"(?<![\w.=-])({'|'.join(KEYWORDS)})=(.?)", re.S)


def as_flags(text: str) -> str:
    """``link_bw='fast': …`` → ``--link-bw 'fast': …``: every keyword of :data:`KEYWORDS` written as ``name=`` in
    ``text`` becomes the command line's flag (followed by a space where a value follows it)."""

    def flag(m: re.Match[str]) -> str:
        after = m.group(2)
        gap = " " if after and not after.isspace() and after not in ",.;:)" else ""
        return f"--{m.group(1).replace('_', '-')}{gap}{after}"

    return _KEYWORD.sub(flag, text)


def naming(option: str, value: object) -> str:
    """An option and the value given to it, as a message starts: ``link_bw='fast'`` for a keyword written
    ``link_bw=``, ``line rate 'fast'`` for anything else."""
    return f"{option}{value!r}" if option.endswith("=") else f"{option} {value!r}"
