"""The critical path of a job analysed rank by rank, followed where the ranks' graphs are held
(:mod:`tracekit.scale.rank_paths`): each rank's graph with the collective edges into it binds as the job's combined
graph does, and the path hops from rank to rank at collectives — every segment must equal the combined graph's path,
in this process and on worker processes, without the client ever combining the graph."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import tracekit
from benchmarks import jobgen
from tests.test_scale_graphs import JOBS, MESH
from tracekit.analysis.graph import critical_path
from tracekit.analysis.graph.crossings import rank_graph
from tracekit.model.diagnostics import TraceError
from tracekit.scale import graphs
from tracekit.scale.rank_parts import Hosts
from tracekit.scale.rank_paths import RankPaths

SMALL = jobgen.JobSpec(ranks=8, gpus_per_host=2, steps=4, layers=8, param_bytes=8 << 20, bucket_bytes=16 << 20,
                       clock_skew_ns=500_000, stragglers=((1, 1.3),))
SPECS = {"ddp": SMALL, "fsdp": replace(SMALL, parallel="fsdp", stragglers=((2, 1.2),)), "mesh": MESH,
         "main-thread": replace(SMALL, autograd_thread=False)}


def generated(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tracekit.Job]:
    """Job ``name`` of :data:`SPECS` generated and loaded rank by rank with its graphs (a module fixture's body)."""
    root = tmp_path_factory.mktemp(name)
    jobgen.write_job(root / "job", SPECS[name])
    with tracekit.load(root / "job", link_bw="10gbit", dataset=root / "ds", graphs=True) as j:
        yield j


@pytest.fixture(scope="module", params=list(SPECS))
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tracekit.Job]:
    yield from generated(request.param, tmp_path_factory)


def test_each_rank_binds_as_the_job_graph(job: tracekit.Job) -> None:
    an = job.analysis
    with Hosts(0) as hosts:
        held = RankPaths.open(hosts, graphs.sources(an.dataset, an), an)
    g = an.graph
    for s in held.sources:
        d = Path(s.root) / s.part
        rg = rank_graph(pq.read_table(str(d / "graph.act.parquet")), pq.read_table(str(d / "graph.edges.parquet")),
                        s.rank, s.offset, held.cross)
        k, b = rg.activities, int(held.base[held.pos[s.rank]])
        lo, hi = 2 * b, 2 * (b + k)
        local = rg.graph
        assert np.array_equal(local.node_time[:2 * k], g.node_time[lo:hi])
        into = (g.dst >= lo) & (g.dst < hi)  # the same edges into the rank, in the same order
        assert np.array_equal(g.dst[into] - lo, local.dst) and np.array_equal(g.lag[into], local.lag)
        bl, bg = local.binding[:2 * k], g.binding[lo:hi]
        assert np.array_equal(bl >= 0, bg >= 0)
        bl, bg = bl[bl >= 0], bg[bg >= 0]
        assert np.array_equal(local.slack[bl], g.slack[bg]) and np.array_equal(local.etype[bl], g.etype[bg])
        # a binding edge from another rank comes from a ghost at that member's start
        ghost = local.src[bl] >= 2 * k
        assert np.array_equal(local.src[bl][~ghost] + lo, g.src[bg][~ghost])
        assert np.array_equal(local.node_time[local.src[bl][ghost]], g.node_time[g.src[bg][ghost]])
        assert not ((g.src[bg][ghost] >= lo) & (g.src[bg][ghost] < hi)).any()


def test_a_ranks_members_and_edges_are_looked_up_not_scanned(job: tracekit.Job) -> None:
    """Binding a rank looks its members and the collective edges into it up (:meth:`Crossings.of_rank`; a scan of the
    job's per rank made binding quadratic in ranks): the same, in the same order, as the scans; each member's hub
    too."""
    an = job.analysis
    with Hosts(0) as hosts:
        cross = RankPaths.open(hosts, graphs.sources(an.dataset, an), an).cross
    m_rank = cross.members.get_column("rank").to_numpy()
    for r in [*np.unique(m_rank).tolist(), int(m_rank.max()) + 1]:
        mine, into = cross.of_rank(r)
        assert np.array_equal(mine, np.flatnonzero(m_rank == r))
        assert np.array_equal(into, np.flatnonzero(m_rank[cross.dst] == r))
    for h in range(cross.hub_ptr.size - 1):
        assert (cross.member_hub[cross.hub_member[cross.hub_ptr[h]:cross.hub_ptr[h + 1]]] == h).all()
    assert (cross.member_hub >= 0).sum() == cross.hub_member.size


@pytest.mark.parametrize("jobs", [0, 2])
def test_paths_equal_the_combined_graphs(job: tracekit.Job, jobs: int) -> None:
    an = job.analysis
    with Hosts(jobs) as hosts:
        held = RankPaths.open(hosts, graphs.sources(an.dataset, an), an)
        got = held.paths(an.iterations, an.ranks)
        one = held.paths(an.iterations, an.ranks, iteration=int(got.get_column("iteration")[-1]))
        if jobs:
            assert len(hosts.memory()) == jobs and min(hosts.memory()) > 0
    ref = critical_path.paths(an.graph, an.iterations, an.ranks)
    assert ref.height > 0 and got.equals(ref)
    assert one.equals(ref.filter(ref.get_column("iteration") == one.get_column("iteration")[0]))
    assert ref.get_column("rank").n_unique() > 1  # the paths cross ranks, and wait on stragglers
    assert (ref.get_column("label") == "waiting").any()


def test_the_client_never_combines_the_graph(tmp_path: Path) -> None:
    jobgen.write_job(tmp_path / "job", SMALL)
    with tracekit.load(tmp_path / "job", link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as j:
        segs = j.critical_path()
        assert "graph" not in j.analysis.__dict__ and segs.height
        summ = j.critical_path_summary
        ref = critical_path.paths(j.analysis.graph, j.analysis.iterations, j.analysis.ranks)  # combined only now
        assert segs.equals(ref)
        assert summ.equals(critical_path.summary(ref, j.analysis.iterations, j.analysis.ranks))


def test_a_host_that_dies_is_one_clear_error(tmp_path: Path) -> None:
    jobgen.write_job(tmp_path / "job", SMALL)
    with tracekit.load(tmp_path / "job", link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as j:
        an = j.analysis
        with Hosts(1) as hosts:
            RankPaths.open(hosts, graphs.sources(an.dataset, an), an)
            hosts.procs[0].kill()
            hosts.procs[0].join()
            with pytest.raises(TraceError, match="worker process holding ranks' graphs died"):
                hosts.walk(0, 1, 0)


@pytest.mark.parametrize("path", JOBS, ids=[p.name for p in JOBS])
def test_recorded_jobs(path: Path, tmp_path: Path) -> None:
    rate = json.loads((path / "run.json").read_text())["link"]["rate"] or "1gbit"
    with tracekit.load(path, link_bw=rate, dataset=tmp_path / "ds") as j:  # the graphs built on first use
        segs = j.critical_path()
        assert "graph" not in j.analysis.__dict__
        assert not graphs.missing(j.analysis.dataset)
        assert segs.equals(critical_path.paths(j.analysis.graph, j.analysis.iterations, j.analysis.ranks))


def test_a_program_that_never_closes_its_hosts_exits_quietly() -> None:
    """Worker processes holding ranks' graphs outlive a job nobody closed until the program ends; then they go without
    a traceback on the user's terminal."""
    import subprocess
    import sys

    code = ("import time\n"
            "from tracekit.scale.rank_parts import Hosts\n"
            "def forget():\n"  # the hosts dropped without being closed, as a job nobody closed is
            "    assert len(Hosts(1).__enter__().pids()) == 1\n"
            "if __name__ == '__main__':\n"
            "    forget()\n"
            "    time.sleep(1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


def test_worker_processes_start_from_a_program_read_on_stdin() -> None:
    """``python -`` (a script fed on stdin, as in a shell's here-document) starts the worker processes too: spawn would
    have each run ``<stdin>`` again and die (``a worker process holding ranks' graphs died``)."""
    import subprocess
    import sys

    code = ("from tracekit.scale.rank_parts import Hosts\n"
            "with Hosts(1) as hosts:\n"
            "    assert len(hosts.pids()) == 1\n"
            "import __main__\n"
            "assert __main__.__file__ == '<stdin>'\n"  # (given back)
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_two_threads_asking_the_hosts_each_get_their_own_answers() -> None:
    """The TUI follows the critical path on one thread while the verdict's model asks the same worker processes on
    another: each question's answers are its own (they once came back crossed: a process id for a frame)."""
    from concurrent.futures import ThreadPoolExecutor

    with Hosts(2) as hosts:
        pids = [p.pid for p in hosts.procs]

        def ask(name: str) -> list[list[int]]:
            return [hosts.ask_all(name) for _ in range(400)]

        with ThreadPoolExecutor(2) as pool:
            got_pids, got_memory = pool.submit(ask, "pid"), pool.submit(ask, "memory")
            assert all(p == pids for p in got_pids.result())
            assert all(len(m) == 2 and min(m) > 1 << 20 for m in got_memory.result())


def test_the_critical_path_beside_the_verdict_on_worker_processes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``tracekit inspect`` computes them: the hosts started while the job is analysed
    (:meth:`RankGraphs.open_soon`), then the critical path and the verdict each on a thread of its own, asking the same
    worker processes — the same path as the combined graph's and the same verdict as in memory; hosts started and
    never used are let go."""
    monkeypatch.setattr(graphs, "HOSTS_MIN_BYTES", 0)  # worker processes even for this small job
    jobgen.write_job(tmp_path / "job", SMALL)
    with tracekit.load(tmp_path / "job", link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as j:
        an = j.analysis
        procs = list(an.rank_graphs._opening.result()[1].procs)  # started by load, before anything asked
        assert len(procs) >= 1 and all(p.is_alive() for p in procs)
        paths, verdict = an.start("critical_path"), an.start("verdict")
        paths.result()
        verdict.result()
        assert {"critical_path", "verdict"} <= an.__dict__.keys()  # (a failure there would be computed again here)
        segs, answer = an.critical_path, an.verdict
        assert segs.equals(critical_path.paths(an.graph, an.iterations, an.ranks))
    assert not any(p.is_alive() for p in procs)
    with tracekit.load(tmp_path / "job", link_bw="10gbit") as mem:
        assert mem.analysis.verdict.as_dict() == answer.as_dict()
    with tracekit.load(tmp_path / "job", link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as unused:
        procs = list(unused.analysis.rank_graphs._opening.result()[1].procs)
    assert procs and not any(p.is_alive() for p in procs)


def test_tables_read_ahead_are_taken_unless_their_file_changed(tmp_path: Path) -> None:
    """A host reads its ranks' stored tables ahead (:meth:`Held.prefetch`) up to its budget; binding takes them
    (once), a file rewritten since is read again, one that cannot be read is left for its turn."""
    import os

    import pyarrow as pa

    from tracekit.scale.rank_parts import Held

    paths = [tmp_path / f"t{i}.parquet" for i in range(3)]
    for i, p in enumerate(paths):
        pq.write_table(pa.table({"x": np.arange(1000) + i}), p)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    held = Held()
    one = pq.read_table(paths[0]).nbytes
    got = held.prefetch([str(tmp_path / "bad.parquet"), *map(str, paths)], budget=2 * one)
    assert got == 2 * one and set(held.prefetched) == {str(paths[0]), str(paths[1])}  # the budget, then stop
    kept = held.prefetched[str(paths[0])][2]
    def address(t: pa.Table) -> int:
        return t.column("x").chunks[0].buffers()[1].address

    assert address(held.table(paths[0], ["x"], keep=True)) == address(kept)  # not read again
    assert held.table(paths[0]) is kept and str(paths[0]) not in held.prefetched  # taken once
    pq.write_table(pa.table({"x": np.arange(5)}), paths[1])  # rewritten after it was read ahead
    st = os.stat(paths[1])
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert held.table(paths[1]).num_rows == 5
    assert held.table(paths[2]).column("x")[0].as_py() == 2  # never read ahead: read now
