"""tracekit against PyTorch's own Flight Recorder analyser (``torch.distributed.flight_recorder.fr_trace``, torch 2.13)
on the recorded dumps of ``tests/data/flight_recorder``: where ``fr_trace`` names a culprit, tracekit names the same,
or the difference is the one ``docs/hangs.md`` explains. Skipped without the module.

``fr_trace`` stops on gloo's ``pg_config`` (one group named ``''``: ``KeyError: ('0', r)``), so each dump is copied
with a ``pg_config`` rewritten from the groups ``record.py`` created (``job.json``) — read with tracekit's refusing
unpickler, written back with ``pickle.dumps``. ``--allow-incomplete-ranks`` lets it read the jobs with a rank that
left no dump.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
from pathlib import Path

import pytest

import tracekit
from tracekit.parsers.flight_recorder import unpickle

DATA = Path(__file__).parent / "data" / "flight_recorder"
CASES = sorted(p.name for p in DATA.iterdir() if (p / "job.json").exists())


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _rewritten(case: str, out: Path) -> Path:
    """The case's pickles with a pg_config fr_trace reads: every group by name, its description and members."""
    job = json.loads((DATA / case / "job.json").read_text())
    out.mkdir()
    for p in (DATA / case / "pickle").iterdir():
        dump = unpickle.loads(p.read_bytes())
        descs = {e["process_group"][0]: e["process_group"][1] for e in dump["entries"]}
        dump["pg_config"] = {name: {"name": name, "desc": descs.get(name, "undefined"), "ranks": str(ranks)}
                             for name, ranks in job["groups"].items()}
        (out / p.name).write_bytes(pickle.dumps(dump, protocol=2))
    return out


@pytest.fixture(scope="module")
def fr_trace():  # type: ignore[no-untyped-def]
    """PyTorch's analyser, imported when a test runs (not at collection: torch takes seconds to import)."""
    return pytest.importorskip("torch.distributed.flight_recorder.fr_trace")


def _fr_trace(fr_trace, directory: Path) -> dict[str, list]:  # type: ignore[no-untyped-def]
    """What fr_trace says: ranks missing from a collective, culprits of a mismatch, ranks without a dump."""
    handler = _Lines()
    log = logging.getLogger("Flight Recorder")
    log.addHandler(handler)
    try:
        fr_trace.main([str(directory), "--allow-incomplete-ranks"])
    finally:
        log.removeHandler(handler)
    found: dict[str, list] = {"missing": [], "culprits": [], "no_dump": []}
    seq = group = None
    for line in handler.lines:
        if m := re.match(r"(?:Not all ranks joining collective, sequence number|Collective sequence number): (\d+)",
                         line):
            seq = int(m.group(1))
        elif m := re.match(r"group info: (\S+)", line):
            group = m.group(1).split(":")[0]
        elif m := re.match(r"missing ranks: \{([\d, ]+)\}", line):
            found["missing"].append((group, seq, {int(x) for x in m.group(1).split(",")}))
        elif line.startswith("error msg: "):
            found["culprits"].append((group, seq, {int(x) for x in re.findall(r"Culprit rank (\d+)", line)}))
        elif m := re.search(r"missed FR dumps from ranks \(\{([\d, ]+)\}\)", line):
            found["no_dump"].append({int(x) for x in m.group(1).split(",")})
    return found


def test_fr_trace_stops_on_gloo_pg_config(fr_trace) -> None:  # type: ignore[no-untyped-def]
    """The gloo form as torch 2.13 writes it: fr_trace raises KeyError (what the rewrite works around)."""
    with pytest.raises(KeyError):
        fr_trace.main([str(DATA / "hang-skip" / "pickle"), "--allow-incomplete-ranks"])


@pytest.mark.parametrize("case", CASES)
def test_the_same_culprit_as_fr_trace(fr_trace, case: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    said = _fr_trace(fr_trace, _rewritten(case, tmp_path / "dumps"))
    h = tracekit.load([str(DATA / case / "pickle")], cache=False).hang
    assert h is not None
    if not any(said.values()):
        assert h.kind == "none"  # neither finds anything (healthy, delayed)
        return
    stuck = {(s.pg, s.seq): set(s.behind) | set(s.no_dump) for s in h.stuck}
    for group, seq, missing in said["missing"]:
        # the same ranks missing from the same collective; tracekit names the one of them that waits nowhere else
        assert stuck[(group, seq)] == missing
        assert set(h.cause_ranks) <= set().union(*(m for _, _, m in said["missing"]))
    assert bool(said["missing"]) == bool(h.stuck)
    for group, seq, culprits in said["culprits"]:
        (d,) = [d for d in h.desyncs if (d.pg, d.seq) == (group, seq)]
        # fr_trace compares every rank with the first rank it reads (directory order) and blames the others: where that
        # rank is the odd one out it names the majority instead (docs/hangs.md)
        assert culprits in (set(d.odd), set(d.calls) - set(d.odd))
        assert h.cause_ranks == list(d.odd)
    for no_dump in said["no_dump"]:
        assert no_dump == set(h.no_dump)
