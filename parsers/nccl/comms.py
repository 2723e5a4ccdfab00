"""Communicators across the whole log, once every line is read (:mod:`tracekit.parsers.nccl`).

The instance each COLL line is on; their ids -- logged, derived with NCCL's own split hash (2.27+),
synthetic before 2.16, inferred without Init lines; the global rank of every process; the communicator of
each line that names none (transport, ring, tree and channel-count lines); and the ranks of communicators
no Init or nNodes line states.
"""

from __future__ import annotations

import re
import struct
from collections import defaultdict
from typing import Any

import numpy as np
import polars as pl

from tracekit.model.diagnostics import Diagnostic

from .grammar import LAUNCHER_RANK
from .lines import _Comm, _Parser

# ---------------------------------------------------------------------------------------------------
# communicator ids NCCL never prints (2.27+ splits) -- the same hash NCCL computes (src/include/utils.h)

_M64 = (1 << 64) - 1


def _eat_hash(acc: list[int], data: bytes) -> None:
    size = len(data)
    acc[0] ^= size
    pos = 0
    while size:
        acc[0] = (acc[0] + acc[1]) & _M64
        acc[1] ^= acc[0]
        acc[0] ^= acc[0] >> 31
        acc[0] = (acc[0] * 0x9DE62BBC8CEF3CE3) & _M64
        acc[1] ^= acc[1] >> 32
        acc[1] = (acc[1] * 0x485CD6311B599E79) & _M64
        chunk = data[pos:pos + 8]
        pos += len(chunk)
        size -= len(chunk)
        acc[0] = (acc[0] + int.from_bytes(chunk, "little")) & _M64


def _digest_hash(acc: list[int]) -> int:
    h = acc[0]
    h ^= h >> 31
    h = (h * 0xBAC3BD562846DE6B) & _M64
    h = (h + acc[1]) & _M64
    h ^= h >> 32
    h = (h * 0x995A187A14E7B445) & _M64
    return h


def split_comm_id(parent_comm_id: str, split_count: int, color: int) -> str:
    """The commId NCCL >= 2.27 gives a ``ncclCommSplit`` child: ``digestHash`` of the parent's commHash
    (uint64), ``splitCount`` and ``color`` (int32 each), as in NCCL's ``src/init.cc``."""
    acc = [1, 1]
    _eat_hash(acc, struct.pack("<Q", int(parent_comm_id, 16) & _M64))
    _eat_hash(acc, struct.pack("<i", split_count))
    _eat_hash(acc, struct.pack("<i", color))
    return f"0x{_digest_hash(acc):x}"


# ---------------------------------------------------------------------------------------------------
# communicator instances, ids and ranks


def _resolve_comm_ids(st: _Parser) -> list[_Comm]:
    """Give every communicator instance an id: the logged commId; for 2.27+ splits the derived one;
    before 2.16 ``synthetic-n{nranks}-{k}`` by creation order in the process."""
    comms = st.comms
    by_ptr: dict[tuple[str | None, int | None, str], list[_Comm]] = defaultdict(list)
    for c in comms:
        by_ptr[(c.host, c.pid, c.comm)].append(c)

    def parent_of(c: _Comm) -> _Comm | None:
        if not c.parent or c.parent == "(nil)":
            return None
        best = None
        for cand in by_ptr.get((c.host, c.pid, c.parent), ()):
            if cand.first_line <= c.first_line:
                best = cand
        return best

    # derived ids need the parent's id first: resolve in line order (parents are created earlier)
    synth_k: dict[tuple[str | None, int | None, int | None], int] = defaultdict(int)
    infer_k: dict[tuple[str | None, int | None, int | None], int] = defaultdict(int)
    for c in sorted(comms, key=lambda c: c.first_line):
        par = parent_of(c)
        if par is not None:
            c.parent_comm_id = par.comm_id
        if c.comm_id is not None:
            continue
        if (par is not None and par.comm_id and par.comm_id_source in ("log", "derived")
                and c.split_count is not None and c.color is not None):  # only a real commId hashes
            c.comm_id, c.comm_id_source = split_comm_id(par.comm_id, c.split_count, c.color), "derived"
        if c.end_comm_id is not None:
            if c.comm_id is not None and c.comm_id != c.end_comm_id:
                st.counts["derived_mismatch"] += 1
            c.comm_id, c.comm_id_source = c.end_comm_id, "log"
        elif c.comm_id is not None:
            pass
        elif c.init_line is not None or c.start_line is not None:
            k = synth_k[(c.host, c.pid, c.nranks)]
            synth_k[(c.host, c.pid, c.nranks)] += 1
            c.comm_id, c.comm_id_source = f"synthetic-n{c.nranks}-{k}", "synthetic"
        elif c.inferred and c.nranks is not None:
            k = infer_k[(c.host, c.pid, c.nranks)]
            infer_k[(c.host, c.pid, c.nranks)] += 1
            c.comm_id, c.comm_id_source = f"inferred-n{c.nranks}-{k}", "inferred"
    if st.counts.get("derived_mismatch"):
        st.diagnostics.append(Diagnostic(st.path, f"{st.counts['derived_mismatch']} split communicators: "
                                         "the commId derived from (parent, splitCount, color) differs "
                                         "from the one on their Destroy line (used the logged one)"))
    # synthetic ids colliding inside one file: same id and same rank in two processes
    seen: dict[tuple[str, int | None], tuple[str | None, int | None]] = {}
    collide = 0
    for c in comms:
        if c.comm_id_source != "synthetic":
            continue
        k2 = (c.comm_id, c.rank)
        other = seen.setdefault(k2, (c.host, c.pid))
        if other != (c.host, c.pid):
            collide += 1
    if collide:
        st.diagnostics.append(Diagnostic(st.path, f"this log predates NCCL 2.16 (no commId): "
                                         f"{collide} communicators got synthetic ids that collide with "
                                         "another group of the same size; their (pg, seq) are ambiguous"))
    _check_inferred(st, comms)
    return comms


def _check_inferred(st: _Parser, comms: list[_Comm]) -> None:
    """Say which communicators have no Init line (ids inferred from size and order of first use), and
    which inferred ids collide: more processes than the size claim the id, or two claim one rank."""
    inferred = [c for c in comms if c.comm_id_source == "inferred"]
    if not inferred:
        return
    procs: dict[str, set[tuple[str | None, int | None]]] = defaultdict(set)
    slots: dict[tuple[str, int], set[tuple[str | None, int | None]]] = defaultdict(set)
    for c in inferred:
        assert c.comm_id is not None
        procs[c.comm_id].add((c.host, c.pid))
        if c.rank is not None:
            slots[(c.comm_id, c.rank)].add((c.host, c.pid))
    size = {c.comm_id: c.nranks or 0 for c in inferred}
    bad = sorted({cid for cid, ps in procs.items() if len(ps) > size[cid]}
                 | {cid for (cid, _), ps in slots.items() if len(ps) > 1})
    st.diagnostics.append(Diagnostic(
        st.path, f"{len(inferred)} communicators of {len({(c.host, c.pid) for c in inferred})} processes have no "
        "Init line in this log: "
        "their ids (inferred-n<size>-<k>: the k-th of that size the process used) are inferred from the "
        "calls, nNodes and Destroy lines, and match other processes' only if the excerpts start together",
        line=min(c.first_line for c in inferred), level="info"))
    if bad:
        st.diagnostics.append(Diagnostic(
            st.path, f"{len(bad)} inferred communicator ids ({', '.join(bad[:3])}) are claimed by more processes "
            "than the communicator has ranks, or twice for one rank: several groups of equal size without Init "
            "lines; their (pg, seq) are ambiguous"))


def _process_ranks(st: _Parser) -> tuple[pl.DataFrame, dict[tuple[str | None, int | None], _Comm]]:
    """Global rank of every process: RCCL's globalrank, else its rank in its largest communicator
    (first created among equals), else the nccl-tests ``# Rank`` line."""
    world: dict[tuple[str | None, int | None], _Comm] = {}
    for c in sorted(st.comms, key=lambda c: c.first_line):
        if c.host is None or c.nranks is None or c.rank is None or c.rank < 0:
            continue
        key = (c.host, c.pid)
        w = world.get(key)
        if w is None or c.nranks > (w.nranks or 0):
            world[key] = c
    rows = []
    for (host, pid), p in st.procs.items():
        w = world.get((host, pid))
        if p.rccl_globalrank is not None:
            rank, src = p.rccl_globalrank, "rccl-globalrank"
        elif w is not None:
            rank, src = w.rank, w.rank_source or "nccl-init"
        elif p.tests_rank is not None:
            rank, src = p.tests_rank, "nccl-tests"
        else:
            rank, src = None, None
        rows.append({"host": host, "pid": pid, "global_rank": rank, "rank_source": src,
                     "world_nranks": w.nranks if w else None})
    df = pl.DataFrame(rows, schema={"host": pl.String, "pid": pl.Int64, "global_rank": pl.Int32,
                                    "rank_source": pl.String, "world_nranks": pl.Int32})
    return df, world


def _comm_frame(comms: list[_Comm]) -> pl.DataFrame:
    """Communicator instances keyed like the COLL rows (categorical host and pointer)."""
    df = pl.DataFrame([{"host": c.host, "pid": c.pid, "comm": c.comm, "first_line": c.first_line,
                        "comm_idx": c.idx} for c in comms if c.host is not None],
                      schema={"host": pl.String, "pid": pl.Int64, "comm": pl.String, "first_line": pl.Int64,
                              "comm_idx": pl.Int64})
    return df.with_columns(pl.col("host").cast(pl.Categorical), pl.col("comm").cast(pl.Categorical))


def _asof_comm(raw: pl.DataFrame, comms: list[_Comm]) -> pl.Series:
    """The communicator instance of each COLL row: the latest of its (host, pid, pointer) created at or
    before the line (pointers are reused after destroy); null when none."""
    keys = raw.select("line", "host", "pid", "comm").with_row_index("_r")
    idx = keys.join_asof(_comm_frame(comms).sort("first_line"), left_on="line", right_on="first_line",
                         by=["host", "pid", "comm"], strategy="backward", check_sortedness=False)
    if not idx["_r"].is_sorted():
        idx = idx.sort("_r")
    return idx["comm_idx"]


def _comm_index(st: _Parser, raw: pl.DataFrame) -> pl.Series:
    """``comm_idx`` of every COLL row. Calls on a pointer of which the log shows no instance before them (no
    Init line: an excerpt, ``NCCL_DEBUG_SUBSYS=COLL``) get one from what the lines say -- the pointer and
    ``[nranks=N]`` -- marked ``inferred`` (rank unknown until :func:`_infer_ranks`); when the pointer's first
    later instance is only a Destroy line of the same size, that instance is theirs (and says the rank)."""
    if raw.height == 0:
        return pl.Series("comm_idx", [], pl.Int64)
    idx = _asof_comm(raw, st.comms)
    missing = raw.select("host", "pid", "comm", "line", "nranks").filter(
        idx.is_null() & pl.col("host").is_not_null())
    if missing.height == 0:
        return idx
    firsts = missing.group_by(["host", "pid", "comm"]).agg(pl.col("line").min(), pl.col("nranks").first())
    later: dict[tuple[str | None, int | None, str], _Comm] = {}
    for c in sorted(st.comms, key=lambda c: -c.first_line):
        later[(c.host, c.pid, c.comm)] = c  # ends as the first instance of each pointer
    for host, pid, ptr, line, nranks in firsts.sort("line").iter_rows():
        c = later.get((host, pid, ptr))
        if (c is not None and c.rank_source == "nccl-destroy" and c.nranks == nranks
                and c.first_line == c.end_line):
            c.first_line = line
            continue
        c = st.new_comm(line, host, pid, ptr)
        c.nranks, c.inferred = nranks, True
    return _asof_comm(raw, st.comms)


# ---------------------------------------------------------------------------------------------------
# lines that name no communicator


def _context_index(st: _Parser, coll: pl.DataFrame) -> dict[tuple[str, int], Any]:
    """Per process: its communicator instances and the (line, comm instance) of its COLL lines (``coll``:
    ``host pid line comm_idx``), to attribute lines that name no communicator (transport, ring, tree,
    channel counts)."""
    idx: dict[tuple[str, int], Any] = {}
    by_proc: dict[tuple[str | None, int | None], list[_Comm]] = defaultdict(list)
    for c in st.comms:
        by_proc[(c.host, c.pid)].append(c)
    lines_of: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    wanted = {(r["host"], r["pid"]) for r in st.conns} | {(r["host"], r["pid"]) for r in st.graph} | {
        (r["host"], r["pid"]) for _, _, r in st.pending_ctx}
    wanted.discard((None, None))
    if coll.height and wanted:
        want = pl.DataFrame(list(wanted), schema={"host": pl.String, "pid": pl.Int64}, orient="row")
        sub = coll.select("host", "pid", "line", "comm_idx").join(
            want.with_columns(pl.col("host").cast(pl.Categorical)), on=["host", "pid"], how="semi")
        for (host, pid), g in sub.group_by(["host", "pid"], maintain_order=True):
            lines_of[(host, pid)] = (g["line"].to_numpy(), g["comm_idx"].fill_null(-1).to_numpy())
    for key in set(by_proc) | set(lines_of):
        idx[key] = (by_proc.get(key, []), lines_of.get(key))
    return idx


def _candidates(ctx: Any, line: int) -> list[_Comm]:
    """Communicators a nameless init-time line of a process may belong to, most likely first:

    1. one being initialised (Init START seen, COMPLETE not yet);
    2. one whose nNodes line came last before the line, with no COLL line of the process, nor another
       comm's nNodes or Init START line, in between (its initialisation is still running);
    3. in eras without START lines, the next comm to complete, if no COLL line of the process lies
       between (initialisation is synchronous: its lines run up to its COMPLETE);
    4. the comm of the process's last COLL line, if no Init completed since (connections made lazily
       at the first call);
    5. the last comm completed before the line."""
    if ctx is None:
        return []
    comms, colls = ctx
    out: list[_Comm] = []
    open_ = [c for c in comms if c.start_line is not None and c.start_line < line
             and (c.init_line is None or c.init_line > line) and (c.end_line is None or c.end_line > line)]
    out += sorted(open_, key=lambda c: -(c.start_line or 0))
    lines, cidx = colls if colls is not None else (np.empty(0, np.int64), np.empty(0, np.int64))
    k = int(np.searchsorted(lines, line)) - 1
    opened = [c for c in comms if c.nnodes_line is not None and c.nnodes_line < line
              and (c.init_line is None or c.init_line > line) and (c.end_line is None or c.end_line > line)]
    if opened:
        last = max(opened, key=lambda c: c.nnodes_line or 0)
        since = last.nnodes_line or 0
        if (not (k >= 0 and lines[k] > since)
                and not any(since < (c2.nnodes_line or c2.start_line or 0) < line for c2 in comms if c2 is not last)):
            out.append(last)
    nxt = sorted((c for c in comms
                  if c.start_line is None and c.init_line is not None and c.init_line > line),
                 key=lambda c: c.init_line or 0)[:1]
    for c in nxt:
        if k + 1 >= len(lines) or lines[k + 1] > (c.init_line or 0):
            out.append(c)
    if k >= 0 and cidx[k] >= 0:
        c = next((c for c in comms if c.idx == cidx[k]), None)
        last_init = max((c2.init_line for c2 in comms if c2.init_line and c2.init_line < line), default=-1)
        if c is not None and lines[k] > last_init:
            out.append(c)
    out += nxt
    done = [c for c in comms if c.init_line is not None and c.init_line < line
            and (c.end_line is None or c.end_line > line)]
    out += sorted(done, key=lambda c: -(c.init_line or 0))[:1]
    seen: set[int] = set()
    return [c for c in out if not (c.idx in seen or seen.add(c.idx))]


def _only_comm(ctx: Any, line: int, fits: Any) -> _Comm | None:
    """The communicator of a process that has a single one alive at ``line`` (none destroyed before it), if
    ``fits`` it: lines that name no communicator in a log without Init lines."""
    if ctx is None:
        return None
    alive = [c for c in ctx[0] if c.end_line is None or c.end_line >= line]
    return alive[0] if len(alive) == 1 and fits(alive[0]) else None


def _graph_rank(r: dict[str, Any]) -> int | None:
    """The rank a ring/tree line is about: the middle of ``children->rank->parent`` / ``prev->rank->next``."""
    if r["kind"] == "ring":
        return None
    mid = r["value"].split("->")
    return int(mid[1]) if len(mid) >= 2 and mid[1].isdigit() else None


def _graph_need(r: dict[str, Any]) -> int:
    """The smallest communicator size a ring/tree line fits (its largest rank + 1)."""
    nums = [int(x) for x in re.findall(r"-?\d+", r["value"]) if not x.startswith("-")]
    return max(nums, default=-1) + 1


class _Chooser:
    """:func:`_candidates` (then :func:`_only_comm`) for the lines of each process, memoised per stretch of lines
    between the lines that change the answer -- its communicators' Init START / COMPLETE, nNodes and Destroy lines
    and its COLL lines: an INFO log's transport lines come in runs of thousands between two of them, and a process
    may hold hundreds of communicators (each line scanning them all made a big log quadratic)."""

    def __init__(self, ctx: dict[tuple[str, int], Any]) -> None:
        self.ctx = ctx
        self.breaks: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        self.memo: dict[tuple[Any, ...], _Comm | None] = {}

    def choose(self, proc: tuple[str, int], line: int, fits: Any, fit_key: tuple[Any, ...]) -> _Comm | None:
        """The first candidate of ``line`` that ``fits``, else the process's only communicator if it fits;
        ``fit_key`` says what ``fits`` depends on besides the communicator."""
        cx = self.ctx.get(proc)
        if cx is None:
            return None
        b = self.breaks.get(proc)
        if b is None:
            comms, colls = cx
            points = sorted({v for c in comms for v in (c.start_line, c.init_line, c.end_line, c.nnodes_line)
                             if v is not None})
            b = self.breaks[proc] = (np.array(points, np.int64),
                                     colls[0] if colls is not None else np.empty(0, np.int64))
        key = (proc, int(np.searchsorted(b[0], line)), int(np.searchsorted(b[1], line)), *fit_key)
        if key not in self.memo:
            self.memo[key] = next((c for c in _candidates(cx, line) if fits(c)), None) or _only_comm(cx, line, fits)
        return self.memo[key]


def _attribute(st: _Parser, ctx: dict[tuple[str, int], Any]) -> tuple[list[_Comm | None], list[_Comm | None]]:
    """The communicator of every transport line and every ring/tree line (None when ambiguous): the first
    candidate (:func:`_candidates`) where the logging rank and the size fit, else the process's only
    communicator. A communicator whose rank is unknown (no Init or nNodes line) fits any rank, and the lines
    given to it are the evidence :func:`_infer_ranks` reads its rank from (``st.rank_evidence``)."""
    evidence: dict[int, set[int]] = defaultdict(set)
    chooser = _Chooser(ctx)
    conn_comms: list[_Comm | None] = []
    for r in st.conns:
        logger = r["dst"] if r["direction"] == "receive" and r["dst"] is not None else r["src"]
        need = max(r["src"], r["dst"] or 0)

        def fits(c: _Comm, logger: int = logger, need: int = need) -> bool:
            return (c.rank is None or c.rank == logger) and c.nranks is not None and need < c.nranks

        chosen = chooser.choose((r["host"], r["pid"]), r["line"], fits, ("conn", logger, need))
        if chosen is not None and chosen.rank is None:
            evidence[chosen.idx].add(logger)
        conn_comms.append(chosen)
    graph_comms: list[_Comm | None] = []
    for r in st.graph:
        me, need = _graph_rank(r), _graph_need(r)

        def fits_g(c: _Comm, me: int | None = me, need: int = need) -> bool:
            return (me is None or c.rank is None or c.rank == me) and (c.nranks is None or need <= c.nranks)

        chosen = chooser.choose((r["host"], r["pid"]), r["line"], fits_g, ("graph", me, need))
        if chosen is not None and chosen.rank is None and me is not None:
            evidence[chosen.idx].add(me)
        graph_comms.append(chosen)
    st.rank_evidence = evidence
    return conn_comms, graph_comms


def _infer_ranks(st: _Parser) -> None:
    """Ranks of communicators without Init or nNodes line, from what else the log says, best first:

    1. the rank the transport, ring and tree lines attributed to it say the process has (``topology``);
    2. for a process with no known rank at all, in its largest communicator (its world): the rank of its
       launcher prefix (OpenMPI ``[1,R]<stdout>:``, ``srun --label`` ``R: ``; ``launcher``), else its CUDA
       device ``[d]`` (``device``: right for one process per GPU on one node, ranks numbered like devices).
       A guess is dropped when two processes would share it, or it is not below the size."""
    unsure = 0
    for c in st.comms:
        ev = st.rank_evidence.get(c.idx)
        if c.rank is None and ev:
            if len(ev) == 1 and (c.nranks is None or min(ev) < c.nranks):
                c.rank, c.rank_source = min(ev), "nccl-topology"
            else:
                unsure += 1
    if unsure:
        st.diagnostics.append(Diagnostic(st.path, f"{unsure} communicators without Init line: their transport, "
                                         "ring and tree lines disagree on the rank of the process (left unknown)"))
    by_proc: dict[tuple[str, int], list[_Comm]] = defaultdict(list)
    for c in st.comms:
        if c.host is not None and c.pid is not None:
            by_proc[(c.host, c.pid)].append(c)
    worlds: dict[tuple[str, int], _Comm] = {}
    for key, cs in by_proc.items():
        sizes = [c.nranks for c in cs if c.nranks]
        p = st.procs.get(key)
        stated = p is not None and (p.tests_rank is not None or p.rccl_globalrank is not None)
        if any(c.rank is not None for c in cs) or not sizes or stated:
            continue
        top = [c for c in cs if c.nranks == max(sizes)]
        if len(top) == 1:
            worlds[key] = top[0]
    if not worlds:
        return
    taken: dict[int, set[int]] = defaultdict(set)  # size -> ranks known for processes of the file
    for cs in by_proc.values():
        for c in cs:
            if c.rank is not None and c.nranks:
                taken[c.nranks].add(c.rank)

    def launcher_rank(key: tuple[str, int]) -> int | None:
        p = st.procs.get(key)
        found = {int(m["mpi"] or m["srun"]) for m in (LAUNCHER_RANK.match(x) for x in (p.prefixes if p else []))
                 if m}
        return found.pop() if len(found) == 1 else None

    def device_rank(key: tuple[str, int]) -> int | None:
        p = st.procs.get(key)
        return next(iter(p.devices)) if p is not None and len(p.devices) == 1 else None

    guessed: dict[str, list[str]] = defaultdict(list)
    for source, guess in (("launcher", launcher_rank), ("device", device_rank)):
        cand = {key: guess(key) for key, w in worlds.items() if w.rank is None}
        count: dict[tuple[int, int], int] = defaultdict(int)
        for key, r in cand.items():
            if r is not None:
                count[(worlds[key].nranks or 0, r)] += 1
        for key, r in cand.items():
            w = worlds[key]
            n = w.nranks or 0
            if r is None or r >= n or count[(n, r)] > 1 or r in taken[n]:
                continue
            w.rank, w.rank_source = r, source
            taken[n].add(r)
            guessed[source].append(f"{key[0]}:{key[1]}" if key[1] >= 0 else
                                   f"[{-2 - key[1]}]" if key[1] <= -2 else "(no prefix)")
    for source, who in guessed.items():
        how = ("its launcher prefix (OpenMPI [job,rank], srun --label)" if source == "launcher" else
               "its CUDA device [d] (right only for one process per GPU on one node, with ranks numbered like "
               "the devices)")
        st.diagnostics.append(Diagnostic(
            st.path, f"no Init, nNodes or transport line says the rank of {len(who)} processes "
            f"({', '.join(who[:4])}{', ...' if len(who) > 4 else ''}): each one's rank is guessed from {how}"))
