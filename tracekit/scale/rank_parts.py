"""Every rank's dependency graph held where it is worked on, not on the client: hosts (this process, or worker
processes) each hold some ranks' graphs on the job clock with the collective edges into them
(:func:`tracekit.analysis.graph.crossings.rank_graph`) and answer questions about them; the client holds only what
crosses ranks (:class:`tracekit.analysis.graph.crossings.Crossings`: a row per member of a collective) and the
answers. :mod:`tracekit.scale.rank_paths` follows the critical path through them, hop by hop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph import critical_path
from tracekit.analysis.graph.crossings import (
    MEMBER_COLUMNS,
    MEMBER_SCHEMA,
    Crossings,
    RankGraph,
    member_rows,
    rank_graph,
)
from tracekit.analysis.graph.dag import EDGE_TYPES
from tracekit.model.diagnostics import TraceError
from tracekit.scale.engine import main_not_run_again, run_with_threads, threads_per_worker
from tracekit.scale.rank_replays import HeldReplays

_COLL = EDGE_TYPES.index("collective")
#: the stored tables of a rank a host reads ahead (:meth:`Hosts.prefetch`): what binding it and the what-if read
PREFETCHED = ("graph.act", "graph.edges", "graph.leaves")
_COLL_CODE = critical_path.EDGE_CODE["collective"]


@dataclass(frozen=True)
class Source:
    """Where one rank's stored compact graph is (``root/part/graph.*.parquet``), its rank and clock offset."""

    root: str
    part: str
    rank: int
    offset: int


@dataclass(frozen=True)
class Piece:
    """A critical path's segments on one rank (:func:`tracekit.analysis.graph.critical_path.walk_part`, latest first;
    ``act``: the rank's activities), for each segment on a collective edge the members it joins (``dst_member``,
    ``src_member``; -1 elsewhere), and the member of another rank the path goes on at (``hop``; -1: it ends here)."""

    start: np.ndarray
    end: np.ndarray
    label: np.ndarray
    act: np.ndarray
    edge: np.ndarray
    dst_member: np.ndarray
    src_member: np.ndarray
    hop: int


class Held(HeldReplays):
    """Some ranks' graphs and what is asked of them (a host's state: in this process, or a worker's): the critical
    path's questions here, the what-if's replays in :class:`tracekit.scale.rank_replays.HeldReplays`."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankGraph] = {}
        self.stored: dict[int, Source] = {}  # ranks whose members were read, not bound yet
        self.sources: dict[int, Source] = {}
        self.replayed: dict[int, RankGraph] = {}
        self.cross: Crossings | None = None  # the job's collective edges, as the ranks were bound with them
        #: stored tables read ahead (:meth:`prefetch`), by path: the file's size and modification time, and the table
        self.prefetched: dict[str, tuple[int, int, pa.Table]] = {}

    def prefetch(self, paths: list[str], budget: int) -> int:
        """Read the stored tables at ``paths`` ahead of :meth:`read`, :meth:`bind` and the replays' samples — while
        the client is still analysing the job — until they hold ``budget`` bytes; a file that cannot be read is left
        for its turn (which says why). Returns the bytes held."""
        import pyarrow.parquet as pq

        held = sum(t.nbytes for _, _, t in self.prefetched.values())
        for path in paths:
            if held >= budget:
                break
            try:
                st = os.stat(path)
                table = pq.read_table(path)
            except Exception:  # (read again in its turn, and reported there)
                continue
            self.prefetched[path] = (st.st_mtime_ns, st.st_size, table)
            held += table.nbytes
        return held

    def table(self, path: Path, columns: list[str] | None = None, keep: bool = False) -> pa.Table:
        """The stored table at ``path`` (its ``columns``): read ahead (:meth:`prefetch`; let go unless ``keep``),
        unless the file changed since, or read now."""
        import pyarrow.parquet as pq

        got = self.prefetched.get(str(path)) if keep else self.prefetched.pop(str(path), None)
        if got is not None:
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if st is not None and (st.st_mtime_ns, st.st_size) == got[:2]:
                return got[2].select(columns) if columns is not None else got[2]
        return pq.read_table(str(path), columns=columns)

    def read(self, sources: list[Source]) -> dict[int, pl.DataFrame]:
        """The ranks' members of collectives (:func:`tracekit.analysis.graph.crossings.member_rows`, from the columns
        they need of the ranks' stored activities), what the client finds the collective edges from."""
        out = {}
        for s in sources:
            self.stored[s.rank] = s
            act = self.table(Path(s.root) / s.part / "graph.act.parquet", list(MEMBER_COLUMNS), keep=True)
            out[s.rank] = member_rows(act, s.rank, s.offset)
        return out

    def bind(self, cross: Crossings) -> dict[int, int]:
        """Read every rank asked for (:meth:`read`) and put it on the job clock with the collective edges into it
        (:func:`rank_graph`), one at a time (what a host holds is the ranks' graphs, not their stored tables too,
        beyond those read ahead: :meth:`prefetch`); returns each rank's activity count."""
        out = {}
        self.cross = cross
        for r in list(self.stored):
            s = self.sources[r] = self.stored.pop(r)
            d = Path(s.root) / s.part
            ahead = str(d / "graph.act.parquet") in self.prefetched
            self.ranks[r] = rank_graph(self.table(d / "graph.act.parquet"), self.table(d / "graph.edges.parquet"),
                                       s.rank, s.offset, cross)
            out[r] = self.ranks[r].activities
            if ahead:  # the tables read ahead and taken go back, not kept by Arrow's pool beside the graphs
                pa.default_memory_pool().release_unused()
        return out

    def _graphs(self, replayed: bool) -> dict[int, RankGraph]:
        """The ranks' graphs as measured, or as the last replay bound scheduled them
        (:meth:`tracekit.scale.rank_replays.HeldReplays.replays_bind`)."""
        return self.replayed if replayed else self.ranks

    def sinks(self, iteration: np.ndarray, s0: np.ndarray, s1: np.ndarray, replayed: bool = False
              ) -> dict[int, tuple[np.ndarray, ...]]:
        """Per rank held: for each iteration (``iteration``, its span ``(s0, s1]``) with an activity ending inside, the
        latest such end and its activity (the first on a tie): ``(index into iteration, end, activity)``."""
        out = {}
        order = np.argsort(iteration, kind="stable")
        its = iteration[order]
        for r, rg in self._graphs(replayed).items():
            g = rg.graph
            a_end = g.node_time[1:2 * rg.activities:2]
            a_it = g.act.get_column("iteration").fill_null(-(1 << 62)).to_numpy()
            pos = np.minimum(np.searchsorted(its, a_it), its.size - 1)
            known = its[pos] == a_it
            k = order[pos]
            inside = known & (a_end <= s1[k]) & (a_end > s0[k])
            a = np.flatnonzero(inside)
            if a.size == 0:
                out[r] = (np.zeros(0, np.int64),) * 3
                continue
            by = np.lexsort((a, -a_end[a], k[a]))
            a = a[by]
            first = np.concatenate(([True], k[a][1:] != k[a][:-1]))
            out[r] = (k[a][first], a_end[a][first], a[first])
        return out

    def walk(self, rank: int, node: int, s0: int, replayed: bool = False) -> Piece:
        """The critical path back from ``node`` of ``rank`` to ``s0``, up to the first member of another rank."""
        rg = self._graphs(replayed)[rank]
        g = rg.graph
        ghosts = 2 * rg.activities
        seg, hop = critical_path.walk_part(g, node, s0, ghosts)
        dst_m = np.full(seg.act.size, -1, np.int64)
        src_m = np.full(seg.act.size, -1, np.int64)
        on = np.flatnonzero(seg.edge == _COLL_CODE)
        if on.size:
            d = seg.act[on]
            e = g.binding[2 * d + 1]
            ok = (e >= 0) & (g.etype[np.maximum(e, 0)] == _COLL)
            p = g.src[e[ok]]
            far = p >= ghosts
            src_m[on[ok]] = np.where(far, rg.ghost[np.where(far, p - ghosts, 0)],
                                     rg.member_of[np.where(far, 0, p) // 2])
            dst_m[on[ok]] = rg.member_of[d[ok]]
        return Piece(*seg, dst_m, src_m, int(rg.ghost[hop - ghosts]) if hop >= 0 else -1)

    def describe(self, rank: int, acts: np.ndarray) -> pl.DataFrame:
        """``rank, lane, name, event_row`` of activities of ``rank`` (a critical path's frame)."""
        return self.ranks[rank].graph.act.select("rank", "lane", pl.col("name").cast(pl.String), "event_row")[acts]

    def pid(self) -> int:
        """The process this host is in."""
        return os.getpid()

    def memory(self) -> int:
        """This host's peak resident memory (bytes)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _serve(conn: Any) -> None:
    """A worker process's loop: calls on its :class:`Held` until told to stop (None), or until the client is gone (a
    program that exits without closing its job: the worker goes quietly, not with a traceback on the user's
    terminal)."""
    held = Held()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        name, args = msg
        try:
            conn.send((True, getattr(held, name)(*args)))
        except BaseException as exc:  # the client raises it (one line: what failed and why)
            err = exc if isinstance(exc, TraceError) else TraceError(None, f"{type(exc).__name__}: {exc}")
            try:
                conn.send((False, err))
            except OSError:
                break
    conn.close()


class Hosts:
    """Ranks' graphs on ``jobs`` worker processes (0: in this process), each rank on one of them: calls go to the
    host of the rank asked about, or to all."""

    def __init__(self, jobs: int = 0) -> None:
        self.jobs = jobs
        self.local = Held() if jobs == 0 else None
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.home: dict[int, int] = {}
        self.asking = threading.Lock()  # one question at a time on the pipes: its answers are the next read

    def __enter__(self) -> Hosts:
        ctx = get_context("spawn")
        with main_not_run_again():
            for _ in range(self.jobs):
                a, b = ctx.Pipe()
                # the hosts and this process share the cores: each host's polars pool its share of them
                p = ctx.Process(target=run_with_threads, daemon=True, name="tracekit-rank-host",
                                args=(threads_per_worker(self.jobs + 1), f"{__name__}:_serve", b))
                p.start()
                b.close()
                self.procs.append(p)
                self.conns.append(a)
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self.conns:
            try:
                c.send(None)
                c.close()
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        self.procs, self.conns = [], []

    def _ask(self, hosts: Iterable[int], name: str, args: Callable[[int], tuple]) -> list[Any]:
        """``name(*args(h))`` on each host ``h`` (all sent before any answer is read: the hosts work at once)."""
        hosts = list(hosts)
        if self.local is not None:
            return [getattr(self.local, name)(*args(h)) for h in hosts]
        died = TraceError(None, "a worker process holding ranks' graphs died (killed, or out of memory?)")
        with self.asking:
            try:
                for h in hosts:
                    self.conns[h].send((name, args(h)))
            except OSError:
                raise died from None
            got = []
            for h in hosts:
                try:
                    got.append(self.conns[h].recv())
                except (EOFError, OSError):
                    raise died from None
        for ok, value in got:
            if not ok:
                raise value
        return [value for _, value in got]

    @property
    def count(self) -> int:
        return max(self.jobs, 1)

    def prefetch(self, parts: list[tuple[str, str]], budget: int) -> None:
        """Have each host read ahead (:meth:`Held.prefetch`, up to ``budget`` bytes) the stored tables of the ranks
        :meth:`read` will give it: ``parts`` (``(root, part)``) in the order its sources will come."""
        files: dict[int, list[str]] = {h: [] for h in range(self.count)}
        for i, (root, part) in enumerate(parts):
            files[i % self.count] += [str(Path(root) / part / f"{name}.parquet") for name in PREFETCHED]
        self._ask(range(self.count), "prefetch", lambda h: (files[h], budget))

    def read(self, sources: list[Source]) -> pl.DataFrame:
        """Spread the ranks over the hosts (in turn: as :meth:`prefetch`) and read them there; every rank's members of
        collectives, in the order of ``sources`` (the job graph's)."""
        mine: dict[int, list[Source]] = {h: [] for h in range(self.count)}
        for i, s in enumerate(sources):
            mine[i % self.count].append(s)
            self.home[s.rank] = i % self.count
        got: dict[int, pl.DataFrame] = {}
        for part in self._ask(range(self.count), "read", lambda h: (mine[h],)):
            got.update(part)
        rows = [got[s.rank] for s in sources]
        return pl.concat(rows) if rows else pl.DataFrame(schema=MEMBER_SCHEMA)

    def bind(self, cross: Crossings) -> dict[int, int]:
        """Bind every rank read (:meth:`Held.bind`); each rank's activity count."""
        out: dict[int, int] = {}
        for got in self._ask(range(self.count), "bind", lambda h: (cross,)):
            out.update(got)
        return out

    def sinks(self, iteration: np.ndarray, s0: np.ndarray, s1: np.ndarray, replayed: bool = False
              ) -> dict[int, tuple[np.ndarray, ...]]:
        out: dict[int, tuple[np.ndarray, ...]] = {}
        for got in self._ask(range(self.count), "sinks", lambda h: (iteration, s0, s1, replayed)):
            out.update(got)
        return out

    def walk(self, rank: int, node: int, s0: int, replayed: bool = False) -> Piece:
        return self._ask([self.home.get(rank, 0)], "walk", lambda h: (rank, node, s0, replayed))[0]

    def describe(self, rank: int, acts: np.ndarray) -> pl.DataFrame:
        return self._ask([self.home.get(rank, 0)], "describe", lambda h: (rank, acts))[0]

    def ask_all(self, name: str, *args: object) -> list[Any]:
        """``name(*args)`` on every host, each host's answer in turn."""
        return self._ask(range(self.count), name, lambda h: args)

    def ask_each(self, name: str, args: Callable[[int], tuple]) -> list[Any]:
        """``name(*args(h))`` on every host ``h``, each host's answer in turn."""
        return self._ask(range(self.count), name, args)

    def advance(self, hubs: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Release hubs to every host's running replays (:meth:`tracekit.scale.rank_replays.HeldReplays.advance`): the
        arrivals all of them settled meanwhile (a host of :func:`tracekit.scale.exchange.settle`)."""
        got = self.ask_all("advance", hubs, times)
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])

    def pids(self) -> list[int]:
        """The process of each host."""
        return self._ask(range(self.count), "pid", lambda h: ())

    def memory(self) -> list[int]:
        """Each worker process's peak resident memory (bytes; empty in this process)."""
        return self._ask(range(self.count), "memory", lambda h: ()) if self.jobs else []


class DaskHosts(Hosts):
    """Ranks' graphs on the workers of a Dask cluster (``client``), one :class:`Held` actor per worker: the graphs stay
    where they are read (workers must see the dataset at the same path, as for its build)."""

    def __init__(self, client: Any) -> None:
        super().__init__(0)
        self.local = None
        self.client = client
        self.actors: list[Any] = []
        self.futures: list[Any] = []

    def __enter__(self) -> DaskHosts:
        workers = sorted(self.client.scheduler_info().get("workers", {}))
        if not workers:
            raise TraceError(None, "the Dask cluster has no workers to hold the ranks' graphs")
        self.futures = [self.client.submit(Held, workers=[w], allow_other_workers=False, actor=True, pure=False)
                        for w in workers]
        self.actors = [f.result() for f in self.futures]
        self.jobs = len(self.actors)
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.futures:
            f.release()
        self.actors, self.futures = [], []

    def _ask(self, hosts: Iterable[int], name: str, args: Callable[[int], tuple]) -> list[Any]:
        pending = [getattr(self.actors[h], name)(*args(h)) for h in hosts]
        try:
            return [p.result() for p in pending]
        except (OSError, TimeoutError) as exc:
            raise TraceError(None, f"a Dask worker holding ranks' graphs was lost ({exc})") from None


def hosts_for(engine: Any, jobs: int) -> Hosts:
    """Where the ranks' graphs go: the Dask cluster of a :class:`tracekit.scale.engine.DaskEngine` (entered), else
    ``jobs`` local worker processes (0: this process)."""
    client = getattr(engine, "client", None)
    return DaskHosts(client) if client is not None else Hosts(jobs)


def default_jobs() -> int:
    """Worker processes for a job's ranks' graphs: one per core."""
    return max(1, os.cpu_count() or 1)
