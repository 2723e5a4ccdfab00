"""The Flight Recorder parser (``parsers/flight_recorder``) on the recorded gloo dumps of ``tests/data/flight_recorder``
(both forms), on dumps of every schema version (synthetic, ``tests/flight_recorder_dumps.py``), and on hostile,
damaged and mistyped ones: a pickle that names code runs nothing and is refused with one line naming the file."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest

from tests import flight_recorder_dumps as frd
from tracekit.model.diagnostics import TraceError
from tracekit.parsers import detect, flight_recorder, parse

DATA = Path(__file__).parent / "data" / "flight_recorder"
CASES = sorted(p.name for p in DATA.iterdir() if (p / "job.json").exists())


def _job(case: str) -> dict:
    return json.loads((DATA / case / "job.json").read_text())


def _entries(path: Path) -> list[dict]:
    return parse(str(path)).tables["fr_entries"].to_pylist()


@pytest.mark.parametrize("case", CASES)
def test_every_recorded_dump_reads_in_both_forms(case: str) -> None:
    """Each dump of each case: a rank from its name, the pickle's entries equal the JSON's (but for the stacks, which
    only the pickle has), gloo's states (all scheduled, no discovered time) and entries up to the fault."""
    job = _job(case)
    pickles = sorted((DATA / case / "pickle").iterdir())
    assert pickles, case
    for p in pickles:
        rank = int(p.name.rsplit("_", 1)[1])
        assert detect(str(p)).name == "flight-recorder"
        parsed = parse(str(p))
        dump = parsed.tables["fr_dumps"].to_pylist()[0]
        assert (dump["rank"], dump["form"], dump["version"], dump["backend"]) == (rank, "pickle", "2.10", "gloo")
        assert dump["with_stacks"] and (dump["world_size_min"] or 0) <= job["world_size"]
        assert not parsed.diagnostics and parsed.events.num_rows == 0
        entries = parsed.tables["fr_entries"].to_pylist()
        assert {e["state"] for e in entries} == {"scheduled"}
        assert all(e["time_started_ns"] is None and e["time_completed_ns"] is None for e in entries)
        assert all(e["rank"] == rank and e["frames"] for e in entries)
        j = DATA / case / "json" / f"fr_trace_rank_{rank}.json"
        assert detect(str(j)).name == "flight-recorder"
        jentries = _entries(j)
        keep = ("record_id", "pg", "pg_desc", "collective_seq_id", "profiling_name", "input_sizes", "input_dtypes",
                "time_created_ns")
        assert [{k: e[k] for k in keep} for e in jentries] == [{k: e[k] for k in keep} for e in entries]
        # the JSON form is dumped just after the pickle: a collective may retire in between, never the other way
        assert all(j["retired"] or not e["retired"] for j, e in zip(jentries, entries, strict=True))
        assert all(e["frames"] is None for e in jentries)
        # the broadcasts of the parameters first, every call a collective of gloo
        assert entries[0]["profiling_name"] == "gloo:broadcast" and entries[0]["op"] == "broadcast"
        assert all(not e["is_p2p"] for e in entries)
    status = parse(str(pickles[0])).tables["fr_pg_status"].to_pylist()
    assert status and status[0]["last_started"] == -1  # gloo: nothing is known to have started


def test_gloo_pg_config_names_no_group() -> None:
    """gloo's pg_config: one group named '' with the last created group's ranks (the whole world without new_group,
    none after it) — read as it is, only a bound on the world size."""
    healthy = parse(str(DATA / "healthy" / "pickle" / "fr_trace_rank_0")).tables["fr_pg_config"].to_pylist()
    path = str(DATA / "healthy" / "pickle" / "fr_trace_rank_0")
    assert healthy == [{"rank": 0, "path": path, "pg": "", "pg_desc": "", "ranks": [0, 1, 2],
                        "ranks_text": "[0, 1, 2]"}]
    sub = parse(str(DATA / "subgroup-stuck" / "pickle" / "fr_trace_rank_0"))
    assert sub.tables["fr_pg_config"].to_pylist()[0]["ranks"] == []
    assert sub.tables["fr_dumps"].to_pylist()[0]["world_size_min"] is None


def test_rank_from_the_file_name() -> None:
    assert flight_recorder.rank_from_name("/tmp/nccl_trace_rank_12") == 12
    assert flight_recorder.rank_from_name("dumps/fr_trace_rank_3.json") == 3
    assert flight_recorder.rank_from_name("rank7.pkl.gz") == 7
    assert flight_recorder.rank_from_name("dump.pkl") is None


@pytest.mark.parametrize("version", ["1.1", "1.4", "2.2", "2.3", "2.7", "2.10"])
def test_every_schema_version(tmp_path: Path, version: str) -> None:
    """Synthetic NCCL dumps of each version's keys (from PyTorch's source): 1.x's seq_id and pg_id become
    collective_seq_id and the group's name; states and discovered times as NCCL writes them."""
    dumps = frd.job(version, world=2, steps=3, fault="stopped", culprit=1)
    path = frd.write(dumps, tmp_path)[0]
    parsed = parse(str(path))
    entries = parsed.tables["fr_entries"].to_pylist()
    assert [e["collective_seq_id"] for e in entries] == [1, 2, 3]
    assert [e["state"] for e in entries] == ["completed", "completed", "started"]
    assert entries[0]["pg"] == "0" and entries[0]["op"] == "allreduce" and entries[0]["input_numel"] == 1024
    assert entries[0]["time_completed_ns"] == entries[0]["time_created_ns"] + 5000
    assert entries[0]["duration_ns"] == 4000 and entries[2]["time_completed_ns"] is None
    assert entries[0]["frames"].splitlines()[1] == "train_step at /job/train.py:88"
    assert entries[0]["pg_desc"] == (None if version.startswith("1.") else "default_pg")
    config = parsed.tables["fr_pg_config"].to_pylist()
    assert (config[0]["ranks"] if config else None) == (None if version == "1.1" else [0, 1])
    assert parsed.tables["fr_dumps"].to_pylist()[0]["comm_lib_version"] == \
        ("2.21.5" if version in ("2.7", "2.10") else None)
    assert not parsed.diagnostics
    if version >= "2.3":
        assert parsed.tables["fr_pg_status"].to_pylist()[0]["last_completed"] == 2


def test_json_and_gzip_forms_of_a_synthetic_dump(tmp_path: Path) -> None:
    dumps = frd.job("2.10", world=2, steps=3, fault=None)
    j = frd.write(dumps, tmp_path / "j", form="json")[0]
    p = frd.write(dumps, tmp_path / "p")[0]
    z = tmp_path / "nccl_trace_rank_0.gz"
    z.write_bytes(gzip.compress(p.read_bytes()))
    rows = [_entries(x) for x in (j, p, z)]
    assert [e["time_completed_ns"] for e in rows[0]] == [e["time_completed_ns"] for e in rows[1]]
    assert rows[1] == [{**e, "path": str(p)} for e in rows[2]]
    assert parse(str(j)).tables["fr_pg_status"].to_pylist()[0]["last_completed"] == 3


# ------------------------------------------------------------------------------------ hostile pickles


class _Evil:
    """Pickles as a call of ``os.system`` (``__reduce__``)."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (self.cmd,))


def _reduce_os_system(marker: Path, protocol: int = 2) -> bytes:
    return pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [_Evil(f"touch {marker}")]},
                        protocol=protocol)


EXT_CODE = 0x7ABC


def _payloads(marker: Path) -> list[tuple[str, bytes, bool]]:
    """``(what, pickle, runs under pickle.loads)``: os.system through ``__reduce__`` in every protocol (GLOBAL up to
    3, STACK_GLOBAL from 4), and through INST, OBJ, an extension code (EXT2) and a persistent id."""
    cmd = f"touch {marker}".encode()
    out = [(f"__reduce__, protocol {p}", _reduce_os_system(marker, p), True) for p in range(6)]
    out += [
        ("INST", b"(V" + cmd + b"\nios\nsystem\n.", True),
        ("OBJ", b"(cos\nsystem\nV" + cmd + b"\no.", True),
        ("EXT2", pickle.PROTO + b"\x02" + pickle.EXT2 + EXT_CODE.to_bytes(2, "little") + pickle.SHORT_BINUNICODE
         + bytes([len(cmd)]) + cmd + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP, True),
        ("persistent id", b"\x80\x02Vos.system\nQ.", False),
    ]
    return out


def test_a_hostile_pickle_runs_nothing(tmp_path: Path) -> None:
    """``os.system`` through ``__reduce__`` and through every opcode that can reach a callable: nothing runs (the
    marker file is never made) and each is refused with one line naming the file; the standard unpickler runs each
    (the control), so they are real attacks."""
    import copyreg

    marker = tmp_path / "pwned"
    copyreg.add_extension("os", "system", EXT_CODE)
    try:
        for i, (what, data, runs) in enumerate(_payloads(marker)):
            path = tmp_path / f"fr_trace_rank_{i}"
            path.write_bytes(data)
            with pytest.raises(TraceError) as err:
                flight_recorder.parse(str(path))
            assert str(path) in str(err.value), what
            assert "refused" in str(err.value), (what, str(err.value))
            assert not marker.exists(), f"{what} ran"
            if runs:
                pickle.loads(data)
                assert marker.exists(), what
                marker.unlink()
    finally:
        copyreg.remove_extension("os", "system", EXT_CODE)


def test_a_hostile_pickle_through_the_cli_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracekit.cli import main

    marker = tmp_path / "pwned"
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(_reduce_os_system(marker))
    assert main(["summary", str(path), "--no-cache"]) == 1
    err = capsys.readouterr().err
    assert ".system" in err and "refused" in err and "Traceback" not in err
    assert not marker.exists()


def test_repeated_references_are_refused_in_bounded_work(tmp_path: Path) -> None:
    """A few kilobytes that reference one list of frames a million times: refused, not expanded."""
    frames = [{"name": "f", "filename": "x.py", "line": 1}] * 2000
    entry = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 1, "frames": frames}
    data = pickle.dumps({"version": "2.10", "entries": [entry] * 5000}, protocol=2)
    assert len(data) < 64 << 10
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(data)
    with pytest.raises(TraceError, match="references repeated"):
        parse(str(path))


@pytest.mark.parametrize("cut", [1, 10, 200, -1])
def test_a_truncated_dump_names_the_file(tmp_path: Path, cut: int) -> None:
    data = (DATA / "hang-skip" / "pickle" / "fr_trace_rank_0").read_bytes()
    path = tmp_path / "fr_trace_rank_0"
    path.write_bytes(data[:cut])
    with pytest.raises(TraceError) as err:
        parse(str(path))
    assert str(path) in str(err.value)
    jpath = tmp_path / "fr_trace_rank_1.json"
    jpath.write_bytes((DATA / "hang-skip" / "json" / "fr_trace_rank_1.json").read_bytes()[:max(cut, 2) * 7])
    with pytest.raises(TraceError) as err:
        parse(str(jpath))
    assert str(jpath) in str(err.value)


def test_values_of_the_wrong_type_are_unknown_and_counted(tmp_path: Path) -> None:
    dump = frd.job("2.10", world=2, steps=2, fault=None)[0]
    dump["entries"][0].update(collective_seq_id="seven", input_sizes=[[1, "x"]], retired="maybe", state=7,
                              frames=[{"name": 3, "filename": None, "line": "x"}, "junk"])
    dump["entries"].append("not an entry")
    dump["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, os.system]"}}
    dump["pg_status"] = {"0": "nothing"}
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    parsed = parse(str(path))
    e = parsed.tables["fr_entries"].to_pylist()
    assert len(e) == 2 and e[0]["collective_seq_id"] is None and e[0]["input_sizes"] is None
    assert e[0]["retired"] is None and e[0]["state"] == "7" and e[1]["collective_seq_id"] == 2
    assert parsed.tables["fr_pg_config"].to_pylist()[0]["ranks"] is None
    (diag,) = parsed.diagnostics
    assert "collective_seq_id (1)" in diag.message and "entries (1)" in diag.message and str(path) == diag.path


@pytest.mark.parametrize("data", [b"\x80\x02]q\x00.", b'{"entries": 5, "pg_config": {}}', b"\x80\x02}q\x00."])
def test_not_a_dump(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fr_trace_rank_0"
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        flight_recorder.parse(str(path))
    assert str(path) in str(err.value)


def test_sniffing_leaves_other_formats_alone() -> None:
    assert detect(str(DATA / "hang-skip" / "traces" / "rank0.pt.trace.json.gz")).name == "kineto"
    assert detect(str(DATA / "hang-skip" / "job.json")) is None
    assert not flight_recorder.sniff(b'{"traceEvents": [], "entries": [], "pg_config": {}}')


def test_a_memo_index_of_a_billion_costs_nothing(tmp_path: Path) -> None:
    """Five bytes (``LONG_BINPUT`` of ~946 million) made CPython's C unpickler allocate its memo array for 21 CPU-s
    (a fuzzing finding): the pure-Python unpickler's dict memo refuses the damaged dump at once."""
    data = pickle.dumps({"version": "2.10", "entries": [{"profiling_name": "gloo:barrier"}]}, protocol=2)
    bad = data[:-1] + pickle.LONG_BINPUT + (946359153).to_bytes(4, "little") + data[-1:]
    path = tmp_path / "fr_trace_rank_0"
    path.write_bytes(bad)
    import time

    t0 = time.process_time()
    parsed = parse(str(path))
    assert time.process_time() - t0 < 1.0
    assert parsed.tables["fr_entries"].num_rows == 1
