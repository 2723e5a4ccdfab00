"""The NCCL log parser on excerpts as people paste them into bug reports (``tests/data/nccl``: synthetic,
written from the grammar; README.md there says what each one exercises): every era from 2.4, InfiniBand,
RoCE, Socket, NVLS, CollNet/SHARP, ``NCCL_DEBUG_SUBSYS=ALL``, launcher and logger prefixes, several jobs in
one file, excerpts without Init lines or without the ``host:pid:tid`` prefix (issue 16)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest

from tracekit.parsers import detect, nccl

DATA = Path(__file__).parent / "data" / "nccl"


@dataclass
class Expect:
    """What one excerpt must give."""

    version: str | None
    #: per process in meta order: (host, pid, rank, rank_source)
    procs: list[tuple[str, int, int | None, str | None]]
    calls: int
    instances: int  # distinct (pg, seq)
    matched: int  # of those, logged by more than one rank
    pgs: set[str]
    topology: int
    unattributed: int
    transports: set[str]
    graph: dict[str, int] = field(default_factory=dict)
    algorithms: set[str] = field(default_factory=set)
    unrecognised: dict[str, int] = field(default_factory=dict)  # kind -> lines
    unparsed: int = 0
    diagnostics: list[str] = field(default_factory=list)  # substrings, one diagnostic each
    graph_unattributed: int = 0  # ring/tree rows of no known communicator (excerpts without Init lines)


CORPUS: dict[str, Expect] = {
    "2.4_socket_two_hosts.log": Expect(
        "2.4.8", [("node-a", 2101, 0, "nccl-init"), ("node-b", 3307, 1, "nccl-init")], 6, 3, 3,
        {"synthetic-n2-0"}, 8, 0, {"NET/Socket"}, {"ring": 2, "tree": 4}),
    "2.7_ib_openmpi.log": Expect(
        "2.7.8", [("gpu-11", 40211, 0, "nccl-init"), ("gpu-11", 40212, 1, "nccl-init"),
                  ("gpu-12", 51870, 2, "nccl-init"), ("gpu-12", 51871, 3, "nccl-init")], 8, 2, 2,
        {"synthetic-n4-0"}, 6, 0, {"NET/IB", "P2P"}, {"ring": 2, "tree": 8}),
    "2.12_roce_srun.log": Expect(
        "2.12.12", [("roce-01", 7311, 0, "nccl-init"), ("roce-02", 6920, 1, "nccl-init")], 6, 3, 3,
        {"synthetic-n2-0"}, 8, 0, {"NET/IB"}, {"ring": 2, "tree": 4}),
    "2.18_excerpt_coll_only.log": Expect(
        None, [("gpu-node-07", 48213, 0, "device")], 4, 4, 0, {"inferred-n2-0"}, 0, 0, set(),
        diagnostics=["guessed from its CUDA device", "have no Init line"]),
    "2.18_excerpt_coll_only_pair.log": Expect(
        None, [("trainer-0", 31022, 0, "device"), ("trainer-0", 31023, 1, "device")], 6, 3, 3, {"inferred-n2-0"},
        0, 0, set(), diagnostics=["rank of 2 processes", "have no Init line"]),
    "2.19_excerpt_graph_no_init.log": Expect(
        None, [("gpu-b", 9102, 3, "nccl-nnodes")], 3, 3, 0, {"inferred-n4-0"}, 4, 0, {"NET/IB", "P2P"},
        {"ring_link": 2, "tree": 4}, diagnostics=["have no Init line"]),
    "2.20_excerpt_channels_no_init.log": Expect(
        None, [("dgx-3", 30417, 1, "nccl-topology")], 3, 3, 0, {"inferred-n2-0"}, 2, 0, {"P2P"},
        diagnostics=["have no Init line"]),
    "2.20_excerpt_two_comms_no_init.log": Expect(
        None, [("dgx-3", 30418, None, None)], 3, 3, 0, {"inferred-n2-0", "inferred-n2-1"}, 2, 2, {"P2P"},
        diagnostics=["have no Init line", "2 transport lines could not be attributed"]),
    "2.20_logger_prefixes_k8s.log": Expect(
        "2.20.5", [("pod-0", 1, 0, "nccl-init"), ("", -2, 1, "nccl-init")], 4, 2, 2, {"0x55aa66bb77cc88dd"}, 4, 0,
        {"NET/IB"}, algorithms={"RING"}, unparsed=1, diagnostics=["1 of 21 lines are not NCCL log lines"]),
    "2.21_no_host_prefix_4gpu.log": Expect(
        "2.21.5", [("", -2 - d, d, "nccl-init") for d in range(4)], 12, 3, 3, {"0x8e1f3a2b77c0d415"}, 8, 0,
        {"P2P"}, {"ring": 2, "tree": 8}, {"RING", "TREE"}),
    "2.21_ray_workers.log": Expect(
        "2.21.5", [("ray-w1", 8801, 0, "nccl-init"), ("ray-w2", 5130, 1, "nccl-init")], 4, 2, 2,
        {"0x0f1e2d3c4b5a6978"}, 4, 0, {"NET/Socket"}, diagnostics=["Ray dropped 3 repeated lines"]),
    "2.21_two_jobs_one_file.log": Expect(
        "2.21.5", [("job1-a", 4410, 0, "nccl-init"), ("job2-x", 9120, 0, "nccl-init"),
                   ("job1-a", 4411, 1, "nccl-init"), ("job2-y", 6033, 1, "nccl-init")], 6, 3, 3,
        {"0x1a2b3c4d5e6f7081", "0x9f8e7d6c5b4a3928"}, 6, 0, {"NET/IB", "P2P"}),
    "2.22_collnet_sharp.log": Expect(
        "2.22.3", [("sharp-01", 11200, 0, "nccl-init"), ("sharp-02", 10874, 1, "nccl-init")], 4, 2, 2,
        {"0x6a7b8c9d0e1f2031"}, 8, 0, {"COLLNET", "NET/IBext"}, {"ring": 2, "tree": 4},
        {"COLLNET_DIRECT", "COLLNET_CHAIN"}),
    "2.22_no_prefix_at_all.log": Expect(
        "2.22.3", [("", -1, 1, "nccl-init")], 4, 4, 0, {"0x2f6e1c9a0b3d4e57"}, 4, 0, {"NET/Socket"},
        {"ring_link": 2, "tree": 2}),
    "2.23_nvls_h100_rank0.log": Expect(
        "2.23.4", [("h100-n1", 5501, 0, "nccl-init")], 3, 3, 0, {"0x3c4d5e6f708192a3"}, 2, 0, {"P2P"},
        {"ring": 2, "ring_link": 2, "tree": 2}, {"NVLS", "TREE"}),
    "2.24_debug_subsys_all.log": Expect(
        "2.24.3", [("ws-gpu", 20133, 0, "nccl-init")], 3, 3, 0, {"0x7e2d4c1b0a9f8e63"}, 2, 0, {"P2P"},
        {"ring": 2, "ring_link": 2, "tree": 2}, {"RING"},
        {"Registered buffer # size # (comm": 2, "Profiler: event buffer # entries for": 1},
        diagnostics=["3 NCCL lines of 2 kinds were not understood"]),
    "2.26_timestamps_torchrun.log": Expect(
        "2.26.2", [("gpu-c", 7001, 0, "nccl-init"), ("gpu-c", 7002, 1, "nccl-init")], 2, 1, 1,
        {"0x4b5c6d7e8f901a2b"}, 2, 0, {"P2P"}, {"ring": 1, "ring_link": 2, "tree": 2}, {"RING"},
        diagnostics=["Cuda failure 'invalid device pointer'"]),
    # NCCL_DEBUG=INFO alone (issue 29): init, rings, trees, transports and no per-collective line
    "2.4_info_only_p2p_shm.log": Expect(
        "2.4.8", [("dgx1v", 2210 + r, r, "nccl-init") for r in range(4)], 0, 0, 0, set(), 8, 0, {"P2P", "SHM"},
        {"ring": 2, "tree": 8}),
    "2.7_info_only_socket_2nodes.log": Expect(
        "2.7.8", [(h, pid, r, "nccl-init") for r, (h, pid) in enumerate(
            [("trn-a01", 51200), ("trn-a01", 51213), ("trn-a01", 51226), ("trn-a01", 51239), ("trn-a02", 40924),
             ("trn-a02", 40935), ("trn-a02", 40946), ("trn-a02", 40957)])], 0, 0, 0, set(), 20, 0,
        {"NET/Socket", "P2P"}, {"ring": 2, "tree": 16}),
    "2.9_collnet_coll_lines.log": Expect(
        "2.9.9", [("sharp-n1", 9011, 0, "nccl-init"), ("sharp-n2", 9406, 1, "nccl-init")], 0, 0, 0, set(), 8, 0,
        {"COLLNET", "NET/IB"}),
    "2.18_ib_gdr_disabled.log": Expect(
        "2.18.5", [("ib-node1", 7712, 0, "nccl-init"), ("ib-node2", 8054, 1, "nccl-init")], 0, 0, 0, set(), 8, 0,
        {"NET/IB"}, {"ring": 2, "tree": 4}),
    "2.19_excerpt_rank8_no_init.log": Expect(
        None, [("node-b07", 118204, None, None)], 0, 0, 0, set(), 10, 10, {"NET/Socket", "P2P"},
        {"ring_link": 4, "tree": 4}, diagnostics=["10 transport lines could not be attributed"], graph_unattributed=8),
    "2.19_info_only_no_host_roce.log": Expect(
        "2.19.3", [("", -2, 0, "nccl-init"), ("", -3, 1, "nccl-init")], 0, 0, 0, set(), 4, 0, {"P2P"},
        {"ring": 2, "ring_link": 4, "tree": 4}),
    "2.20_version_mismatch_warn_k8s.log": Expect(
        "2.20.5", [("trainer-0", 1, 0, "nccl-init"), ("trainer-1", 1, 1, "nccl-init")], 0, 0, 0, set(), 4, 0,
        {"NET/Socket"}, {"ring": 2, "tree": 4}, diagnostics=["NCCL WARN from trainer-1:1: socketStartConnect"]),
    "2.21_ring_cut_64ranks.log": Expect(
        "2.21.5", [("a100-0001", 30122, 0, "nccl-init")], 0, 0, 0, set(), 4, 0, {"NET/IBext_v8", "P2P"},
        {"ring": 1, "ring_link": 1, "tree": 2}),
    "pytorch_2.1_watchdog_only.log": Expect(
        None, [], 0, 0, 0, set(), 0, 0, set(), unparsed=3, diagnostics=["3 of 8 lines are not NCCL log lines"]),
    "pytorch_2.4_watchdog_rank_stopped.log": Expect(
        None, [("gpu-x9", 60211 + r, r, "nccl-init") for r in range(4)], 0, 0, 0, set(), 0, 0, set(), unparsed=1,
        diagnostics=["1 of 13 lines are not NCCL log lines"]),
}


def test_every_excerpt_is_listed_and_described() -> None:
    files = sorted(p.name for p in DATA.glob("*.log"))
    assert files == sorted(CORPUS)
    readme = (DATA / "README.md").read_text()
    assert "synthetic" in readme
    for name in files:
        assert f"`{name}`" in readme, name


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_excerpt(name: str) -> None:
    exp = CORPUS[name]
    path = DATA / name
    assert nccl.sniff(path.read_bytes()[:65536])
    fmt = detect(str(path))
    assert fmt is not None and fmt.name == "nccl-log"
    pf = nccl.parse(str(path))
    assert pf.meta["nccl_version"] == exp.version
    assert [(p["host"], p["pid"], p["rank"], p["rank_source"]) for p in pf.meta["processes"]] == exp.procs
    coll = pl.from_arrow(pf.collectives)
    assert coll.height == exp.calls
    assert coll["pg"].null_count() == 0 and coll["seq"].null_count() == 0
    assert set(coll["pg"]) == exp.pgs
    inst = coll.group_by(["pg", "seq"]).agg(pl.col("rank").n_unique().alias("ranks"),
                                            pl.col("op").n_unique().alias("ops"), pl.col("bytes").n_unique().alias("b"))
    assert inst.height == exp.instances
    assert inst.filter(pl.col("ranks") > 1).height == exp.matched
    assert set(inst["ops"]) <= {1} and set(inst["b"]) <= {1}  # members agree on what each call was
    ranked = [p[2] for p in exp.procs if p[2] is not None]
    assert coll["rank"].null_count() == (0 if len(ranked) == len(exp.procs) else coll.height)
    assert set(coll["algorithm"].drop_nulls()) == exp.algorithms
    topo = pl.from_arrow(pf.topology)
    assert topo.height == exp.topology and (topo["comm_id"].null_count() if topo.height else 0) == exp.unattributed
    assert set(topo["transport"]) == exp.transports
    graph = pl.from_arrow(pf.tables["nccl_graph"])
    assert dict(graph.group_by("kind").len().iter_rows()) == exp.graph
    assert (graph["comm_id"].null_count() if graph.height else 0) == exp.graph_unattributed
    assert {u["kind"]: u["count"] for u in pf.meta["unrecognised"]} == exp.unrecognised
    assert pf.meta["unrecognised_lines"] == sum(exp.unrecognised.values())
    assert pf.meta["unparsed_lines"] == exp.unparsed
    msgs = [d.message for d in pf.diagnostics]
    for want in exp.diagnostics:
        assert sum(want in m for m in msgs) == 1, (want, msgs)
    assert len(msgs) == len(exp.diagnostics), msgs
    if pf.meta["era"] is not None and exp.version is not None:
        assert _in_era(exp.version, pf.meta["era"])


def _in_era(version: str, text: str) -> bool:
    v = tuple(int(x) for x in version.split("."))

    def parse(t: str) -> tuple[int, ...]:
        return tuple(99 if x == "x" else int(x) for x in t.split("."))

    if text.startswith(">="):
        return v >= parse(text[2:])
    if text.startswith("<="):
        return v <= parse(text[2:])
    lo, hi = text.split("-")
    return parse(lo) <= v <= parse(hi)


def _parse(name: str):  # type: ignore[no-untyped-def]
    return nccl.parse(str(DATA / name))


def test_issue_example_gives_collective_instances() -> None:
    """The excerpt quoted in issue 16: calls keyed by (inferred commId, seq), sizes from the lines."""
    coll = pl.from_arrow(_parse("2.18_excerpt_coll_only.log").collectives)
    assert coll.select("op", "seq", "nranks", "bytes", "dtype").rows() == [
        ("reduce_scatter", 0, 2, 8192, "float32"), ("allgather", 1, 2, 8192, "float32"),
        ("reduce_scatter", 2, 2, 8192, "float32"), ("allgather", 3, 2, 8192, "float32")]
    pair = pl.from_arrow(_parse("2.18_excerpt_coll_only_pair.log").collectives)
    per_seq = pair.group_by("seq").agg(pl.col("rank").sort()).sort("seq")
    assert per_seq["rank"].to_list() == [[0, 1]] * 3


def test_nnodes_excerpt_reads_rank_nodes_rings_and_trees() -> None:
    pf = _parse("2.19_excerpt_graph_no_init.log")
    comm = pl.from_arrow(pf.tables["nccl_comms"]).row(0, named=True)
    assert (comm["rank"], comm["nranks"], comm["nnodes"], comm["local_ranks"], comm["local_rank"]) == (3, 4, 2, 2, 1)
    assert comm["comm_id_source"] == "inferred" and comm["coll_channels"] == 2
    g = pl.from_arrow(pf.tables["nccl_graph"])
    assert g.filter(pl.col("kind") == "ring_link")["value"].to_list() == ["2->3->0", "2->3->0"]
    trees = g.filter(pl.col("kind") == "tree")["value"].to_list()
    assert trees == ["-1/-1/-1->3->2"] * 4  # the Tree lines in the Trees line's notation
    topo = pl.from_arrow(pf.topology).sort(["channel", "peer"])
    assert topo.select("rank", "peer", "direction", "transport").rows() == [
        (3, 0, "send", "NET/IB"), (3, 2, None, "P2P"), (3, 0, "send", "NET/IB"), (3, 2, None, "P2P")]


def test_nvls_and_collnet_details() -> None:
    comm = pl.from_arrow(_parse("2.23_nvls_h100_rank0.log").tables["nccl_comms"]).row(0, named=True)
    assert (comm["nvls_channels"], comm["coll_channels"], comm["p2p_channels"], comm["nnodes"]) == (16, 24, 32, 1)
    pf = _parse("2.22_collnet_sharp.log")
    collnet = pl.from_arrow(pf.topology).filter(pl.col("transport") == "COLLNET")
    assert collnet.height == 4 and set(collnet["detail"]) == {"COLLNET/SHARP/0/GDRDMA"}
    assert sorted(collnet["direction"].to_list()) == ["receive", "receive", "send", "send"]
    assert pf.meta["network"] == ["IB", "IBext"]


def test_prefixes_and_timestamps_are_kept() -> None:
    calls = pl.from_arrow(_parse("2.26_timestamps_torchrun.log").tables["nccl_calls"])
    assert calls["prefix"].cast(pl.String).to_list() == ["[default0]:", "[default1]:"]
    assert calls["log_time"].to_list() == ["2025-06-02 09:14:05"] * 2
    procs = _parse("2.7_ib_openmpi.log").meta["processes"]
    assert [p["prefixes"] for p in procs] == [[f"[1,{r}]<stdout>:"] for r in range(4)]


def test_cli_summary_of_excerpts(capsys: pytest.CaptureFixture[str]) -> None:
    """The communicators of excerpts without Init lines reach the summary (they used to show no comm)."""
    from tracekit.cli import main

    assert main(["summary", "--no-cache", str(DATA / "2.18_excerpt_coll_only_pair.log"),
                 str(DATA / "2.19_excerpt_graph_no_init.log")]) == 0
    out = capsys.readouterr().out
    assert "inferred-n2-0" in out and "inferred-n4-0" in out


# ----------------------------------------------------------------------------------------------------------------
# issue 29: every line of topology the excerpts hold becomes a row, with the rank and host the line says


#: a transport line, read independently of the parser: the process's host (absent without host:pid:tid), the
#: ends and the direction
_TRANSPORT = re.compile(
    r"(?:(?P<host>[^\s:\[\]]*):\d+:\d+ \[\d+\] )?NCCL INFO (?:Ring|Channel|CollNet|Coll) \d+(?:/\d+)? : "
    r"(?P<src>\d+)(?:\[\w+\])?(?: -> (?P<dst>\d+)(?:\[\w+\])?)?(?: \[(?P<dir>send|receive)\])? via \S")
#: ring and tree lines: ring orders (``Channel 00/02 :  0 1``, 2.4's ``Ring 00 :  0 1``), ring neighbours
#: (``Ring 02 : 2 -> 0 -> 1``), trees (``Trees [0] ...`` with one row per channel, ``Tree 1 : up -> rank -> down``)
_RING_ORDER = re.compile(r"NCCL INFO (?:Channel|Ring) \d+(?:/\d+)? :(?: +\d+)+(?: *\d*\.\.\.)? *$")
_RING_LINK = re.compile(r"NCCL INFO Ring \d+ : -?\d+ -> (?P<me>\d+) -> -?\d+\s*$")
_TREE_LINK = re.compile(r"NCCL INFO Tree \d+ : -?\d+ -> (?P<me>\d+) -> ")
_TREES = re.compile(r"NCCL INFO Trees((?: \[\d+\] \S+)+)")


def _expected_rows(lines: list[str]) -> tuple[list[tuple[int, str, int]], dict[int, list[int | None]]]:
    """From the text alone: (line, host, logging rank) of every transport line, and per ring/tree line the ranks
    its rows are about (None for a ring order)."""
    conns, graph = [], {}
    for no, text in enumerate(lines, 1):
        m = _TRANSPORT.search(text)
        if m:
            rank = int(m["dst"]) if m["dir"] == "receive" and m["dst"] else int(m["src"])
            conns.append((no, m["host"] or "", rank))
            continue
        if _RING_ORDER.search(text):
            graph[no] = [None]
        elif m := _RING_LINK.search(text) or _TREE_LINK.search(text):
            graph[no] = [int(m["me"])]
        elif m := _TREES.search(text):
            graph[no] = [int(t.split("->")[1]) if "|" not in t else int(t.split("|")[0].split("->")[1])
                         for t in re.findall(r"\] (\S+)", m[1])]
    return conns, graph


def test_topology_lines_become_rows_with_their_rank_and_host() -> None:
    """Issue 29's measure: >= 95 % of the transport lines and of the ring/tree lines of the excerpts become rows,
    ranks and hosts right where the log says them (here: all of them)."""
    seen = found = g_seen = g_found = 0
    for name in sorted(CORPUS):
        lines = (DATA / name).read_text().splitlines()
        conns, graph = _expected_rows(lines)
        pf = _parse(name)
        got = sorted(zip(pf.tables["nccl_connections"].column("line").to_pylist(),
                         [h or "" for h in pf.topology.column("host").to_pylist()],
                         pf.topology.column("rank").to_pylist(), strict=True))
        seen += len(conns)
        found += len(set(got) & set(conns))
        assert got == sorted(conns), name
        g = pl.from_arrow(pf.tables["nccl_graph"])
        rows: dict[int, list[int | None]] = {}
        for line, kind, rank in g.select("line", "kind", "rank").iter_rows() if g.height else []:
            rows.setdefault(line, []).append(None if kind == "ring" else rank)
        g_seen += sum(len(v) for v in graph.values())
        g_found += sum(min(len(v), len(rows.get(k, []))) for k, v in graph.items())
        assert rows == graph, name
    assert seen >= 136 and found / seen >= 0.95
    assert g_seen >= 127 and g_found / g_seen >= 0.95


def _nccl_lines(lines: list[str]) -> bool:
    return any(re.search(r"NCCL (?:INFO|WARN)|NCCL version|Watchdog caught|NCCL work: ", t) for t in lines)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_a_log_cut_at_every_line_boundary_keeps_its_complete_lines(tmp_path: Path, name: str) -> None:
    """Cut after any line, a log gives the rows of the lines before the cut, and is refused only where no NCCL line
    is left."""
    from tracekit.model.diagnostics import TraceError

    lines = (DATA / name).read_text().splitlines(keepends=True)
    conns, graph = _expected_rows([x.rstrip("\n") for x in lines])
    path = tmp_path / name
    for k in range(1, len(lines) + 1):
        path.write_text("".join(lines[:k]))
        try:
            pf = nccl.parse(str(path))
        except TraceError:
            assert not _nccl_lines(lines[:k]), (name, k)
            continue
        assert pf.topology.num_rows == sum(1 for no, _, _ in conns if no <= k), (name, k)
        assert pf.tables["nccl_graph"].num_rows == sum(len(v) for no, v in graph.items() if no <= k), (name, k)
        assert pf.tables["communicators"].num_rows == len(pf.tables["nccl_comms"]), (name, k)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_no_excerpt_is_refused(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``tracekit summary`` and ``export`` of every excerpt (an NCCL line at least): exit 0; export writes the
    topology and the communicators where the log has them."""
    from tracekit.cli import main

    path = str(DATA / name)
    assert main(["summary", "--no-cache", path]) == 0
    out = capsys.readouterr().out
    pf = _parse(name)
    if pf.topology.num_rows or pf.tables["communicators"].num_rows:
        assert "NCCL topology" in out
    assert main(["export", "--no-cache", path, "-o", str(tmp_path / "out")]) == 0
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert "nccl_problems.parquet" in written
    assert ("topology.parquet" in written) == (pf.topology.num_rows > 0)
    assert ("communicators.parquet" in written) == (pf.tables["communicators"].num_rows > 0)
