"""Cross-rank matching, clock offsets, wait/transfer and stragglers on traces whose truth is known."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests import kineto_traces as kt
from tracekit.analysis import collectives
from tracekit.analysis.pipeline import Analysis, analyse
from tracekit.loading.traceset import load
from tracekit.model import schema
from tracekit.views import summary

MS = kt.MS
SHIFTS = [0, 3_700_000, -1_200_000, 0]  # rank 1's clock runs 3.7 ms ahead, rank 2's 1.2 ms behind
LATE = 800_000  # rank 2 arrives 0.8 ms late at every big all-reduce
SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "ddp-gloo"


def _run(path: Path, **kw) -> Analysis:
    return analyse(load([str(path)]), **kw)


def _df(t) -> pl.DataFrame:
    out = pl.from_arrow(t)
    assert isinstance(out, pl.DataFrame)
    return out


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    d = kt.write_gpu_job(tmp_path_factory.mktemp("exact") / "job", SHIFTS, straggler=2, late=LATE)
    return _run(d)


@pytest.fixture(scope="module")
def jittered(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    d = kt.write_gpu_job(tmp_path_factory.mktemp("jitter") / "job", SHIFTS, straggler=2, late=LATE, steps=6,
                         end_jitter=1500)
    return _run(d)


def test_offsets_recovered_within_microseconds(jittered: Analysis) -> None:
    ranks = _df(jittered.ranks).sort("rank")
    # offsets map a rank's clock to rank 0's: add -shift
    for got, shift in zip(ranks["clock_offset_ns"].to_list(), SHIFTS, strict=True):
        assert abs(got + shift) <= 2_000
    assert ranks["clock_method"].to_list()[:3] == ["reference", "estimated", "estimated"]
    # ends agree to within the jitter after alignment
    assert all(r <= 1_500 for r in ranks["clock_residual_ns"].to_list())


def test_exact_offsets_waits_and_transfers(exact: Analysis) -> None:
    ranks = _df(exact.ranks).sort("rank")
    assert ranks["clock_offset_ns"].to_list() == [0, -3_700_000, 1_200_000, 0]
    inst = _df(exact.instances)
    assert inst.height == 6 and inst["ranks"].list.len().to_list() == [4] * 6
    assert not inst["partial"].any() and inst["consistent"].all() and inst["sizes_agree"].all()
    assert set(inst["matched_by"]) == {"order"}
    big = inst.filter(pl.col("bytes") == 4 * kt.BIG)
    small = inst.filter(pl.col("bytes") == 4 * kt.SMALL)
    assert big["straggler_rank"].to_list() == [2, 2, 2]
    assert big["skew_ns"].to_list() == [LATE] * 3
    assert big["wait_ns"].to_list() == [3 * LATE] * 3  # three ranks waited 0.8 ms each
    assert big["transfer_ns"].to_list() == [3 * MS - LATE] * 3
    # the small all-reduce starts together everywhere: nobody is named straggler
    assert small["skew_ns"].to_list() == [0, 0, 0] and small["straggler_rank"].null_count() == 3
    # times are in the job clock: the big call ends at 8 ms into each step on every rank
    assert (big["last_end_ns"] - big["first_end_ns"]).to_list() == [0, 0, 0]
    mem = _df(exact.members).join(big.select("instance"), on="instance")
    for row in mem.iter_rows(named=True):
        assert row["wait_ns"] == (0 if row["rank"] == 2 else LATE)
        assert row["transfer_ns"] == 3 * MS - LATE
        assert row["straggler"] == (row["rank"] == 2)


def test_breakdown_wait_plus_transfer_is_exposed(exact: Analysis) -> None:
    b = _df(exact.breakdown)
    assert b["wait_ns"].null_count() == 0
    assert (b["wait_ns"] + b["transfer_ns"] == b["exposed_comm_ns"]).all()
    for row in b.iter_rows(named=True):
        # compute [2, 5(+late)) ms, big all-reduce to 8 ms, small [8.5, 9), compute [9, 9.5)
        if row["rank"] == 2:
            assert (row["wait_ns"], row["transfer_ns"]) == (0, 3 * MS - LATE + MS // 2)
        else:
            assert (row["wait_ns"], row["transfer_ns"]) == (LATE, 3 * MS - LATE + MS // 2)
        assert sum(row[f"{c}_ns"] for c in schema.CLASSES) == row["wall_ns"]
        # link active = union of transfer time; bus bytes = 2(n-1)/n S of both calls
        assert row["link_active_ns"] == 3 * MS - LATE + MS // 2
        assert row["bus_bytes"] == round(1.5 * 4 * (kt.BIG + kt.SMALL))
        assert row["busbw_gbps"] == pytest.approx(row["bus_bytes"] * 8 / row["link_active_ns"])
        assert row["link_idle_ns"] == row["wall_ns"] - row["link_active_ns"]


def test_straggler_summary(exact: Analysis) -> None:
    s = summary.stragglers(exact.instances)
    top = s.row(0, named=True)
    assert (top["rank"], top["last_arrivals"], top["waited_ns"], top["wait_share"]) == (2, 3, 9 * LATE, 1.0)
    assert s.height == 1


def test_clocks_not_aligned_when_asked(tmp_path: Path) -> None:
    d = kt.write_gpu_job(tmp_path / "job", SHIFTS, straggler=2, late=LATE)
    r = analyse(load([str(d)]), align_clocks=False)
    assert _df(r.ranks)["clock_offset_ns"].to_list() == [0, 0, 0, 0]
    # 3.7 ms of fake skew makes rank 1 look late... and some instances impossible
    assert any("impossible in time" in str(x) for x in r.diagnostics)


def test_same_host_ranks_share_a_clock(tmp_path: Path) -> None:
    d = kt.write_gpu_job(tmp_path / "job", [0, 3_700_000], straggler=1, late=LATE)
    ts = load([str(d)])
    ts.ranks = ts.ranks.set_column(ts.ranks.schema.get_field_index("host"), "host",
                                   pl.Series(["node1", "node1"]).to_arrow())
    m = collectives.match(ts.collectives, ts.ranks)
    assert m.clocks["clock_offset_ns"].to_list() == [0, 0]
    assert m.clocks["clock_method"].to_list() == ["reference", "same host"]


def test_gloo_two_threads_taking_turns_match_by_rank_order(tmp_path: Path) -> None:
    # rank 0 hands buckets to threads A,B,A,B; rank 1 to B,A,A,B: per-lane ordinals would pair bucket 0
    # with bucket 1; per-rank order of equal calls pairs them right (all ends are equal by construction)
    kt.write(tmp_path / "rank0.json", kt.gloo_rank_events(0, 2, ["A", "B", "A", "B"]), rank=0, backend="gloo")
    kt.write(tmp_path / "rank1.json", kt.gloo_rank_events(1, 2, ["B", "A", "A", "B"]), rank=1, backend="gloo")
    r = _run(tmp_path)
    inst = _df(r.instances)
    assert inst.height == 8
    assert inst["ranks"].list.len().to_list() == [2] * 8
    assert inst["consistent"].all()
    assert (inst["last_end_ns"] - inst["first_end_ns"]).to_list() == [0] * 8
    assert inst["straggler_rank"].to_list() == [1] * 8 and inst["skew_ns"].to_list() == [300_000] * 8
    b = _df(r.breakdown)
    assert b["wait_ns"].null_count() == 0
    assert (b["wait_ns"] + b["transfer_ns"] == b["exposed_comm_ns"]).all()


def test_partial_instances_are_flagged(tmp_path: Path) -> None:
    # rank 2's trace was cut before its last call (the small all-reduce of step 3)
    d = kt.write_gpu_job(tmp_path / "job", [0, 0, 0], skip={2: (5,)}, straggler=1, late=LATE)
    r = _run(d)
    inst = _df(r.instances)
    partial = inst.filter(pl.col("partial"))
    assert partial.height == 1
    row = partial.row(0, named=True)
    assert (row["ranks"], row["nranks"], row["bytes"], row["straggler_rank"]) == ([0, 1], 3, 4 * kt.SMALL, None)
    assert inst.filter(~pl.col("partial"))["consistent"].all()
    assert any("fewer ranks than their group" in str(x) for x in r.diagnostics)
    b = _df(r.breakdown).filter(pl.col("iteration") == 3)
    assert b.filter(pl.col("rank") < 2)["wait_ns"].null_count() == 2  # unknown where the partial call ran
    assert b.filter(pl.col("rank") == 2)["wait_ns"].null_count() == 0


def test_sizes_disagreeing_across_ranks_warn_and_do_not_merge(tmp_path: Path) -> None:
    d = kt.write_gpu_job(tmp_path / "job", [0, 0], sizes={1: {2: 3 * kt.BIG}})
    r = _run(d)
    inst = _df(r.instances)
    assert inst.height == 7  # call 2 is two one-rank instances
    bad = inst.filter(~pl.col("sizes_agree"))
    assert sorted(bad["bytes"].to_list()) == [4 * kt.BIG, 12 * kt.BIG]
    assert bad["ranks"].to_list() == [[0], [1]] or bad["ranks"].to_list() == [[1], [0]]
    warn = [str(x) for x in r.diagnostics if "disagree on the size" in str(x)]
    assert len(warn) == 1 and "rank 0" in warn[0] and "rank 1" in warn[0]


def test_sequence_numbers_beat_order(tmp_path: Path) -> None:
    # equal-size calls that start in a different order on the two ranks: Seq pairs them right
    t0 = kt.EPOCH_NS

    def rank_events(rank: int, first: int) -> list[kt.Ev]:
        evs = [kt.Ev("ProfilerStep#1", "user_annotation", t0, 10 * MS, tid=1)]
        for i, seq in enumerate((first, 1 - first)):
            start = t0 + (1 + i) * MS
            end = t0 + (5 + 2 * seq) * MS  # seq 0 ends at 5 ms, seq 1 at 7 ms everywhere
            evs.append(kt.Ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "kernel", start, end - start, device=rank,
                             stream=13 + seq, args={"Collective name": "allreduce", "In msg nelems": 1024,
                                                    "Out msg nelems": 1024, "Group size": 2, "dtype": "Float",
                                                    "Process Group Name": "0", "Seq": seq}))
        return evs

    kt.write(tmp_path / "rank0.json", rank_events(0, 0), rank=0)
    kt.write(tmp_path / "rank1.json", rank_events(1, 1), rank=1)
    inst = _df(_run(tmp_path).instances)
    assert inst["matched_by"].to_list() == ["pg+seq", "pg+seq"]
    assert sorted(inst["seq"].to_list()) == [0, 1]
    assert (inst["last_end_ns"] - inst["first_end_ns"]).to_list() == [0, 0]


def test_send_recv_pairs(tmp_path: Path) -> None:
    t0 = kt.EPOCH_NS

    def ev(rank: int, op: str, peer: str, start: int) -> kt.Ev:
        return kt.Ev("ncclDevKernel_SendRecv(x)", "kernel", start, t0 + 4 * MS - start, device=rank, stream=9,
                     args={"Collective name": op, "In msg nelems": 256, "Out msg nelems": 256, "Group size": 2,
                           "dtype": "Float", "Process Group Name": "0", peer: 1 - rank})

    kt.write(tmp_path / "rank0.json", [ev(0, "send", "Dst Rank", t0 + MS)], rank=0)
    kt.write(tmp_path / "rank1.json", [ev(1, "recv", "Src Rank", t0 + 2 * MS)], rank=1)
    inst = _df(_run(tmp_path).instances)
    row = inst.row(0, named=True)
    assert inst.height == 1 and row["matched_by"] == "p2p order" and row["op"] == "sendrecv"
    assert row["ranks"] == [0, 1] and row["straggler_rank"] == 1 and row["bus_bytes"] == 1024


def test_a_cut_trace_shifts_the_order_and_is_caught(tmp_path: Path) -> None:
    # rank 1 lost its first big all-reduce: matching by order pairs every later big call with the wrong one,
    # and the small ones right
    d = kt.write_gpu_job(tmp_path / "job", [0, 0], skip={1: (0,)}, steps=4)
    r = _run(d)
    inst = _df(r.instances)
    pairs = inst.filter(pl.col("ranks").list.len() == 2)
    big = pairs.filter(pl.col("bytes") == 4 * kt.BIG)
    assert big.height == 3 and not big["consistent"].any()
    assert big["wait_ns"].null_count() == 3 and big["straggler_rank"].null_count() == 3
    small = pairs.filter(pl.col("bytes") == 4 * kt.SMALL)
    assert small.height == 4 and small["consistent"].all()
    assert _df(r.ranks)["clock_offset_ns"].to_list() == [0, 0]
    assert any("impossible in time" in str(x) for x in r.diagnostics)


def test_traces_from_different_times_match_nothing(tmp_path: Path) -> None:
    kt.write(tmp_path / "rank0.json", kt.gpu_rank_events(0, 2), rank=0)
    kt.write(tmp_path / "rank1.json", kt.gpu_rank_events(1, 2, t0=kt.EPOCH_NS + 3600 * 10**9), rank=1)
    r = _run(tmp_path)
    msgs = [str(x) for x in r.diagnostics]
    assert any("no collective matches across ranks in time" in m for m in msgs)
    assert _df(r.breakdown)["wait_ns"].null_count() == 4


def test_single_rank_has_nothing_to_match(tmp_path: Path) -> None:
    kt.write(tmp_path / "rank0.json", kt.gpu_job(2), rank=0)
    r = _run(tmp_path)
    assert not r.matched
    assert _df(r.breakdown)["wait_ns"].null_count() == 2
    assert _df(r.ranks)["clock_offset_ns"].to_list() == [0]


def test_bundled_gloo_sample_shares_one_clock() -> None:
    r = _run(SAMPLE)
    ranks = _df(r.ranks)
    assert ranks["clock_offset_ns"].to_list() == [0, 0]
    assert ranks["clock_method"].to_list() == ["reference", "same host"]
    inst = _df(r.instances)
    # 8 buckets x 5 steps, each all-reduced by both ranks, every one possible in time
    assert inst.height == 40
    assert inst["ranks"].to_list() == [[0, 1]] * 40
    assert inst["consistent"].all() and not inst["partial"].any()
    assert sorted(set(inst["bytes"].to_list())) == [1050624, 1071144]
    assert inst["iteration"].value_counts().sort("iteration")["count"].to_list() == [8] * 5
    b = _df(r.breakdown)
    assert b["wait_ns"].null_count() == 0
    assert (b["wait_ns"] + b["transfer_ns"] == b["exposed_comm_ns"]).all()
    assert (b["bus_bytes"] == 8425512).all()  # 2 ranks: bus bytes = S, every gradient byte per step
    s = summary.stragglers(r.instances)
    assert int(s["last_arrivals"].sum()) == 40


def test_hta_sampled_pair(shared_data: Path) -> None:
    """Two of 128 ranks, event-sampled: everything is partial; what matches agrees in time, what sampling
    shifted is caught, and the clocks are left alone."""
    r = _run(shared_data / "hta" / "trace_filter")
    inst = _df(r.instances)
    assert inst["partial"].all() and (inst["nranks"] == 128).all()
    assert inst["straggler_rank"].null_count() == inst.height
    both = inst.filter(pl.col("ranks").list.len() == 2)
    good = both.filter(pl.col("consistent"))
    # the all-gathers of 2 GiB and two all-reduces match with ends within half a millisecond
    assert sorted(good.filter(pl.col("op") != "all_to_all")["bytes"].to_list()) == \
        [22866616, 78473228, 2147483648, 2147483648]
    assert ((good["last_end_ns"] - good["first_end_ns"]) < 500_000).all()
    # pairs that sampling shifted end 0.3-0.6 s apart: flagged, not split
    bad = both.filter(~pl.col("consistent"))
    assert bad.height == 4 and ((bad["last_end_ns"] - bad["first_end_ns"]) > 300_000_000).all()
    ranks = _df(r.ranks)
    assert ranks["clock_offset_ns"].to_list() == [0, 0]
    assert abs(ranks["clock_estimate_ns"][1]) < 100_000
    assert _df(r.breakdown)["wait_ns"].null_count() == 4
    msgs = [str(x) for x in r.diagnostics]
    assert any("impossible in time" in m for m in msgs)
    assert not any("disagree on the size" in m for m in msgs)


def test_a_call_of_unknown_size_takes_its_peers_size() -> None:
    """Rank 1 recorded no sizes: its calls take the size rank 0 recorded for the same instance."""
    rows = {"rank": [0, 0, 1, 1], "collective_id": [0, 1, 0, 1], "op": ["allreduce"] * 4,
            "bytes": [4096, 8192, None, None], "nranks": [2] * 4, "start_ns": [0, 100, 5, 105],
            "end_ns": [50, 150, 50, 150], "source": ["gloo"] * 4, "size_source": ["shapes", "shapes", None, None]}
    colls = schema.table(schema.COLLECTIVES, rows)
    ranks = schema.table(schema.RANKS, {"rank": [0, 1], "host": ["a", "a"]})
    m = collectives.match(colls, ranks)
    out = _df(collectives.fill_sizes(colls, m)).sort(["rank", "collective_id"])
    assert out.get_column("bytes").to_list() == [4096, 8192, 4096, 8192]
    assert out.get_column("size_source").to_list() == ["shapes", "shapes", "peer", "peer"]


def test_send_and_recv_without_peers_pair_up_in_a_group_of_two() -> None:
    """gloo names no peer; in a two-rank job the peer is the other rank. An eager send may end before its
    receive is posted; the receive waits for the send, never the other way round."""
    rows = {"rank": [0, 1], "collective_id": [0, 0], "op": ["send", "recv"], "bytes": [1024, 1024],
            "nranks": [2, 2], "start_ns": [0, 300], "end_ns": [200, 350], "source": ["gloo"] * 2}
    colls = schema.table(schema.COLLECTIVES, rows)
    ranks = schema.table(schema.RANKS, {"rank": [0, 1], "host": ["a", "a"]})
    m = collectives.match(colls, ranks)
    inst = _df(m.instances)
    assert inst.height == 1 and inst.row(0, named=True)["matched_by"] == "p2p order"
    assert inst.row(0, named=True)["consistent"]
    mem = _df(m.members).sort("rank")
    assert mem.get_column("wait_ns").to_list() == [0, 0]
    assert mem.get_column("transfer_ns").to_list() == [200, 50]


@pytest.mark.parametrize(("host1", "aligned"), [("a", True), ("b", False)])
def test_a_window_that_cut_a_pipeline_mid_step_pairs_sends_with_their_receives(host1: str, aligned: bool) -> None:
    """Rank 1's first receive belongs to a send made before the profiled window: by order alone every send
    would pair with the receive before its own (ending before the send began). On one host (one clock) the
    receives are shifted by one; ranks on two hosts keep the plain order (clocks unknown before matching)."""
    sends = [1_000 + 10_000 * k for k in range(5)]
    recvs = [(-8_000, -7_000)] + [(s - 500, s + 2_000) for s in sends]  # each ends after its send began
    rows = {"rank": [0] * 5 + [1] * 6, "collective_id": list(range(5)) + list(range(6)),
            "op": ["send"] * 5 + ["recv"] * 6, "bytes": [1024] * 11, "nranks": [2] * 11,
            "start_ns": sends + [r[0] for r in recvs], "end_ns": [s + 300 for s in sends] + [r[1] for r in recvs],
            "source": ["gloo"] * 11}
    colls = schema.table(schema.COLLECTIVES, rows)
    ranks = schema.table(schema.RANKS, {"rank": [0, 1], "host": ["a", host1]})
    m = collectives.match(colls, ranks, align=False)
    mem = _df(m.members).join(_df(colls).select(["rank", "collective_id", "start_ns", "end_ns"]),
                              on=["rank", "collective_id"])
    paired = mem.group_by("instance").agg(pl.len().alias("n"), pl.col("start_ns").filter(pl.col("rank") == 0)
                                          .first().alias("send_start"),
                                          pl.col("end_ns").filter(pl.col("rank") == 1).first().alias("recv_end"))
    paired = paired.filter(pl.col("n") == 2)
    possible = (paired.get_column("send_start") <= paired.get_column("recv_end")).sum()
    assert paired.height == 5
    assert possible == (5 if aligned else 0)


def test_calls_in_any_row_order_match_alike(exact: Analysis) -> None:
    """The matching puts each rank's calls in time order itself (a dataset's come so, and are not copied): the rows
    reversed give the same instances, members and clocks."""
    calls = exact.traces.collectives
    want = collectives.match(calls, exact.ranks)
    got = collectives.match(calls.take(list(range(calls.num_rows - 1, -1, -1))), exact.ranks)
    assert got.instances.equals(want.instances)
    assert got.members.equals(want.members)
    assert got.clocks.equals(want.clocks)
