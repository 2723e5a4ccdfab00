"""Messages name an option as their reader writes it: ``link_bw=`` from Python (``tracekit.load``, ``Job.whatif``),
``--link-bw`` on the command line (tracekit/model/options.py)."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest

import tracekit
from tracekit import api
from tracekit.cli import build_parser, main
from tracekit.model.diagnostics import TraceError
from tracekit.model.options import KEYWORDS, as_flags

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"
NOSHAPES = ROOT / "tests" / "data" / "jobs" / "ddp-noshapes-1gbit"


@pytest.mark.parametrize(("python", "cli"), [
    ("link_bw='fast': expected a number", "--link-bw 'fast': expected a number"),
    ("pass link_bw= (the line rate) or bandwidth=.", "pass --link-bw (the line rate) or --bandwidth."),
    ("iterations= needs the job in memory: run without engine=, memory_budget= and dataset=",
     "--iterations needs the job in memory: run without --engine, --memory-budget and --dataset"),
    ("jobs=0: must be at least 1", "--jobs 0: must be at least 1"),
    ("dp=25gbit and x.link_bw=1 stay", "dp=25gbit and x.link_bw=1 stay"),
])
def test_as_flags(python: str, cli: str) -> None:
    assert as_flags(python) == cli


def test_every_keyword_is_a_flag_and_a_parameter() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {s for p in sub.choices.values() for a in p._actions for s in a.option_strings}
    params = {*inspect.signature(api.load).parameters, *inspect.signature(api.Job.whatif).parameters,
              *inspect.signature(api.scenarios).parameters}
    for k in KEYWORDS:
        assert f"--{k.replace('_', '-')}" in flags, k
        assert k in params, k


def _message(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(TraceError) as info:
        call()
    return str(info.value)


def test_python_callers_read_keywords() -> None:
    """The mistakes a newcomer made from Python, each named as the keyword they passed."""
    assert "link_bw='fast'" in _message(lambda: tracekit.load(SAMPLE, link_bw="fast", cache=False))
    assert "step_marker='('" in _message(lambda: tracekit.load(SAMPLE, step_marker="(", cache=False))
    assert "iterations='x'" in _message(lambda: tracekit.load(SAMPLE, iterations="x", cache=False))
    job = tracekit.load(NOSHAPES, cache=False)  # no record_shapes and no line rate: sizes unknown
    unknown = _message(lambda: job.whatif(bandwidth="10gbit", efficiency="full"))
    assert "pass link_bw= (the line rate the job ran on)" in unknown
    measured = _message(lambda: job.whatif(bandwidth="10gbit", efficiency="measured"))
    assert "efficiency='measured' needs link_bw=" in measured
    for text in (unknown, measured, _message(lambda: job.whatif(compression=-1))):
        assert "--" not in text, text


def test_the_command_line_reads_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in ((["summary", str(SAMPLE), "--link-bw", "fast"], "--link-bw 'fast'"),
                       (["summary", str(SAMPLE), "--step-marker", "("], "--step-marker '('"),
                       (["whatif", str(NOSHAPES), "--bandwidth", "10gbit", "--efficiency", "full"],
                        "pass --link-bw (the line rate the job ran on)")):
        assert main([*argv, "--no-cache"]) == 1
        err = capsys.readouterr().err
        assert says in err and "link_bw=" not in err and "step_marker=" not in err, err
