"""The NCCL debug log parser against synthetic logs of known truth (tests/nccl_logs.py), every
grammar era and launcher prefix of FORMATS.md section 2, and damaged input."""

from __future__ import annotations

import gzip
import json
import random
import re
from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import nccl_logs as NL
from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import COLLECTIVES, TOPOLOGY
from tracekit.parsers import nccl
from tracekit.parsers.nccl import reader as nccl_reader

COLS = ("rank", "pg", "seq", "op", "dtype", "count", "bytes", "nranks", "peer", "algorithm", "protocol")


def got_collectives(pf) -> list[tuple]:
    df = pl.from_arrow(pf.collectives)
    return sorted((tuple(r) for r in df.select(COLS).iter_rows()), key=NL._key)


def got_topology(pf) -> list[tuple]:
    df = pl.from_arrow(pf.topology)
    return sorted((tuple(r) for r in df.iter_rows()),
                  key=lambda t: tuple("" if x is None else str(x) for x in t))


def parse_text(tmp_path: Path, text: str, name: str = "nccl.log", gz: bool = False):
    path = NL.write(tmp_path / name, text, gz=gz)
    return nccl.parse(str(path))


def messages(pf) -> list[str]:
    return [d.message for d in pf.diagnostics]


# ---------------------------------------------------------------------------------------------------
# sniffing


@pytest.mark.parametrize("launcher", NL.LAUNCHERS)
def test_sniff_accepts_nccl_text_behind_any_prefix(launcher):
    job = NL.make_job("2.21.5")
    text = NL.render(job, launcher=launcher, interleave=False)
    assert nccl.sniff(text.encode()[:65536])
    line = next(x for x in text.splitlines() if "NCCL INFO" in x)
    assert nccl.sniff(line.encode())


@pytest.mark.parametrize("head", [
    b"NCCL version 2.21.5+cuda12.4\n",
    b":7311:7311 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n",
    b"[2025-03-01 12:00:00] node:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init "
    b"COMPLETE\n",
    b"node:1:2 [0] transport/net_ib.cc:1102 NCCL WARN NET/IB : Got completion\n",
    b"Epoch 1 loss 0.1\nnode:1:2 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 1 "
    b"datatype 7 op 0 root 0 comm 0x2 [nranks=2] stream 0x3\n",
])
def test_sniff_positive(head):
    assert nccl.sniff(head)


@pytest.mark.parametrize("head", [
    b"",
    b"   \n\n",
    b'{"traceEvents": [{"name": "node:1:2 [0] NCCL INFO x"}]}',
    b'[{"name": "NCCL version 2.21.5", "ph": "X"}]',
    b'[\n{"ph": "B", "name": "NEGOTIATE_ALLREDUCE"}',
    bytes(range(256)) * 10,
    b"Epoch 1 step 10 loss 0.25\nvalidation accuracy 0.9\n",
])
def test_sniff_negative(head):
    assert not nccl.sniff(head)


@pytest.mark.parametrize("head", [
    b"[1] NCCL INFO Ring 00 : 1 -> 2 -> 3\n",
    b"[5] NCCL INFO Trees [0] 6/-1/-1->5->4 [1] 6/-1/-1->5->4\n",
    b"NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n",
    b"NCCL INFO comm 0x55d0c0a1b2c0 rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE\n",
    b"[1,0]<stdout>:[0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n",
    b"[1,3]<stdout>:NCCL INFO Using network IB\n",
    b"[default2]:[2] NCCL INFO cudaDriverVersion 12040\n",
    b"3: [3] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0\n",
    b"(TrainWorker pid=48213, ip=10.8.0.21) [0] NCCL INFO P2P Chunksize set to 131072\n",
    b"[2025-03-01 12:00:00] [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 1 datatype 7 op 0 "
    b"root 0 comm 0x2 [nranks=2] stream 0x3\n",
    b"2025-03-01T12:00:00.123456789Z stdout F [0] NCCL INFO 32 coll channels, 32 p2p channels\n",
    b"> [0] NCCL INFO Channel 01 : 0[1b000] -> 1[3d000] via P2P/IPC\n",
    b"[0] transport/net_ib.cc:1102 NCCL WARN NET/IB : Got completion from peer with error 12\n",
    b"Some training output\nloss 0.25\n    [3] NCCL INFO Ring 01 : 2[2] -> 3[3] via P2P/IPC\n",
])
def test_sniff_accepts_lines_without_host_prefix(head):
    """Excerpts without ``host:pid:tid``, behind launcher and logger prefixes (issue 16)."""
    assert nccl.sniff(head)


@pytest.mark.parametrize("head", [
    b"Set NCCL INFO level before launching\n",
    b"export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL\n",
    b"we ran with NCCL INFO logging and saw nothing\n",
    b"xxxxxxxxxx NCCL is great 0.25\n",
    b"NCCL_DEBUG=INFO torchrun --nproc_per_node 8 train.py\n",
    b"# NCCL INFO lines are printed by ncclCommInitRank\n",
])
def test_sniff_refuses_text_that_only_mentions_nccl(head):
    assert not nccl.sniff(head)


def test_registered_format(tmp_path):
    pytest.importorskip("tracekit.parsers.kineto")
    from tracekit.parsers import detect, formats

    names = [f.name for f in formats()]
    assert {"kineto", "nccl-log", "horovod"} <= set(names)
    path = NL.write(tmp_path / "x.log", NL.render(NL.make_job("2.21.5"), launcher="torchrun"))
    assert detect(str(path)).name == "nccl-log"


# ---------------------------------------------------------------------------------------------------
# the truth, era by era, launcher by launcher


@pytest.mark.parametrize("launcher", NL.LAUNCHERS)
@pytest.mark.parametrize("era", NL.ERAS)
def test_recovers_truth(tmp_path, era, launcher):
    """Every call of every rank (pg, seq, op, dtype, count, bytes, nranks, peer, algorithm, protocol),
    every transport row, for each grammar era and launcher prefix; processes interleaved in one file."""
    job = NL.make_job(era)
    pf = parse_text(tmp_path, NL.render(job, launcher=launcher, seed=NL.LAUNCHERS.index(launcher)))
    assert got_collectives(pf) == NL.expected_collectives(job)
    assert got_topology(pf) == NL.expected_topology(job)
    assert pf.collectives.schema == COLLECTIVES
    assert pf.topology.schema == TOPOLOGY
    assert pf.format == "nccl-log"
    assert pf.meta["nccl_version"] == era
    assert pf.meta["unparsed_lines"] == 0
    assert pf.meta["unrecognised_lines"] == 0 and pf.meta["unrecognised"] == []
    assert pf.meta["world_size"] == 4
    assert [p["rank"] for p in pf.meta["processes"]] == [0, 1, 2, 3]
    calls = pl.from_arrow(pf.tables["nccl_calls"])
    assert calls["collective_id"].to_list() == pf.collectives.column("collective_id").to_pylist()
    assert calls["rank_is_global"].all()
    if launcher is not None:
        assert calls["prefix"].null_count() == 0
    comms = pl.from_arrow(pf.tables["nccl_comms"])
    has_start = NL.V(era) >= (2, 18, 3)
    assert comms["start_line"].null_count() == (0 if has_start else comms.height)
    assert _in_era(NL.V(era), pf.meta["era"])


def _in_era(v: tuple[int, int, int], text: str) -> bool:
    """Is version v inside an inferred range like '2.21.0-2.23.x', '>=2.27.0', '<=2.4.x'?"""
    def parse(t: str, hi: bool) -> tuple[int, ...]:
        return tuple(99 if x == "x" else int(x) for x in t.split("."))
    if text.startswith(">="):
        return v >= parse(text[2:], False)
    if text.startswith("<="):
        return v <= parse(text[2:], True)
    lo, hi = text.split("-")
    return parse(lo, False) <= v <= parse(hi, True)


@pytest.mark.parametrize("era", NL.ERAS)
def test_interleaved_processes_with_widowed_prefixes(tmp_path, era):
    """Several processes on one pipe: a prefix followed by another process's whole line, the body on
    the next line without prefix (FORMATS.md 2.6); the truth is still recovered."""
    job = NL.make_job(era)
    pf = parse_text(tmp_path, NL.render(job, widows=6, seed=3))
    assert pf.meta["widowed_prefixes"] == 6
    assert pf.meta["orphan_lines"] == 6
    assert got_collectives(pf) == NL.expected_collectives(job)
    assert got_topology(pf) == NL.expected_topology(job)
    orphans = pl.from_arrow(pf.tables["nccl_calls"]).filter(pl.col("orphan"))
    assert orphans["host"].null_count() == 0


@pytest.mark.parametrize("era", ["2.20.5", "2.26.2", "2.29.1"])
def test_timestamps_on_every_line(tmp_path, era):
    job = NL.make_job(era)
    pf = parse_text(tmp_path, NL.render(job, launcher="torchrun", timestamps="all"))
    assert got_collectives(pf) == NL.expected_collectives(job)
    calls = pl.from_arrow(pf.tables["nccl_calls"])
    assert calls["log_time"].null_count() == 0
    assert calls["log_time"][0].startswith("2025-03-01 12:")
    assert calls["prefix"].cast(pl.String).str.starts_with("[default").all()


def test_gzip_gives_the_same(tmp_path):
    job = NL.make_job("2.24.3")
    text = NL.render(job, launcher="openmpi")
    a = parse_text(tmp_path, text, "plain.log")
    b = parse_text(tmp_path, text, "packed.log.gz", gz=True)
    assert a.collectives.equals(b.collectives)
    assert a.topology.equals(b.topology)
    assert b.complete


def test_crlf_line_endings(tmp_path):
    job = NL.make_job("2.21.5")
    pf = parse_text(tmp_path, NL.render(job, launcher="srun").replace("\n", "\r\n"))
    assert got_collectives(pf) == NL.expected_collectives(job)
    assert got_topology(pf) == NL.expected_topology(job)


def test_lines_across_block_boundaries(tmp_path, monkeypatch):
    """Tiny blocks: every line boundary case of the block reader (and the columnar path per block)."""
    monkeypatch.setattr(nccl_reader, "BLOCK", 777)
    job = NL.make_job("2.27.3")
    pf = parse_text(tmp_path, NL.render(job, launcher="ray", widows=0))
    assert got_collectives(pf) == NL.expected_collectives(job)
    assert got_topology(pf) == NL.expected_topology(job)


# ---------------------------------------------------------------------------------------------------
# specific contents


def _one_call_log(op: str, count: int, dtype: int, nranks: int, root: int = 0) -> str:
    ptr = "0x55aa00000010"
    lines = [f"h:1:1 [0] NCCL INFO comm {ptr} rank 0 nranks {nranks} cudaDev 0 nvmlDev 0 busId 1b000 "
             f"commId 0xabc - Init COMPLETE",
             f"h:1:1 [0] NCCL INFO {op}: opCount 0 sendbuff 0x7f0000000000 recvbuff 0x7f0000100000 "
             f"count {count} datatype {dtype} op 0 root {root} comm {ptr} [nranks={nranks}] stream 0x5"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("op", "name", "factor"), [
    ("AllReduce", "allreduce", 1), ("AllGather", "allgather", 8), ("ReduceScatter", "reduce_scatter", 8),
    ("Broadcast", "broadcast", 1), ("Reduce", "reduce", 1), ("Send", "send", 1), ("Recv", "recv", 1),
    ("AlltoAll", "all_to_all", 8), ("Gather", "gather", 8), ("Scatter", "scatter", 8),
    ("PutSignal", "putsignal", 1),
])
def test_bytes_follow_section_4(tmp_path, op, name, factor):
    """S of FORMATS.md 4: full buffer = n*c*s for allgather, reduce_scatter, all_to_all, gather,
    scatter; c*s otherwise."""
    pf = parse_text(tmp_path, _one_call_log(op, 1000, 6, 8, root=3))
    row = pf.collectives.to_pylist()[0]
    assert row["op"] == name
    assert row["bytes"] == 1000 * 2 * factor
    assert row["dtype"] == "float16"
    rooted = name in ("broadcast", "reduce", "send", "recv", "gather", "scatter")
    assert row["peer"] == (3 if rooted else None)


@pytest.mark.parametrize(("dtype", "name", "size"), [
    (0, "int8", 1), (1, "uint8", 1), (2, "int32", 4), (3, "uint32", 4), (4, "int64", 8), (5, "uint64", 8),
    (6, "float16", 2), (7, "float32", 4), (8, "float64", 8), (9, "bfloat16", 2), (10, "float8e4m3", 1),
    (11, "float8e5m2", 1), (12, None, None),
])
def test_datatype_enum(tmp_path, dtype, name, size):
    pf = parse_text(tmp_path, _one_call_log("AllReduce", 10, dtype, 2))
    row = pf.collectives.to_pylist()[0]
    assert row["dtype"] == (name or "unknown(12)")
    assert row["bytes"] == (10 * size if size else None)


def test_communicators_and_pointer_reuse(tmp_path):
    """A comm pointer reused after Destroy is a new communicator: its own id, seq from 0 again."""
    job = NL.make_job("2.21.5")
    pf = parse_text(tmp_path, NL.render(job, launcher="torchrun"))
    comms = pl.from_arrow(pf.tables["nccl_comms"])
    p0 = comms.filter(pl.col("pid") == job.procs[0].pid).sort("init_line")
    assert p0["comm_id"].to_list() == ["0x5d2e9a0c4471b3f8", "0x1111000000000000", "0x2222000000000000"]
    assert p0["comm"][1] == p0["comm"][2]
    assert p0["end"].to_list() == [None, "destroy", None]
    assert p0["rank"].to_list() == [0, 0, 0] and p0["nranks"].to_list() == [4, 2, 2]
    assert p0["api"].to_list() == ["ncclCommInitRank", "ncclCommSplit", "ncclCommSplit"]
    assert p0["color"].to_list() == [None, 0, 0]
    assert p0["nnodes"].to_list() == [2, 2, 2] and p0["coll_channels"].to_list() == [2, 2, 2]
    c = pl.from_arrow(pf.collectives).filter((pl.col("rank") == 0) & (pl.col("pg") == "0x2222000000000000"))
    assert c["seq"].to_list() == [0]
    procs = pf.meta["processes"]
    assert procs[0]["comms"][0] == {"comm": "0x55b07c1e9f30", "comm_id": "0x5d2e9a0c4471b3f8", "rank": 0,
                                    "nranks": 4, "cuda_dev": 0, "bus_id": "1b000", "parent": None,
                                    "color": None, "key": None}
    assert procs[1]["rank_source"] == "nccl-init"
    assert procs[1]["devices"] == [1]
    assert procs[1]["prefixes"] == ["[default1]:"]
    assert procs[0]["network"] == ["IB"]
    json.dumps(pf.meta)  # JSON-serialisable


def test_split_without_comm_id_is_derived(tmp_path):
    """2.27+ splits print no commId: derived from (parent commId, splitCount, color), equal on all
    members and checked against the Destroy line that prints it."""
    job = NL.make_job("2.27.3")
    pf = parse_text(tmp_path, NL.render(job))
    comms = pl.from_arrow(pf.tables["nccl_comms"])
    derived = comms.filter(pl.col("comm_id_source") == "derived")
    assert derived.height == 4  # the split comms destroyed later took the Destroy line's id ("log")
    assert comms["start_line"].null_count() == 0  # "... key 0- Init START" (no space) is an Init line
    sub = comms.filter(pl.col("color").is_not_null())
    for color in (0, 1):
        for count in (1, 2):
            ids = set(sub.filter((pl.col("color") == color) & (pl.col("split_count") == count))["comm_id"])
            assert len(ids) == 1
    assert nccl.split_comm_id("0x5d2e9a0c4471b3f8", 1, 0) != nccl.split_comm_id("0x5d2e9a0c4471b3f8",
                                                                                           1, 1)
    assert not any("derived" in m for m in messages(pf))


def test_derived_id_mismatch_is_reported(tmp_path):
    job = NL.make_job("2.27.3")
    text = NL.render(job, interleave=False)
    sub0 = next(c for c in job.comms if c.name == "sub0")
    text = text.replace(f"commId {sub0.pg} - Destroy", "commId 0xdeadbeef - Destroy")
    pf = parse_text(tmp_path, text)
    assert any("derived" in m and "differs" in m for m in messages(pf))


def test_pre_2_16_synthetic_ids(tmp_path):
    job = NL.make_job("2.12.12")
    pf = parse_text(tmp_path, NL.render(job))
    comms = pl.from_arrow(pf.tables["nccl_comms"])
    assert set(comms["comm_id_source"]) == {"synthetic"}
    assert any("predates NCCL 2.16" in m for m in messages(pf))


@pytest.mark.parametrize("era", NL.ERAS)
def test_tuning_attached_to_every_member(tmp_path, era):
    job = NL.make_job(era)
    pf = parse_text(tmp_path, NL.render(job, launcher="pdsh"))
    tun = pl.from_arrow(pf.tables["nccl_tuning"])
    coll = pl.from_arrow(pf.collectives)
    if NL.V(era) < (2, 20, 0):
        assert tun.height == 0 and coll["algorithm"].null_count() == coll.height
        return
    assert tun["collective_id"].null_count() == 0
    assert set(tun["matched_by"]) <= {"op+bytes", "bytes"}
    tuned = coll.filter(pl.col("algorithm").is_not_null())
    # every tuned call is tuned on all its members
    per_call = tuned.group_by(["pg", "seq"]).len()
    assert per_call["len"].min() == per_call.join(coll.group_by(["pg", "seq"]).len(), on=["pg", "seq"])[
        "len_right"].min()
    assert not any("TUNING" in m for m in messages(pf))
    if NL.V(era) >= (2, 24, 0):
        assert tun["channel_lo"].to_list()[0] == 0 and tun["channel_hi"].to_list()[0] == 1
    else:
        assert tun["time_us"].null_count() == 0


def test_single_process_file(tmp_path):
    """NCCL_DEBUG_FILE: one process per file. Peers on sub comms stay ranks in the comm."""
    job = NL.make_job("2.21.5")
    pf = parse_text(tmp_path, NL.render(job, procs=[1]))
    assert got_collectives(pf) == NL.expected_collectives(job, [1], peers_global=False)
    assert got_topology(pf) == NL.expected_topology(job, [1])
    assert pf.meta["rank"] == 1 and pf.meta["pid"] == job.procs[1].pid and pf.meta["device"] == 1
    calls = pl.from_arrow(pf.tables["nccl_calls"])
    # rank 1 is rank 0 of sub1 = {1, 3}: its broadcast from comm rank 1 (global 3, not in this file)
    unknown = calls.filter(pl.col("peer_comm_rank").is_not_null() & ~pl.col("peer_is_global"))
    assert unknown["peer_comm_rank"].to_list() == [1]


def test_without_init_lines(tmp_path):
    """NCCL_DEBUG_SUBSYS=COLL only: each comm pointer is a communicator of the size its lines say, its id
    inferred from that size and the order of first use (equal on all members), calls sequenced per comm. Two
    hosts with devices 0 and 1 give no usable rank; the two disjoint 2-rank groups share an inferred id, which
    is reported."""
    job = NL.make_job("2.21.5")
    text = "\n".join(x for x in NL.render(job).splitlines() if " opCount " in x) + "\n"
    pf = parse_text(tmp_path, text)
    coll = pl.from_arrow(pf.collectives)
    assert coll.height == len(NL.expected_collectives(job))
    assert set(coll["pg"]) == {"inferred-n4-0", "inferred-n2-0"}
    assert coll["rank"].null_count() == coll.height
    assert coll["seq"].null_count() == 0
    world = coll.filter(pl.col("pg") == "inferred-n4-0").group_by("seq").agg(
        pl.len(), pl.col("op").n_unique().alias("ops"), pl.col("count").n_unique().alias("counts"))
    assert set(world["len"]) == {4} and set(world["ops"]) == {1} and set(world["counts"]) == {1}
    assert any("no Init line" in m for m in messages(pf))
    assert any("inferred-n2-0" in m and "ambiguous" in m for m in messages(pf))
    comms = pl.from_arrow(pf.tables["nccl_comms"])
    assert set(comms["comm_id_source"]) == {"inferred"} and comms["rank"].null_count() == comms.height


def test_dev_kind_by_era(tmp_path):
    for era, kind in (("2.4.8", "cudaDev"), ("2.12.12", "busId"), ("2.21.5", "nvmlDev")):
        pf = parse_text(tmp_path, NL.render(NL.make_job(era)), f"{era}.log")
        conns = pl.from_arrow(pf.tables["nccl_connections"])
        assert set(conns["dev_kind"]) == {kind}


def test_graph_rings_and_trees(tmp_path):
    job = NL.make_job("2.18.5")
    pf = parse_text(tmp_path, NL.render(job))
    g = pl.from_arrow(pf.tables["nccl_graph"])
    rings = g.filter(pl.col("kind") == "ring")
    assert set(rings["value"]) == {"0 1 2 3", "0 1"}
    assert rings.filter(pl.col("value") == "0 1 2 3")["comm_id"].to_list() == ["0x5d2e9a0c4471b3f8"] * 2
    trees = g.filter(pl.col("kind") == "tree")
    assert trees["comm_id"].null_count() == 0


# ---------------------------------------------------------------------------------------------------
# other lines, damage


def test_warn_lines_are_diagnostics(tmp_path):
    job = NL.make_job("2.26.2")
    text = NL.render(job, launcher="torchrun")
    text = text.replace("(Recv)\n", "(Recv)\n    continued detail of the error\n", 1)
    pf = parse_text(tmp_path, text)
    w = pl.from_arrow(pf.tables["nccl_warnings"])
    assert w.height == 1 and pf.meta["warn_lines"] == 1
    row = w.row(0, named=True)
    assert row["loc"] == "transport/net_ib.cc:1102" and row["level"] == "WARN"
    assert row["message"].endswith("continued detail of the error")
    assert row["log_time"] is not None  # 2.26: WARN lines carry a timestamp by default
    lines = text.splitlines()
    warn_line = next(i for i, x in enumerate(lines, 1) if "NCCL WARN" in x)
    assert any(d.line == warn_line and "NET/IB" in d.message for d in pf.diagnostics)
    assert pf.meta["unwind_lines"] == 1
    assert pf.meta["continuation_lines"] == 1


def test_garbage_lines_are_counted_once(tmp_path):
    job = NL.make_job("2.23.4")
    text = NL.render(job, launcher="torchrun", garbage=0.3, seed=5)
    n_garbage = sum(1 for x in text.splitlines() if "NCCL INFO" not in x and "NCCL WARN" not in x
                    and x and not x.startswith("NCCL version"))
    pf = parse_text(tmp_path, text)
    assert got_collectives(pf) == NL.expected_collectives(job)
    assert pf.meta["unparsed_lines"] == n_garbage
    summaries = [d for d in pf.diagnostics if "not NCCL log lines" in d.message]
    assert len(summaries) == 1 and str(n_garbage) in summaries[0].message and summaries[0].line


def test_cut_coll_line(tmp_path):
    """A COLL line cut short loses that call (counted), and the ranks then disagree on the calls with
    the same (commId, seq): a warning, not a silent wrong answer."""
    job = NL.make_job("2.21.5")
    lines = NL.render(job, interleave=False).splitlines()
    k = next(i for i, x in enumerate(lines) if f":{job.procs[2].pid}:" in x and "AllGather: opCount" in x)
    lines[k] = lines[k][:lines[k].index(" count ") + 4]
    pf = parse_text(tmp_path, "\n".join(lines) + "\n")
    assert pf.meta["unparsed_lines"] == 1
    assert pf.collectives.num_rows == len(NL.expected_collectives(job)) - 1
    assert any("disagree between ranks" in m for m in messages(pf))


def test_line_cut_at_nccl_limit(tmp_path):
    ring = " ".join(f"{i:3d}" for i in range(400))
    text = f"h:1:1 [0] NCCL INFO Channel 00/02 : {ring}"[:1023] + "\n"
    text += _one_call_log("AllReduce", 4, 7, 2)
    pf = parse_text(tmp_path, text)
    assert pf.meta["cut_lines"] == 1
    assert pl.from_arrow(pf.tables["nccl_graph"])["cut"].to_list() == [True]
    assert any("1 KB" in m for m in messages(pf))


def test_overlong_binary_run(tmp_path, monkeypatch):
    monkeypatch.setattr(nccl_reader, "MAX_LINE", 1000)
    monkeypatch.setattr(nccl_reader, "BLOCK", 4096)
    text = _one_call_log("AllReduce", 4, 7, 2) + "x" * 50000 + "\n" + _one_call_log("Broadcast", 4, 7, 2)
    pf = parse_text(tmp_path, text)
    assert pf.collectives.num_rows == 2
    assert any("longer than 1000 bytes" in m for m in messages(pf))


def test_ray_repeats_and_rccl_tail(tmp_path):
    job = NL.make_job("2.21.5")
    pf = parse_text(tmp_path, NL.render(job, launcher="ray", ray_repeat=True))
    assert pf.meta["ray_repeats"] == 3
    assert pl.from_arrow(pf.tables["nccl_calls"])["repeated"].drop_nulls().to_list() == [3]
    assert any("Ray dropped 3" in m for m in messages(pf))
    rccl = ("h:5:5 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 "
            "root 0 comm 0x9 [nranks=16] stream 0x3 task 4 globalrank 11\n")
    pf = parse_text(tmp_path, rccl, "rccl.log")
    row = pl.from_arrow(pf.tables["nccl_calls"]).row(0, named=True)
    assert pf.collectives.column("rank").to_pylist() == [11] and row["task"] == 4
    assert pf.meta["processes"][0]["rank_source"] == "rccl-globalrank"


def test_watchdog_and_nccl_tests_lines(tmp_path):
    text = (
        "#  Rank  3 Group  0 Pid  48213 on gpu-node-07 device  3 [0x1b] NVIDIA H100 80GB HBM3\n"
        "[rank3]:[E1104 16:41:07.118204311 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=8812, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
        "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
        "gpu-node-07:48213:48213 [3] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count 8 "
        "datatype 7 op 0 root 0 comm 0x9 [nranks=16] stream 0x3\n")
    pf = parse_text(tmp_path, text)
    wd = pl.from_arrow(pf.tables["pytorch_watchdog"]).row(0, named=True)
    assert (wd["rank"], wd["seq_num"], wd["op_type"], wd["numel_in"], wd["timeout_ms"]) == (
        3, 8812, "ALLREDUCE", 1048576, 600000)
    assert pf.collectives.column("rank").to_pylist() == [3]
    assert pf.meta["processes"][0]["rank_source"] == "nccl-tests"
    assert pf.meta["unparsed_lines"] == 0


def test_invalid_utf8_is_replaced(tmp_path):
    data = _one_call_log("AllReduce", 4, 7, 2).encode() + b"\xff\xfe garbage \x80\n" + \
        _one_call_log("Broadcast", 4, 7, 2).encode()
    path = tmp_path / "bad.log"
    path.write_bytes(data)
    pf = nccl.parse(str(path))
    assert pf.collectives.num_rows == 2 and pf.meta["unparsed_lines"] == 1


def test_truncated_gzip_keeps_what_inflated(tmp_path):
    job = NL.make_job("2.21.5")
    text = NL.render(job, launcher="torchrun")
    packed = gzip.compress(text.encode())
    path = tmp_path / "cut.log.gz"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    pf = nccl.parse(str(path))
    assert not pf.complete
    assert 0 < pf.collectives.num_rows < len(NL.expected_collectives(job))
    assert any("ends early" in m for m in messages(pf))


@pytest.mark.parametrize("content", [b"", b"\n\n   \n", bytes(range(256)) * 100,
                                     b'{"traceEvents": []}\n', b"Epoch 1 loss 0.3\nEpoch 2 loss 0.2\n"])
def test_bad_input_raises_trace_error_naming_the_file(tmp_path, content):
    path = tmp_path / "input.log"
    path.write_bytes(content)
    with pytest.raises(TraceError) as e:
        nccl.parse(str(path))
    assert str(path) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        nccl.parse(str(tmp_path / "nope.log"))


# ---------------------------------------------------------------------------------------------------
# properties: damage never raises and never invents a collective

_JOB = NL.make_job("2.21.5")
_TEXT = NL.render(_JOB, launcher="torchrun", seed=11)
_LINES = _TEXT.splitlines(keepends=True)
_TRUTH = Counter((r[3], r[5], r[4]) for r in NL.expected_collectives(_JOB))  # (op, count, dtype)


def _check_no_invention(tmp_path: Path, text: str) -> None:
    path = tmp_path / "damaged.log"
    path.write_text(text)
    try:
        pf = nccl.parse(str(path))
    except TraceError:
        assert "NCCL INFO" not in text or " NCCL" not in text.replace("\n", " ")
        return
    got = Counter((r["op"], r["count"], r["dtype"]) for r in pf.collectives.to_pylist())
    assert not got - _TRUTH
    assert pf.collectives.num_rows <= sum(_TRUTH.values())
    assert pf.collectives.num_rows <= text.count(" opCount ")


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=len(_TEXT)), start=st.integers(min_value=0, max_value=400))
def test_truncation_never_raises_nor_invents(tmp_path, cut, start):
    _check_no_invention(tmp_path, _TEXT[start:cut])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=0, max_value=10**6), frac=st.floats(min_value=0.0, max_value=1.0))
def test_shuffled_lines_never_raise_nor_invent(tmp_path, seed, frac):
    rng = random.Random(seed)
    lines = list(_LINES)
    idx = rng.sample(range(len(lines)), int(len(lines) * frac))
    moved = [lines[i] for i in idx]
    rng.shuffle(moved)
    for i, line in zip(sorted(idx), moved, strict=True):
        lines[i] = line
    # and glue a few neighbours, cut a few others in the middle
    for _ in range(rng.randrange(4)):
        k = rng.randrange(len(lines) - 1)
        lines[k] = lines[k].rstrip("\n") + lines.pop(k + 1)
    for _ in range(rng.randrange(4)):
        k = rng.randrange(len(lines))
        lines[k] = lines[k][: rng.randrange(len(lines[k]) + 1)].rstrip("\n") + "\n"
    _check_no_invention(tmp_path, "".join(lines))


def test_empty_tables_have_their_schemas(tmp_path):
    pf = parse_text(tmp_path, "NCCL version 2.21.5+cuda12.4\nh:1:1 [0] NCCL INFO Bootstrap : Using eth0\n")
    assert pf.collectives.num_rows == 0 and pf.collectives.schema == COLLECTIVES
    assert pf.topology.num_rows == 0
    for name, t in pf.tables.items():
        assert isinstance(t, pa.Table), name
    assert pf.meta["ignored_lines"] == 1


def test_empty_and_long_hostnames(tmp_path):
    """HOST may be empty (``:7311:7311 [0] NCCL INFO``) or a 60-character pod name."""
    job = NL.make_job("2.21.5")
    pod = "trainer-" + "x" * 44 + "-worker-0"
    text = NL.render(job, launcher="torchrun").replace("gpu-node-01:", ":").replace("gpu-node-02:", pod + ":")
    pf = parse_text(tmp_path, text)
    assert got_collectives(pf) == NL.expected_collectives(job)
    hosts = {p["host"] for p in pf.meta["processes"]}
    assert hosts == {"", pod}
    assert set(pf.topology.column("host").to_pylist()) == {"", pod}


# ---------------------------------------------------------------------------------------------------
# excerpts as pasted into bug reports (issue 16): no Init lines, no host prefix, 2.19+ forms

_ANCHOR = re.compile(r"^(.*?)(?<![^\s:\[\]])[^\s:\[\]]*:\d+:\d+ (?=\[)", re.M)


def _strip_hosts(text: str) -> str:
    """The log as pasted without ``host:pid:tid`` (``[dev] NCCL INFO ...``), launcher prefixes kept."""
    return _ANCHOR.sub(r"\1", text)


def _no_host(rows: list[tuple]) -> list[tuple]:
    return sorted((r[:-1] for r in rows), key=lambda t: tuple("" if x is None else str(x) for x in t))


@pytest.mark.parametrize("era", ["2.4.8", "2.12.12", "2.21.5", "2.29.1"])
def test_lines_without_host_prefix(tmp_path, era):
    """``[dev] NCCL INFO ...`` lines of a one-node job (one process per device): the same truth as with
    the prefix, each device being one pseudo-process (host "", pid -2 - dev)."""
    job = NL.make_job(era, gpus_per_host=4)
    text = _strip_hosts(NL.render(job, seed=2))
    assert "NCCL INFO" in text and ":48" not in text.split("NCCL INFO")[1]
    assert nccl.sniff(text.encode()[:65536])
    pf = parse_text(tmp_path, text)
    assert got_collectives(pf) == NL.expected_collectives(job)
    assert _no_host(got_topology(pf)) == _no_host(NL.expected_topology(job))
    assert pf.meta["unparsed_lines"] == 0 and pf.meta["unrecognised_lines"] == 0
    assert pf.meta["bare_lines"] > 0
    procs = pf.meta["processes"]
    assert [(p["host"], p["pid"], p["rank"]) for p in procs] == [("", nccl.bare_pid(g), g) for g in range(4)]


def test_lines_without_any_prefix_are_one_process(tmp_path):
    """``NCCL INFO ...`` with neither host nor device: one pseudo-process (pid -1)."""
    job = NL.make_job("2.21.5")
    text = re.sub(r"^\S+:\d+:\d+ \[\d+\] ", "", NL.render(job, procs=[2]), flags=re.M)
    pf = parse_text(tmp_path, text)
    assert got_collectives(pf) == NL.expected_collectives(job, [2], peers_global=False)
    assert {(p["host"], p["pid"], p["rank"]) for p in pf.meta["processes"]} == {("", -1, 2)}


def test_graph_forms_of_2_19(tmp_path):
    """``Ring 02 : prev -> rank -> next`` and ``Tree 1 : up -> rank -> children`` (2.19+, every rank), and
    ``P2P Chunksize`` lines are read: ring neighbours and trees per comm, no line left not understood."""
    job = NL.make_job("2.21.5")
    pf = parse_text(tmp_path, NL.render(job))
    g = pl.from_arrow(pf.tables["nccl_graph"])
    links = g.filter(pl.col("kind") == "ring_link")
    world = links.filter(pl.col("comm_id") == "0x5d2e9a0c4471b3f8")
    assert world.height == 4 * 2
    assert sorted(set(world["value"])) == ["0->1->2", "1->2->3", "2->3->0", "3->0->1"]
    assert all(int(v.split("->")[1]) == r for v, r in zip(world["value"], world["rank"], strict=True))
    trees = g.filter(pl.col("kind") == "tree")
    assert trees["comm_id"].null_count() == 0
    # the Tree lines say what the Trees line says, in the Trees line's notation
    for key, rows in trees.group_by(["pid", "comm_id", "channel"]):
        assert rows["value"].n_unique() == 1, key
    assert pf.meta["era"] is not None and _in_era((2, 21, 5), pf.meta["era"])
    assert pf.meta["unrecognised_lines"] == 0


def _drop_init(text: str) -> str:
    return "\n".join(x for x in text.splitlines() if not re.search(r"- (?:Init|Destroy) ", x)) + "\n"


def test_nnodes_lines_give_rank_and_size_without_init(tmp_path):
    """An excerpt from 2.20+ without Init lines: the nNodes line names comm, rank and size, so ranks are
    global, transport lines are attributed, comm ids are inferred (equal on every member)."""
    job = NL.make_job("2.21.5")
    pf = parse_text(tmp_path, _drop_init(NL.render(job)))
    coll = pl.from_arrow(pf.collectives)
    truth = NL.expected_collectives(job)
    assert coll.height == len(truth)
    assert sorted(coll["rank"].to_list()) == sorted(r[0] for r in truth)
    assert pl.from_arrow(pf.tables["nccl_calls"])["rank_is_global"].all()
    assert {p["rank_source"] for p in pf.meta["processes"]} == {"nccl-nnodes"}
    comms = pl.from_arrow(pf.tables["nccl_comms"])
    assert set(comms["comm_id_source"]) == {"inferred"}
    # world: one inferred id on all 4 ranks, seq aligned across them
    per = coll.filter(pl.col("nranks") == 4).group_by(["pg", "seq"]).agg(pl.col("rank").n_unique())
    assert per["pg"].n_unique() == 1 and set(per["rank"]) == {4}
    topo = pl.from_arrow(pf.topology)
    assert topo["comm_id"].null_count() == 0 and topo.height == len(NL.expected_topology(job))
    assert any("no Init line" in m for m in messages(pf))


def _one_process_excerpt(dev: int = 0, conn: bool = False, nranks: int = 2) -> str:
    """A 2.21-style excerpt of one process: optionally its transport lines, then COLL lines only."""
    pre = f"gpu-node-03:48213:48391 [{dev}] NCCL INFO "
    lines = []
    if conn:
        lines += [f"{pre}Channel 00/0 : 1[{dev}] -> 0[0] via P2P/CUMEM/read",
                  f"{pre}Channel 01/0 : 1[{dev}] -> 0[0] via P2P/CUMEM/read"]
    for k, (op, count) in enumerate([("ReduceScatter", 1024), ("AllGather", 1024), ("AllReduce", 7)]):
        lines.append(f"{pre}{op}: opCount {k:x} sendbuff 0x7f2d10000000 recvbuff 0x7f2d18000000 count {count} "
                     f"datatype 7 op 0 root 0 comm 0x55e2c04a1b30 [nranks={nranks}] stream 0x55e2bf7c4e10")
    return "\n".join(lines) + "\n"


def test_coll_lines_alone_give_comm_size_and_device_rank(tmp_path):
    """Issue 16 #1: collective lines without Init lines give instances -- comm from the pointer, size from
    ``[nranks=N]``, rank from the device (a guess, reported)."""
    pf = parse_text(tmp_path, _one_process_excerpt(dev=1))
    coll = pl.from_arrow(pf.collectives)
    assert coll["pg"].to_list() == ["inferred-n2-0"] * 3 and coll["seq"].to_list() == [0, 1, 2]
    assert coll["rank"].to_list() == [1] * 3 and coll["nranks"].to_list() == [2] * 3
    assert coll["bytes"].to_list() == [1024 * 4 * 2, 1024 * 4 * 2, 28]
    assert pf.meta["processes"][0]["rank_source"] == "device" and pf.meta["rank"] == 1
    assert any("guessed from its CUDA device" in m for m in messages(pf))
    # a device beyond the comm's size is no rank
    pf = parse_text(tmp_path, _one_process_excerpt(dev=5), "dev5.log")
    assert pf.collectives.column("rank").null_count == 3


def test_transport_lines_without_init_go_to_the_only_comm(tmp_path):
    """Issue 16 #3: ``Channel NN/0 : a[d] -> b[d]`` lines with no Init line before them belong to the
    process's only communicator; they also say the process's rank in it (better than the device)."""
    pf = parse_text(tmp_path, _one_process_excerpt(dev=0, conn=True))
    topo = pl.from_arrow(pf.topology)
    assert topo["comm_id"].to_list() == ["inferred-n2-0"] * 2 and topo["rank"].to_list() == [1, 1]
    assert pf.collectives.column("rank").to_pylist() == [1] * 3
    assert pf.meta["processes"][0]["rank_source"] == "nccl-topology"
    assert not any("attributed" in m for m in messages(pf))


def test_transport_lines_of_an_ambiguous_process_are_kept(tmp_path):
    """Two communicators in the process and no Init line: the transport lines cannot be attributed, but
    stay topology rows (comm_id null), and say so."""
    text = _one_process_excerpt(conn=True) + _one_process_excerpt().replace("0x55e2c04a1b30", "0x55e2c04a1c70")
    pf = parse_text(tmp_path, text)
    topo = pl.from_arrow(pf.topology)
    assert topo.height == 2 and topo["comm_id"].null_count() == 2 and topo["transport"].to_list() == ["P2P"] * 2
    assert any("2 transport lines could not be attributed" in m for m in messages(pf))


def test_destroy_line_after_the_calls_says_rank_and_size(tmp_path):
    text = _one_process_excerpt(dev=0) + ("gpu-node-03:48213:48213 [0] NCCL INFO comm 0x55e2c04a1b30 rank 1 "
                                          "nranks 2 cudaDev 0 busId 1b000 - Destroy COMPLETE\n")
    pf = parse_text(tmp_path, text)
    assert pf.collectives.column("rank").to_pylist() == [1] * 3
    assert pf.meta["processes"][0]["rank_source"] == "nccl-destroy"
    assert pl.from_arrow(pf.tables["nccl_comms"]).height == 1


def test_launcher_rank_beats_the_device(tmp_path):
    """Every process on device 0 (per-process CUDA_VISIBLE_DEVICES), OpenMPI prefixes: ranks from the prefixes."""
    text = "".join(_one_process_excerpt(dev=0).replace("gpu-node-03:48213:48391", f"[1,{r}]<stdout>:n{r}:4{r}:4{r}")
                   for r in (0, 1))
    pf = parse_text(tmp_path, text)
    assert sorted(pf.collectives.column("rank").to_pylist()) == [0, 0, 0, 1, 1, 1]
    assert {p["rank_source"] for p in pf.meta["processes"]} == {"launcher"}
    # without the prefixes both claim device 0: no guess
    pf = parse_text(tmp_path, re.sub(r"\[1,\d\]<stdout>:", "", text), "plain.log")
    assert pf.collectives.column("rank").null_count == 6


def test_lines_not_understood_are_listed_by_kind(tmp_path):
    """Issue 16 #5: every NCCL line the parser has no rule for is counted under its kind, with its first
    example, in one diagnostic; known lines of no interest are not."""
    extra = ["Setting affinity for GPU 0 to ffff,ffffffff", "Allocated 4194304 bytes of device memory",
             "Frobnicating channel 3 with 17 widgets", "Frobnicating channel 4 with 2 widgets",
             "Quux mode enabled", "AllReduce: opCount 1 sendbuff 0x1 recvbuff"]
    text = _one_process_excerpt() + "".join(f"gpu-node-03:48213:48391 [0] NCCL INFO {x}\n" for x in extra)
    pf = parse_text(tmp_path, text)
    assert pf.meta["ignored_lines"] == 2 and pf.meta["unrecognised_lines"] == 4
    kinds = {(u["kind"], u["count"], u["first_line"]) for u in pf.meta["unrecognised"]}
    assert kinds == {("Frobnicating channel # with # widgets", 2, 6), ("Quux mode enabled", 1, 8),
                     ("damaged COLL line", 1, 9)}
    diag = [d for d in pf.diagnostics if "not understood" in d.message]
    assert len(diag) == 1 and diag[0].line == 6 and diag[0].level == "warning"
    assert "2x INFO 'Frobnicating channel # with # widgets' (first at line 6" in diag[0].message
    assert "damaged COLL line" in diag[0].message and "Quux mode enabled" in diag[0].message
