"""A job's topology from its NCCL logs (issue 29): any NCCL log is an input; the topology overview summary prints;
the problems people grep logs for with their file and line; each process group of the traces joined to its
communicator's link class and transport; the what-if's transport selectors; how busy each link class was, and the
verdict's sentence naming the busiest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import tracekit
from tests import kineto_traces as kt
from tracekit.analysis.graph import whatif
from tracekit.analysis.link_classes import sentence
from tracekit.analysis.nccl import topology as nccl_topology
from tracekit.cli import main
from tracekit.model.diagnostics import TraceError
from tracekit.model.units import parse_link_rates

DATA = Path(__file__).parent / "data" / "nccl"
MS = kt.MS


def load(*paths: str | Path, **kw) -> tracekit.Job:  # type: ignore[no-untyped-def]
    return tracekit.load([str(p) for p in paths], cache=False, **kw)


# ----------------------------------------------------------------------------------------------------------------
# the overview


@pytest.mark.parametrize(("name", "text"), [
    ("2.7_info_only_socket_2nodes.log", "2 nodes × 4 GPUs; intra-node P2P/IPC, inter-node NET/Socket — NCCL found no "
     "InfiniBand/RoCE device (NET/IB : No device found, or no libibverbs): check the drivers and NCCL_IB_HCA"),
    ("2.21_ray_workers.log", "2 nodes × 1 GPU; inter-node NET/Socket — no InfiniBand found: check NCCL_IB_*"),
    ("2.7_ib_openmpi.log", "2 nodes × 2 GPUs; intra-node P2P/IPC, inter-node NET/IB (GPU Direct RDMA)"),
    ("2.18_ib_gdr_disabled.log", "2 nodes × 1 GPU; inter-node NET/IB (no GPU Direct RDMA)"),
    ("2.21_ring_cut_64ranks.log", "8 nodes × 8 GPUs; intra-node P2P/CUMEM, inter-node NET/IBext_v8 (GPU Direct "
     "RDMA)"),
    ("2.4_info_only_p2p_shm.log", "1 node × 4 GPUs; intra-node P2P/IPC, SHM"),
    ("2.19_info_only_no_host_roce.log", "1 node × 2 GPUs; intra-node P2P/CUMEM"),
    ("2.19_excerpt_rank8_no_init.log", "intra-node P2P/IPC, inter-node NET/Socket — no InfiniBand found: check "
     "NCCL_IB_*"),
    ("2.20_excerpt_channels_no_init.log", "2 ranks (nodes not known: the log names no host of some ranks and has no "
     "nNodes line); intra-node P2P/IPC"),
])
def test_overview_line(name: str, text: str) -> None:
    assert load(DATA / name).topology_overview["text"] == text


def test_overview_of_an_info_log() -> None:
    job = load(DATA / "2.7_info_only_socket_2nodes.log")
    o = job.topology_overview
    assert (o["world_size"], o["nodes"], o["gpus_per_node"], o["nodes_from"]) == (8, 2, 4, "host names")
    assert o["hosts"] == ["trn-a01", "trn-a02"] and o["intra"] == ["P2P/IPC"] and o["inter"] == ["NET/Socket"]
    assert o["nccl_versions"] == ["2.7.8"] and o["networks"] == ["Socket"] and o["devices"] == ["eth0"]
    assert o["per_communicator"] == [{"comm_id": "synthetic-n8-0", "nranks": 8, "members": 8, "nnodes": 2,
                                      "hosts": 2, "link_class": "inter", "transport": "NET/Socket",
                                      "transports": "NET/Socket, P2P"}]
    comms = job.communicators
    assert comms.height == 8 and comms.select("rank", "host").rows() == [
        (r, "trn-a01" if r < 4 else "trn-a02") for r in range(8)]


def test_connections_class_by_hosts_else_transport() -> None:
    job = load(DATA / "2.7_ib_openmpi.log")
    conns = job.analysis.connections.sort(["rank", "peer", "channel"])
    assert conns.select("rank", "peer", "host", "peer_host", "family", "link_class").unique(
        maintain_order=True).rows() == [
        (0, 1, "gpu-11", "gpu-11", "P2P", "intra"), (0, 3, "gpu-11", "gpu-12", "NET/IB", "inter"),
        (1, 2, "gpu-11", "gpu-12", "NET/IB", "inter"), (2, 1, "gpu-12", "gpu-11", "NET/IB", "inter"),
        (2, 3, "gpu-12", "gpu-12", "P2P", "intra"), (3, 0, "gpu-12", "gpu-11", "NET/IB", "inter")]
    # an excerpt without Init lines: no peer host, the transport says the class
    conns = load(DATA / "2.19_excerpt_rank8_no_init.log").analysis.connections
    assert dict(conns.group_by("family").agg(pl.col("link_class").unique().first()).iter_rows()) == {
        "P2P": "intra", "NET/Socket": "inter"}


@pytest.mark.parametrize(("detail", "family", "name", "cls"), [
    ("P2P/IPC/read", "P2P", "P2P/IPC", "intra"), ("P2P/CUMEM/read", "P2P", "P2P/CUMEM", "intra"),
    ("P2P/direct pointer/read", "P2P", "P2P/direct", "intra"), ("P2P/indirect/3[3]", "P2P", "P2P/indirect", "intra"),
    ("SHM/direct/direct", "SHM", "SHM", "intra"), ("direct shared memory", "SHM", "SHM", "intra"),
    ("NET/IB/0/GDRDMA", "NET/IB", "NET/IB", "inter"), ("NET/IB/0(5)/GDRDMA", "NET/IB", "NET/IB", "inter"),
    ("NET/Socket/3", "NET/Socket", "NET/Socket", "inter"), ("COLLNET/SHARP/0/GDRDMA", "COLLNET", "COLLNET/SHARP",
                                                            "inter"),
])
def test_transport_names(detail: str, family: str, name: str, cls: str) -> None:
    assert nccl_topology.family(detail) == family
    assert nccl_topology.transport_name(detail) == name
    assert nccl_topology.class_of_family(family) == cls


# ----------------------------------------------------------------------------------------------------------------
# any NCCL log is an input


def test_a_log_of_one_version_line_is_not_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "nccl.log"
    p.write_text("NCCL version 2.18.3+cuda12.2\n")
    assert main(["summary", "--no-cache", str(p)]) == 0
    assert "no iterations found: NCCL debug logs only" in capsys.readouterr().out
    q = tmp_path / "train.log"
    q.write_text("epoch 1 loss 0.3\n")
    assert main(["summary", "--no-cache", str(q)]) == 1
    assert "not a trace tracekit can read" in capsys.readouterr().err


def test_summary_json_and_export_of_an_info_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "2.7_info_only_socket_2nodes.log")
    assert main(["summary", "--json", "--no-cache", path]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["topology"]["text"].startswith("2 nodes × 4 GPUs")
    assert [(p["kind"], p["line"]) for p in data["nccl_problems"]] == [("socket-fallback", 3)]
    assert data["nccl_problems"][0]["text"].startswith(f"{path}: line 3: 8 processes")
    assert data["link_classes"] == [] and data["group_links"] == []
    out = tmp_path / "out"
    assert main(["export", "--no-cache", path, "-o", str(out)]) == 0
    written = sorted(p.name for p in out.iterdir())
    for name in ("communicators", "topology", "nccl_graph", "nccl_network", "nccl_problems"):
        assert f"{name}.parquet" in written
    comms = pl.read_parquet(out / "communicators.parquet")
    assert comms.height == 8 and set(comms["comm_id"]) == {"synthetic-n8-0"}
    assert pl.read_parquet(out / "topology.parquet").height == 20


def test_an_info_log_by_rank_through_the_dataset(tmp_path: Path) -> None:
    """Rank by rank (the path of jobs too big for memory) an INFO log is not refused either."""
    job = load(DATA / "2.7_info_only_socket_2nodes.log", by_rank=True, dataset=tmp_path / "ds")
    assert job.topology.height == 20


# ----------------------------------------------------------------------------------------------------------------
# problems


@pytest.mark.parametrize(("name", "kinds"), [
    ("2.4_socket_two_hosts.log", ["socket-fallback"]),
    ("2.21_no_host_prefix_4gpu.log", []),  # sockets, but the job is inside one host: nothing reaches the network
    ("2.18_ib_gdr_disabled.log", ["gdr-disabled"]),
    ("2.20_version_mismatch_warn_k8s.log", ["warn", "version-mismatch"]),
    ("2.26_timestamps_torchrun.log", ["warn"]),
    ("pytorch_2.4_watchdog_rank_stopped.log", ["watchdog-timeout", "stopped-first"]),
    ("pytorch_2.1_watchdog_only.log", ["watchdog-timeout", "hung-collective"]),
])
def test_problems_of_the_excerpts(name: str, kinds: list[str]) -> None:
    p = load(DATA / name).nccl_problems
    assert p["kind"].to_list() == kinds
    assert p["path"].to_list() == [str(DATA / name)] * len(kinds) and p["line"].null_count() == 0


def test_which_rank_stopped_first() -> None:
    p = load(DATA / "pytorch_2.4_watchdog_rank_stopped.log").nccl_problems.rows(named=True)
    assert p[0]["message"] == ("ranks 0, 1, 3: collective SeqNum 42 (ALLREDUCE) timed out after 600.047 s in process "
                               "group 0 (default_pg)") and p[0]["line"] == 5
    assert p[1]["rank"] == 2 and p[1]["line"] == 11 and p[1]["message"].startswith(
        "rank 2 of process group 0 (default_pg) stopped first: last enqueued work 41, while ranks 0, 1, 3 enqueued "
        "up to 42")


def test_version_mismatch_across_files(tmp_path: Path) -> None:
    a, b = tmp_path / "nccl.a.log", tmp_path / "nccl.b.log"
    a.write_text("NCCL version 2.18.3+cuda12.2\nhost-a:10:10 [0] NCCL INFO Using network IB\n")
    b.write_text("host-b:20:20 [0] NCCL INFO NCCL version 2.19.3+cuda12.3\nhost-c:30:30 [0] NCCL INFO NCCL version "
                 "2.19.3+cuda12.3\n")
    p = load(a, b).nccl_problems
    assert p.select("kind", "path", "line").rows() == [("version-mismatch", str(a), 1)]
    assert "versions: 2.18.3 (1x), 2.19.3 (2x)" in p["message"][0]


def test_socket_fallback_when_others_use_ib_or_ib_is_switched_off(tmp_path: Path) -> None:
    p = tmp_path / "nccl.log"
    p.write_text("\n".join([
        "n1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
        "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "n2:2:2 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1",
        "n2:2:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>",
        "n3:3:3 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.3<0>"]) + "\n")
    rows = load(p).nccl_problems.select("kind", "line", "host", "message").rows()
    assert [r[:3] for r in rows] == [("socket-fallback", 3, "n2"), ("socket-fallback", None, "n3")]
    assert "NCCL_IB_DISABLE=1 switched InfiniBand off" in rows[0][3]
    assert "1 other process of the job uses IB" in rows[1][3]


# ----------------------------------------------------------------------------------------------------------------
# a job with its traces and its INFO log: link classes per process group


HOSTS = ["node-a", "node-a", "node-b", "node-b"]
WORLD, TP = "0x7a11c0ffee000001", ("0x7b1100000000000a", "0x7b1100000000000b")
PG_CONFIG = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 4,
              "ranks": [0, 1, 2, 3]},
             {"pg_name": "1", "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 1]},
             {"pg_name": "2", "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [2, 3]}]


def _rank_events(rank: int, steps: int = 3) -> list[kt.Ev]:
    """Per 10 ms step: compute [0.5, 4) ms, the tensor-parallel all-reduce of its pair [4, 5) ms (pg 1 or 2), compute
    [5, 6) ms, the data-parallel all-reduce of all four [6, 9) ms (pg 0) on the compute stream (the next step's
    compute waits for it, as an optimizer step waits for the gradients)."""
    evs: list[kt.Ev] = []
    tp = "1" if rank < 2 else "2"
    for k in range(steps):
        base = kt.EPOCH_NS + k * 10 * MS
        c = 1000 + 10 * k
        evs.append(kt.Ev(f"ProfilerStep#{k + 1}", "user_annotation", base, 10 * MS, tid=1))
        plan = [("sgemm_kernel", MS // 2, 4 * MS, None, None, 7), ("tp", 4 * MS, 5 * MS, tp, 2, 14),
                ("add_kernel", 5 * MS, 6 * MS, None, None, 7), ("dp", 6 * MS, 9 * MS, "0", 4, 7)]
        for j, (name, s, e, pg, n, stream) in enumerate(plan):
            corr = c + j
            evs.append(kt.Ev("cudaLaunchKernel", "cuda_runtime", base + 100_000 * (j + 1), 1000, tid=1,
                             args={"correlation": corr}))
            if pg is None:
                evs.append(kt.Ev(name, "kernel", base + s, e - s, device=rank, stream=stream,
                                 args={"correlation": corr}))
                continue
            elems = (1 << 22) if name == "dp" else (1 << 18)
            evs.append(kt.Ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                             "kernel", base + s, e - s, device=rank, stream=stream, args={
                                 "correlation": corr, "Collective name": "allreduce", "In msg nelems": elems,
                                 "Out msg nelems": elems, "Group size": n, "dtype": "Float",
                                 "Process Group Name": pg}))
    return evs


def _info_log() -> str:
    """NCCL_DEBUG=INFO of the four processes (2.21): the world communicator (a ring over both hosts, NET/IB between
    them, P2P inside) and each host's pair (P2P); no COLL line."""
    lines = ["NCCL version 2.21.5+cuda12.4"]
    for r in range(4):
        pid, h = 7000 + r, HOSTS[r]
        pre = f"{h}:{pid}:{pid + 50} [{r % 2}] NCCL INFO "
        lines.append(f"{h}:{pid}:{pid} [{r % 2}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.{r}<0>")
        lines.append(f"{h}:{pid}:{pid} [{r % 2}] NCCL INFO Using network IB")
        lines.append(pre + f"ncclCommInitRank comm 0x55aa000{r}0 rank {r} nranks 4 cudaDev {r % 2} nvmlDev {r % 2} "
                           f"busId {r % 2}1000 commId {WORLD} - Init START")
        lines.append(pre + f"comm 0x55aa000{r}0 rank {r} nRanks 4 nNodes 2 localRanks 2 localRank {r % 2} MNNVL 0")
        nxt, prv = (r + 1) % 4, (r - 1) % 4
        if HOSTS[nxt] == HOSTS[r]:
            lines.append(pre + f"Channel 00/0 : {r}[{r % 2}] -> {nxt}[{nxt % 2}] via P2P/CUMEM/read")
        else:
            lines.append(pre + f"Channel 00/0 : {r}[{r % 2}] -> {nxt}[{nxt % 2}] [send] via NET/IB/0/GDRDMA")
        if HOSTS[prv] != HOSTS[r]:
            lines.append(pre + f"Channel 00/0 : {prv}[{prv % 2}] -> {r}[{r % 2}] [receive] via NET/IB/0/GDRDMA")
        lines.append(pre + f"ncclCommInitRank comm 0x55aa000{r}0 rank {r} nranks 4 cudaDev {r % 2} nvmlDev {r % 2} "
                           f"busId {r % 2}1000 commId {WORLD} - Init COMPLETE")
        tp, me = TP[r // 2], r % 2
        lines.append(pre + f"ncclCommInitRank comm 0x55bb000{r}0 rank {me} nranks 2 cudaDev {me} nvmlDev {me} "
                           f"busId {me}1000 commId {tp} - Init START")
        lines.append(pre + f"comm 0x55bb000{r}0 rank {me} nRanks 2 nNodes 1 localRanks 2 localRank {me} MNNVL 0")
        lines.append(pre + f"Channel 00/0 : {me}[{me}] -> {1 - me}[{1 - me}] via P2P/CUMEM/read")
        lines.append(pre + f"ncclCommInitRank comm 0x55bb000{r}0 rank {me} nranks 2 cudaDev {me} nvmlDev {me} "
                           f"busId {me}1000 commId {tp} - Init COMPLETE")
    return "\n".join(lines) + "\n"


def _job(directory: Path, *, pg_config: bool = True, log: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(4):
        kt.write(directory / f"rank{r}.json", _rank_events(r), rank=r, world_size=4,
                 pg_config=PG_CONFIG if pg_config else None)
    if log:
        (directory / "nccl.log").write_text(_info_log())
    return directory


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory.mktemp("tp-dp"))


@pytest.fixture(scope="module")
def job(job_dir: Path) -> tracekit.Job:
    return load(job_dir, link_bw="100gbit")


WANT_GROUPS = [("0", WORLD, "inter", "NET/IB", "NET/IB, P2P", 2, "nccl-log"),
               ("1", TP[0], "intra", "P2P", "P2P", 1, "nccl-log"),
               ("2", TP[1], "intra", "P2P", "P2P", 1, "nccl-log")]


def test_each_process_group_gets_its_link_class_from_the_log(job: tracekit.Job) -> None:
    assert job.group_links.select("pg", "comm_id", "link_class", "transport", "transports", "nnodes",
                                  "source").rows() == WANT_GROUPS


def test_without_pg_config_the_calling_ranks_pick_the_communicator(tmp_path: Path) -> None:
    j = load(_job(tmp_path / "job", pg_config=False))
    assert j.group_links.select("pg", "comm_id", "link_class", "transport", "source").rows() == [
        (*r[:4], r[6]) for r in WANT_GROUPS]


def test_without_the_log_no_link_class_is_claimed(tmp_path: Path) -> None:
    j = load(_job(tmp_path / "job", log=False))
    assert j.group_links.height == 0 and j.link_classes.height == 0  # the traces name no host


def test_link_classes_busy_and_the_verdict_names_the_busiest(job: tracekit.Job) -> None:
    rows = job.link_classes.rows(named=True)
    assert [(r["link_class"], r["transport"], r["ranks"], r["calls"]) for r in rows] == [
        ("inter", "NET/IB", 4, 12), ("intra", "P2P", 4, 12)]
    wall = job.breakdown.group_by("rank").agg(pl.col("wall_ns").sum())["wall_ns"].sum()
    assert rows[0]["busy_ns"] == 4 * 3 * 3 * MS and rows[1]["busy_ns"] == 4 * 3 * MS
    assert rows[0]["wall_ns"] == rows[1]["wall_ns"] == wall
    assert rows[0]["busy_share"] == pytest.approx(36 * MS / wall)
    text = sentence(job.link_classes.to_dicts())
    inter, intra = 100 * 36 * MS / wall, 100 * 12 * MS / wall
    assert text == f"Inter-node NET/IB is {inter:.0f} % busy; intra-node P2P {intra:.0f} %"
    assert text in job.verdict.links
    v = job.verdict  # the one verdict names the binding class where the link binds
    assert v.kind not in ("link-bound", "mixed") or text in v.text
    assert job.summary()["link_classes"] == job.link_classes.to_dicts()


def test_the_whatif_selects_links_by_transport(job: tracekit.Job) -> None:
    model = job.analysis.whatif
    comm = model.comm
    assert dict(comm.group_by("link").agg(pl.col("transport").first()).iter_rows()) == {
        "0": "NET/IB", "1": "P2P", "2": "P2P"}
    base = whatif.transfers(model, whatif.Scenario())
    inter = (comm["link_class"] == "inter").to_numpy()
    for sel, changed in (("net", inter), ("inter", inter), ("ib", inter), ("net/ib", inter), ("nvlink", ~inter),
                         ("p2p", ~inter), ("intra", ~inter)):
        new = whatif.transfers(model, whatif.Scenario(links=((sel, 1e9),)))
        assert np.array_equal(~np.isclose(new, base), changed), sel
    with pytest.raises(ValueError, match=r"no link matches 'socket'.*transport of the job's NCCL logs \(NET/IB, P2P\)"):
        whatif.transfers(model, whatif.Scenario(links=(("socket", 1e9),)))


def test_whatif_and_link_bw_accept_transport_names(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_link_rates("inter=400gbit,net/ib=100gbit,nvlink=900GB/s") == (None, {
        "inter": 4e11, "net/ib": 1e11, "nvlink": 7.2e12})
    assert main(["whatif", "--no-cache", str(job_dir), "--link-bw", "net=100gbit,nvlink=2400gbit", "--bandwidth",
                 "net=25gbit,net=400gbit", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["links"] for r in rows] == ["net=25 Gbit/s", "net=400 Gbit/s", None]  # + stragglers removed
    assert [r["stragglers_removed"] for r in rows] == [False, False, True]
    assert rows[0]["speedup"] < 0.9 and rows[1]["speedup"] >= 1  # the data-parallel all-reduce paces the next step
    with pytest.raises(TraceError, match="intra, inter or a transport"):
        parse_link_rates("ib+x=1gbit")


def test_summary_shows_the_topology_and_the_busiest_class(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", "--no-cache", str(job_dir), "--link-bw", "100gbit"]) == 0
    out = capsys.readouterr().out
    assert "NCCL topology (from the debug logs): 2 nodes × 2 GPUs; intra-node P2P/CUMEM, inter-node NET/IB (GPU " \
           "Direct RDMA)" in out
    assert "Inter-node NET/IB is" in out and "intra-node P2P" in out
