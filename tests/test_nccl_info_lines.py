"""The NCCL-log parser on what ``NCCL_DEBUG=INFO`` prints besides per-collective lines (issue 29): network devices
(IB/RoCE HCAs and ports, Socket interfaces), GPU Direct RDMA in every era's form, the network plugin, ``NCCL_*``
settings, why InfiniBand was not used, PyTorch's watchdog lines of every era, rings cut by NCCL, CollNet's ``Coll``
lines of 2.7-2.11, shared memory's 2.4-2.13 form, the versions of a file, and the public ``communicators`` table."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.model.schema import COMMUNICATORS, NCCL_GRAPH, NCCL_NETWORK
from tracekit.parsers import detect, nccl
from tracekit.parsers.nccl.network import GDR, NET_USING


def parse_lines(tmp_path: Path, lines: list[str], name: str = "nccl.log"):  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return nccl.parse(str(path))


def frame(pf, name: str) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    out = pl.from_arrow(pf.tables[name])
    assert isinstance(out, pl.DataFrame)
    return out


P = "gpu-1:4100:4100 [0] NCCL INFO "


def test_ib_devices_with_their_ports_and_link_layers(tmp_path: Path) -> None:
    pf = parse_lines(tmp_path, [
        P + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.9.0.11<0>",
        P + "Using network IB"])
    net = frame(pf, "nccl_network")
    assert pf.tables["nccl_network"].schema == NCCL_NETWORK
    assert net.select("net", "index", "device", "port", "link", "oob").rows() == [
        ("IB", 0, "mlx5_0", 1, "IB", "ib0:10.9.0.11<0>"), ("IB", 1, "mlx5_1", 1, "RoCE", "ib0:10.9.0.11<0>")]
    assert net["gdr"].null_count() == 2  # no GDR line: not known
    assert pf.meta["processes"][0]["network"] == ["IB"]
    assert pf.meta["ignored_lines"] == 0 and pf.meta["unrecognised_lines"] == 0


def test_merged_ib_devices_and_socket_interfaces() -> None:
    m = NET_USING.match("NET/IB : Using [0]={[0] mlx5_0:1/IB, [1] mlx5_1:1/IB} [RO]; OOB eth0:10.0.0.2<0>")
    assert m is not None and m["net"] == "IB" and m["oob"] == "eth0:10.0.0.2<0>"
    m = NET_USING.match("NET/Socket : Using [0]eth0:10.0.0.2<0> [1]ib0:fe80::1%ib0<0>")
    assert m is not None and m["net"] == "Socket" and m["oob"] is None
    assert NET_USING.match("NET/Plugin: Using internal network plugin.") is not None  # read as the plugin, below


def test_sockets_the_plugin_settings_and_why_ib_was_not_used(tmp_path: Path) -> None:
    pf = parse_lines(tmp_path, [
        P + "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        P + "NCCL_IB_DISABLE set by environment to 1",
        P + "NCCL_SOCKET_IFNAME set by environment to eth0",
        P + "NET/IB : No device found.",
        P + "Failed to open libibverbs.so[.1]",
        P + "NET/Socket : Using [0]eth0:10.0.0.2<0> [1]eth1:10.1.0.2<0>",
        P + "Using network Socket"])
    net = frame(pf, "nccl_network")
    assert net.select("net", "index", "device", "address").rows() == [
        ("Socket", 0, "eth0", "10.0.0.2<0>"), ("Socket", 1, "eth1", "10.1.0.2<0>")]
    proc = pf.meta["processes"][0]
    assert proc["plugin"] == "internal"
    assert proc["env"] == {"NCCL_IB_DISABLE": {"value": "1", "line": 2}, "NCCL_SOCKET_IFNAME": {"value": "eth0",
                                                                                              "line": 3}}
    assert [(i["kind"], i["line"]) for i in proc["net_issues"]] == [("ib-missing", 4), ("ib-missing", 5)]
    assert proc["network"] == ["Socket"]
    pf = parse_lines(tmp_path, [P + "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v8 (v8)"], "plugin.log")
    assert pf.meta["processes"][0]["plugin"] == "NCCL RDMA Plugin v8"


@pytest.mark.parametrize(("text", "hca", "name", "state", "why"), [
    ("NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)", "0", "mlx5_0", "Disabled", "no module"),
    ("NET/IB : GPU Direct RDMA Enabled for HCA 1 'mlx5_1'", "1", "mlx5_1", "Enabled", None),
    ("GPU Direct RDMA Disabled for GPU 1b000 / HCA 0 (distance 5 > 4)", "0", None, "Disabled", "distance 5 > 4"),
    ("GPU Direct RDMA Enabled for GPU 1b000 / HCA 0 (distance 4 <= 4), read 1", "0", None, "Enabled",
     "distance 4 <= 4"),
    ("NET/IB : GPU Direct RDMA Disabled for GPU 0[0] / HCA 0 (distance 5 >= 2)", "0", None, "Disabled",
     "distance 5 >= 2"),
    ("NET/IB : GPU Direct RDMA Disabled for GPU 0[0] / HCA 0 'mlx5_0' (no module or not supported by GPU)", "0",
     "mlx5_0", "Disabled", "no module or not supported by GPU"),
])
def test_gpu_direct_rdma_lines_of_every_era(text: str, hca: str, name: str | None, state: str,
                                            why: str | None) -> None:
    m = GDR.match(text)
    assert m is not None and (m["hca"], m["name"], m["state"], m["why"]) == (hca, name, state, why)


def test_gdr_is_folded_into_the_hca_it_names(tmp_path: Path) -> None:
    pf = parse_lines(tmp_path, [
        P + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.9.0.11<0>",
        P + "NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
        P + "NET/IB : GPU Direct RDMA Enabled for HCA 1 'mlx5_1'",
        P + "GPU Direct RDMA Disabled for GPU 1b000 / HCA 1 (distance 5 > 4)",
        P + "NET/IB : GPU Direct RDMA Disabled for HCA 7 'mlx5_7' (no module)"])
    net = frame(pf, "nccl_network")
    assert net.select("index", "device", "gdr", "gdr_line", "gdr_reason").rows() == [
        (0, "mlx5_0", True, 2, None), (1, "mlx5_1", False, 4, "distance 5 > 4"), (7, "mlx5_7", False, 5, "no module")]


def test_communicators_in_the_public_schema(tmp_path: Path) -> None:
    cid = "0x5d2e9a0c4471b3f8"
    pf = parse_lines(tmp_path, [
        "NCCL version 2.21.5+cuda12.4",
        P + "Using network IB",
        P + f"ncclCommInitRank comm 0x55b07c1e9f30 rank 5 nranks 16 cudaDev 0 nvmlDev 5 busId 9c000 commId {cid} "
            "- Init START",
        P + "comm 0x55b07c1e9f30 rank 5 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0",
        P + f"ncclCommInitRank comm 0x55b07c1e9f30 rank 5 nranks 16 cudaDev 0 nvmlDev 5 busId 9c000 commId {cid} "
            "- Init COMPLETE",
        "[0] NCCL INFO comm 0x7711 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0"])
    assert pf.tables["communicators"].schema == COMMUNICATORS
    c = frame(pf, "communicators")
    assert c.select("comm_id", "rank", "nranks", "nnodes", "local_ranks", "local_rank", "host", "pid", "global_rank",
                    "cuda_dev", "nvml_dev", "bus_id", "nccl_version", "network", "init_line").rows() == [
        (cid, 5, 16, 2, 8, 5, "gpu-1", 4100, 5, 0, 5, "9c000", "2.21.5", "IB", 5),
        ("inferred-n2-0", 1, 2, 1, 2, 1, None, -2, 1, None, None, None, "2.21.5", "IB", 6)]  # the file's one network
    assert pf.meta["versions"] == {"2.21.5": {"count": 1, "line": 1}}


def test_versions_of_a_file(tmp_path: Path) -> None:
    pf = parse_lines(tmp_path, ["NCCL version 2.19.3+cuda12.3", P + "NCCL version 2.20.5+cuda12.4",
                                "gpu-2:77:77 [0] NCCL INFO NCCL version 2.20.5+cuda12.4"])
    assert pf.meta["versions"] == {"2.19.3": {"count": 1, "line": 1}, "2.20.5": {"count": 2, "line": 2}}
    assert {p["host"]: (p["version"], p["version_line"]) for p in pf.meta["processes"]} == {
        "gpu-1": ("2.20.5", 2), "gpu-2": ("2.20.5", 3)}


def test_a_ring_nccl_cut_with_dots(tmp_path: Path) -> None:
    """NCCL >= 2.19 ends a ring order longer than its 128-byte buffer with ``...``, over a number's digits: the cut
    number is not a rank, and the row says it was cut."""
    order = "".join(f" {r:2d}" for r in range(40))
    cut = ("Channel 00/02 :" + order)[:124] + "..."
    pf = parse_lines(tmp_path, [P + cut, P + "Channel 01/02 :  0  1  2 ..."])
    g = frame(pf, "nccl_graph")
    assert pf.tables["nccl_graph"].schema == NCCL_GRAPH
    first = g.row(0, named=True)
    assert first["cut"] and first["value"].split() == [str(r) for r in range(len(first["value"].split()))]
    assert cut.endswith(first["value"].split()[-1] + " 3...") or cut.endswith(first["value"].split()[-1] + " ...")
    assert g.row(1, named=True)["value"] == "0 1 2" and g.row(1, named=True)["cut"]
    assert pf.meta["unrecognised_lines"] == 0


def test_collnet_coll_lines_and_direct_shared_memory(tmp_path: Path) -> None:
    pf = parse_lines(tmp_path, [
        P + "Coll 00 : 0 [send] via COLLNET/SHARP/0/GDRDMA",
        P + "Coll 00 : 0 [receive] via COLLNET/SHARP/0/GDRDMA",
        P + "Channel 00 : 0[1b000] -> 1[3d000] via direct shared memory",
        P + "Channel 00 : 0[1b000] -> 1[3d000] via SHM/direct/direct",
        P + "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0(5)/GDRDMA"])
    t = pl.from_arrow(pf.topology)
    assert isinstance(t, pl.DataFrame)
    assert t.select("rank", "peer", "direction", "transport").rows() == [
        (0, None, "send", "COLLNET"), (0, None, "receive", "COLLNET"), (0, 1, None, "SHM"), (0, 1, None, "SHM"),
        (0, 1, "send", "NET/IB")]


WATCHDOG = [
    # PyTorch <= 2.1
    ("[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, "
     "OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.",
     (3, "timeout", 42, "ALLREDUCE", None, None, None, 600123, None)),
    # 2.2: a launcher's rank prefix, the PG id
    ("[rank3]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 3] Timeout at NCCL work: 42, last enqueued NCCL work: 42, "
     "last completed NCCL work: 41.", (3, "exception", 42, None, "0", 42, 41, None, None)),
    # 2.3-2.4: a glog header, the PG's description
    ("[rank3]:[E1104 16:41:07.118204311 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 3] Exception (either an "
     "error or timeout) detected by watchdog at work: 42, last enqueued NCCL work: 43, last completed NCCL work: 41.",
     (3, "exception", 42, None, "0 (default_pg)", 43, 41, None, "1104 16:41:07.118204311")),
    # 2.5+: PG ID and GUID; a dump signal from another rank
    ("[rank4]:[E703 15:37:17.178360488 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 4] Received a "
     "dump signal due to a collective timeout from  rank 7 and we will try our best to dump the debug info. Last "
     "enqueued NCCL work: 56118, last completed NCCL work: 56118.This is most likely caused by incorrect usages",
     (4, "dump", None, None, "0 (default_pg)", 56118, 56118, None, "703 15:37:17.178360488")),
    ("[PG 2 Rank 5] NCCL Work update periodically: last enqueued NCCL work: 10, last completed NCCL work: 9.",
     (5, "progress", None, None, "2", 10, 9, None, None)),
]


@pytest.mark.parametrize(("line", "want"), WATCHDOG)
def test_watchdog_lines_of_every_pytorch_era(tmp_path: Path, line: str, want: tuple) -> None:
    path = tmp_path / "pg.log"
    path.write_text(line + "\n")
    fmt = detect(str(path))
    assert fmt is not None and fmt.name == "nccl-log"  # a hang's excerpt of nothing but these is a log too
    pf = nccl.parse(str(path))
    w = frame(pf, "pytorch_watchdog")
    got = w.select("rank", "kind", "seq_num", "op_type", "pg", "last_enqueued", "last_completed", "ran_ms",
                   "log_time").row(0)
    assert got == want


def test_a_file_with_no_nccl_line_is_still_refused(tmp_path: Path) -> None:
    from tracekit.model.diagnostics import TraceError

    path = tmp_path / "train.log"
    path.write_text("epoch 1 loss 0.3\nRank 3 finished\nProcessGroupNCCL is mentioned here in passing\n")
    assert detect(str(path)) is None
    with pytest.raises(TraceError, match="no NCCL log lines"):
        nccl.parse(str(path))


# ----------------------------------------------------------------------------------------------------------------
# what a real PyTorch run prints (gloo on this machine: NCCL needs a GPU, so no NCCL line can be recorded here)

_GLOO_JOB = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_real_torchrun_log_and_its_prefixes(tmp_path: Path) -> None:
    """A real 2-rank gloo job under torchrun (``--tee 3``, C++ logging at INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL): its
    output holds no NCCL line and is not taken for an NCCL log; with a watchdog message (PyTorch's format, as
    ProcessGroupNCCL prints it) behind the prefixes this PyTorch really prints (``[default1]:[rank1]:[I1127
    16:16:26.867001447 ProcessGroupWrapper.cpp:710] [Rank 1] ...``), the rank and the glog time are read."""
    import importlib.util
    import os
    import re
    import subprocess
    import sys

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    script = tmp_path / "job.py"
    script.write_text(_GLOO_JOB)
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "--tee", "3", str(script)], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-2000:]
    out = tmp_path / "torchrun.log"
    out.write_text(run.stdout + run.stderr)
    assert detect(str(out)) is None  # PyTorch's own lines are no NCCL log
    lines = [x for x in (run.stdout + run.stderr).splitlines() if "] [Rank " in x and "ProcessGroup" in x]
    assert lines, "no rank-prefixed c10d line: PyTorch's logging changed"
    m = re.match(r"^(?P<prefix>.*\] \[Rank (?P<rank>\d+)\] )", lines[0])
    assert m is not None
    prefix = m["prefix"].replace("ProcessGroupWrapper.cpp", "ProcessGroupNCCL.cpp")
    glog = re.search(r"\[[IWE](\d{3,4} [\d:.]+) ", prefix)
    assert glog is not None
    path = tmp_path / "hang.log"
    path.write_text(prefix + "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
                    "NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600412 milliseconds before timing out.\n"
                    + prefix + "Exception (either an error or timeout) detected by watchdog at work: 7, last enqueued "
                    "NCCL work: 7, last completed NCCL work: 6.\n")
    fmt = detect(str(path))
    assert fmt is not None and fmt.name == "nccl-log"
    w = frame(nccl.parse(str(path)), "pytorch_watchdog")
    assert w.select("rank", "kind", "seq_num", "last_enqueued", "last_completed").rows() == [
        (int(m["rank"]), "timeout", 7, None, None), (int(m["rank"]), "exception", 7, 7, 6)]
    assert w["log_time"].to_list() == [glog[1]] * 2
