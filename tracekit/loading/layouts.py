"""How training tools name their profiler traces: the rank a file name says, and which profiling window of that rank
the file holds (docs/integrations/layouts.md lists them).

A tool that profiles a window every N steps, or once per stage, writes several traces per rank into one folder
(torchtitan's ``iteration_N/``, Composer's ``rank{r}.{batch}``, Lightning's training and validation steps); read as
ranks of their own they would double the job. :func:`last_windows` keeps one window per rank — the last, a training
step's where the tool also profiles others — and says which it left out. :func:`name_ranks` gives each file's rank as
its name says it (or as ``--rank-regex`` finds it), for the files whose JSON has no ``distributedInfo``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from tracekit.model.diagnostics import Diagnostic, TraceError

_TAIL = r"\.json(?:\.gz)?$"
#: the name rule of files no tool below claims: ``rank-3``, ``rank_3``, ``worker3``
GENERIC = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_ ]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class NameFacts:
    """What a trace's path says: the tool that wrote it (``None``: none known), the rank in it, whether that number
    is the node-local rank (then only right on one node), the series of windows the file is one of and its place in
    that series (larger: later; a series of one file is no choice), and the window in words."""

    layout: str | None
    rank: int | None
    local: bool = False
    series: tuple | None = None
    window: tuple = ()
    label: str = ""


def _torchtitan(path: str) -> NameFacts | None:
    """torchtitan: ``<dump>/profile_trace/iteration_<step>/[<leaf>/]rank<r>_trace.json[.gz]``."""
    m = re.search(r"(?:^|/)iteration_(\d+)/((?:[^/]+/)?)rank(\d+)_trace" + _TAIL, path)
    if m is None:
        return None
    rank = int(m.group(3))
    return NameFacts("torchtitan", rank, series=("torchtitan", path[:m.start(1)], m.group(2), rank),
                     window=(int(m.group(1)),), label=f"iteration_{m.group(1)}")


def _composer(path: str) -> NameFacts | None:
    """Composer's ``TorchProfiler``: ``rank<r>.<batch>.pt.trace.json[.gz]``."""
    m = re.search(r"(?:^|/)rank(\d+)\.(\d+)\.pt\.trace" + _TAIL, path)
    if m is None:
        return None
    rank = int(m.group(1))
    return NameFacts("composer", rank, series=("composer", path[:m.start()], rank), window=(int(m.group(2)),),
                     label=f"batch {m.group(2)}")


def _tracekit(path: str) -> NameFacts | None:
    """``tracekit.torch.profile``: ``rank<r>.pt.trace.json.gz``, ``rank<r>.w<k>.…`` with several windows."""
    m = re.search(r"(?:^|/)rank(\d+)(?:\.w(\d+))?\.pt\.trace" + _TAIL, path)
    if m is None:
        return None
    rank, k = int(m.group(1)), int(m.group(2) or 0)
    return NameFacts("tracekit", rank, series=("tracekit", path[:m.start()], rank), window=(k,), label=f"w{k}")


def _accelerate(path: str) -> NameFacts | None:
    """Accelerate's ``ProfileKwargs(output_trace_dir=…)``: ``profile_<process index>.json``, one per process."""
    m = re.search(r"(?:^|/)profile_(\d+)" + _TAIL, path)
    return None if m is None else NameFacts("accelerate", int(m.group(1)))


_STEP_ACTIONS = ("training_step", "validation_step", "test_step", "predict_step")


def _lightning(path: str) -> NameFacts | None:
    """Lightning's ``PyTorchProfiler``: ``<stage>-[<filename>-][<local rank>-]<action>.<time_ns>.pt.trace.json``,
    e.g. ``fit-prof-1-[Strategy]DDPStrategy.training_step.1795886810848869839.pt.trace.json`` (the local rank only
    when the job has several processes)."""
    m = re.search(r"(?:^|/)(fit|validate|test|predict|sanity_check)-([^/]*)\.(\d{10,})\.pt\.trace" + _TAIL, path)
    if m is None or not m.group(2).endswith(_STEP_ACTIONS):
        return None
    stage, rest, ns = m.group(1), m.group(2), int(m.group(3))
    head, sep, _ = rest.partition("-[")
    if not sep:  # an action without Lightning's [Owner] prefix: the last part after a dash
        head = rest.rpartition("-")[0]
    num = re.search(r"(?:^|-)(\d+)$", head)
    rank = int(num.group(1)) if num else None
    prefix = head[:num.start()] if num else head
    step = next(s for s in _STEP_ACTIONS if rest.endswith(s))
    return NameFacts("lightning", rank, local=True, series=("lightning", path[:m.start()], prefix, rank),
                     window=(stage == "fit", step == "training_step", ns), label=f"{stage} {step}")


def _trace_handler(path: str) -> NameFacts | None:
    """``torch.profiler.tensorboard_trace_handler`` (W&B's ``pytorch_traces``, the PyTorch tutorials):
    ``<worker>.<time_ns>.pt.trace.json[.gz]``, the worker ``<host>_<pid>`` unless named: a rank only where the
    worker's name says one (``rank3``, ``worker3``)."""
    m = re.search(r"(?:^|/)([^/]+)\.(\d{10,})\.pt\.trace" + _TAIL, path)
    if m is None:
        return None
    worker = m.group(1)
    g = GENERIC.search(worker)
    return NameFacts("tensorboard_trace_handler", int(g.group(1)) if g else None,
                     series=("tensorboard_trace_handler", path[:m.start()], worker), window=(int(m.group(2)),),
                     label=f"{worker} at {m.group(2)}")


#: the tools' rules, most specific first
RULES: tuple[Callable[[str], NameFacts | None], ...] = (_torchtitan, _composer, _tracekit, _accelerate, _lightning,
                                                        _trace_handler)


def facts(path: str) -> NameFacts:
    """What ``path``'s name says (the first rule of :data:`RULES` that matches, else the generic ``rank3`` /
    ``worker3`` rule on the file name)."""
    p = path.replace(os.sep, "/")
    for rule in RULES:
        found = rule(p)
        if found is not None:
            return found
    g = GENERIC.search(os.path.basename(p))
    return NameFacts(None, int(g.group(1)) if g else None)


#: how much of a trace's start is read for the rank in its ``distributedInfo`` (PyTorch writes it before the events)
HEAD_BYTES = 64 << 10
_HEAD_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')


def head_rank(path: str) -> int | None:
    """The rank in the ``distributedInfo`` at the start of a Kineto trace (gzip or not), or None where it is not
    there (on-demand traces write it after the events; a trace outside torch.distributed has none)."""
    from tracekit.parsers.source import iter_blocks

    try:
        for _, block in iter_blocks(path, HEAD_BYTES):
            m = _HEAD_RANK.search(block)
            return int(m.group(1)) if m else None
    except (OSError, TraceError):
        return None
    return None


def last_windows(files: list[str]) -> tuple[list[str], list[Diagnostic]]:
    """``files`` less the earlier windows of each series (:class:`NameFacts`): one trace per rank and tool, the
    latest (a training step's before another stage's), in the input order; one warning per tool says what was left
    out and how to read another window. Where a series has several files, the rank at the start of each (its
    ``distributedInfo``) splits it further: traces of different ranks that share a name (Lightning's local ranks of
    several nodes in one folder, one ``worker_name`` on every rank) are never windows of one another."""
    facts_of = [facts(f) for f in files]
    size: dict[tuple, int] = {}
    for nf in facts_of:
        if nf.series is not None:
            size[nf.series] = size.get(nf.series, 0) + 1
    keys = [None if nf.series is None else (nf.series, head_rank(f) if size[nf.series] > 1 else None)
            for f, nf in zip(files, facts_of, strict=True)]
    best: dict[tuple, int] = {}
    count: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        count[key] = count.get(key, 0) + 1
        if key not in best or facts_of[i].window > facts_of[best[key]].window:
            best[key] = i
    keep = {i for i, key in enumerate(keys) if key is None or best[key] == i}
    notes: list[Diagnostic] = []
    for layout in dict.fromkeys(facts_of[i].layout for i, key in enumerate(keys) if key is not None and count[key] > 1):
        dropped = [i for i, nf in enumerate(facts_of) if i not in keep and nf.layout == layout]
        kept = sorted({facts_of[best[keys[i]]].label for i in dropped})
        left = sorted({facts_of[i].label for i in dropped})
        rule = "a training step of fit first, then the latest" if layout == "lightning" else "the latest"
        notes.append(Diagnostic(files[dropped[0]], f"{layout}: one profiling window per rank read, {_few(kept)} "
                                f"({rule}); {len(dropped)} more left out ({_few(left)}): give one window's files to "
                                "read another"))
    return [f for i, f in enumerate(files) if i in keep], notes


def _few(labels: list[str], n: int = 3) -> str:
    return ", ".join(labels[:n]) + (f" and {len(labels) - n} more" if len(labels) > n else "")


def compile_rank_regex(text: str) -> re.Pattern[str]:
    """``--rank-regex``: a regular expression searched in each trace's path whose group ``rank`` (else its first
    group) is the rank's digits; a one-line TraceError when it is not one."""
    try:
        rx = re.compile(text)
    except re.error as exc:
        raise TraceError(None, f"--rank-regex {text!r} is not a regular expression: {exc}") from None
    if rx.groups == 0:
        raise TraceError(None, f"--rank-regex {text!r} has no group around the rank's digits, e.g. 'rank(\\d+)'")
    return rx


def regex_rank(rx: re.Pattern[str], path: str) -> int | None:
    """The rank ``rx`` finds in ``path`` (None: no match, or no digits in the group)."""
    m = rx.search(path.replace(os.sep, "/"))
    if m is None:
        return None
    value = m.group("rank") if "rank" in rx.groupindex else m.group(1)
    return int(value) if value is not None and value.isdigit() else None
