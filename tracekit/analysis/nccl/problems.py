"""Problems people grep NCCL logs for, each with its file and line (NCCL_PROBLEMS rows):

* ``warn`` — every ``NCCL WARN`` line (and the other non-INFO levels);
* ``socket-fallback`` — a process on ``NET/Socket`` where InfiniBand was expected: NCCL said it found no IB device
  or no libibverbs, ``NCCL_IB_HCA`` names HCAs, ``NCCL_IB_DISABLE`` switched IB off, or other processes of the job
  use IB;
* ``gdr-disabled`` — GPU Direct RDMA disabled for an HCA (its GDR line), or NET/IB connections of a process
  without ``/GDRDMA`` (data staged through host memory);
* ``version-mismatch`` — more than one NCCL version among the processes of the job;
* ``watchdog-timeout`` — PyTorch's ``Watchdog caught collective operation timeout`` per rank, and from the last
  enqueued and completed work the ranks report, ``stopped-first`` (the ranks that never enqueued the work the
  others wait in) or ``hung-collective`` (every rank that reports enqueued it and none completed it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import polars as pl
import pyarrow as pa

from tracekit.model import schema
from tracekit.model.schema import ParsedFile


def _row(kind: str, path: str, line: int | None, message: str, host: str | None = None, pid: int | None = None,
         rank: int | None = None) -> dict[str, Any]:
    return {"kind": kind, "path": path, "line": line, "host": host or None, "pid": pid, "rank": rank,
            "message": message}


def _rank_text(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _warnings(f: ParsedFile) -> list[dict[str, Any]]:
    t = f.tables.get("nccl_warnings")
    if t is None or not t.num_rows:
        return []
    rows = []
    for r in t.select(["line", "host", "pid", "level", "message"]).to_pylist():
        first = (r["message"] or "").splitlines()[0] if r["message"] else ""
        rows.append(_row("warn", f.path, r["line"], f"NCCL {r['level']}: {first}", r["host"], r["pid"]))
    return rows


def _rank_of(f: ParsedFile) -> dict[tuple[str, int], int | None]:
    return {(p["host"], p["pid"]): p.get("rank") for p in f.meta.get("processes") or []}


def _who(procs: list[dict[str, Any]]) -> str:
    """``host:pid`` of a few processes (``the log's process`` for one without a host prefix)."""
    names = [f"{p['host']}:{p['pid']}" if (p.get("pid") or 0) >= 0 else "the log's process" for p in procs]
    return f"{len(names)} processes ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})" if len(names) > 1 \
        else names[0]


def _socket_fallback(files: list[ParsedFile], multi_node: bool | None) -> list[dict[str, Any]]:
    """Processes on sockets where InfiniBand was expected (module docstring), one row per file and reason; none when
    the logs show the job inside one host (its traffic never reaches the network)."""
    if multi_node is False:
        return []
    procs = [(f, p) for f in files for p in f.meta.get("processes") or []]
    ib_users = sum(1 for _, p in procs if any(n.startswith("IB") for n in p.get("network") or []))
    found: dict[tuple[str, str], list[tuple[int | None, dict[str, Any]]]] = defaultdict(list)
    for f, p in procs:
        nets = p.get("network") or []
        if "Socket" not in nets or any(n.startswith("IB") for n in nets):
            continue
        env = p.get("env") or {}
        issues = p.get("net_issues") or []
        disable = env.get("NCCL_IB_DISABLE")
        if disable and disable["value"].strip() not in ("", "0"):
            why, line = f"NCCL_IB_DISABLE={disable['value']} switched InfiniBand off", disable["line"]
        elif issues:
            why, line = f"NCCL could not use InfiniBand ('{issues[0]['text']}')", issues[0]["line"]
        elif env.get("NCCL_IB_HCA"):
            why, line = (f"NCCL_IB_HCA={env['NCCL_IB_HCA']['value']} names HCAs, yet none was used",
                         env["NCCL_IB_HCA"]["line"])
        elif ib_users:
            why, line = (f"{ib_users} other process{'es' if ib_users > 1 else ''} of the job "
                         f"use{'' if ib_users > 1 else 's'} IB"), None
        else:
            continue
        found[(f.path, why)].append((line, p))
    rows = []
    span = "" if multi_node else " (if the job spans hosts: the logs do not show whether it does)"
    for (path, why), hits in found.items():
        lines = [ln for ln, _ in hits if ln is not None]
        ps = [p for _, p in hits]
        rows.append(_row("socket-fallback", path, min(lines) if lines else None,
                         f"{_who(ps)} send{'s' if len(ps) == 1 else ''} over NET/Socket (TCP){span}: {why}; check "
                         "NCCL_IB_HCA, NCCL_IB_DISABLE and the RDMA drivers", ps[0]["host"], ps[0]["pid"],
                         ps[0].get("rank")))
    return rows


def _gdr(f: ParsedFile) -> list[dict[str, Any]]:
    """GDR lines that say disabled (one row per file listing the HCAs and processes), and the processes whose NET/IB
    connections all go without GPU Direct RDMA where no GDR line spoke of them (one row)."""
    rows = []
    said: set[tuple[str, int]] = set()
    net = f.tables.get("nccl_network")
    if net is not None and net.num_rows:
        off = [r for r in net.to_pylist() if r["gdr"] is False]
        if off:
            hcas = sorted({f"HCA {r['index']}" + (f" '{r['device']}'" if r["device"] else "") for r in off})
            why = sorted({r["gdr_reason"] for r in off if r["gdr_reason"]})
            procs = list({(r["host"], r["pid"]): {"host": r["host"], "pid": r["pid"]} for r in off}.values())
            said |= {(p["host"], p["pid"]) for p in procs}
            rows.append(_row("gdr-disabled", f.path, min(r["gdr_line"] for r in off),
                             f"GPU Direct RDMA disabled for {', '.join(hcas)}" + (f" ({'; '.join(why)})" if why else "")
                             + f" on {_who(procs)}: data between GPU and NIC is staged through host memory (check "
                             "nvidia-peermem and NCCL_NET_GDR_LEVEL)", procs[0]["host"], procs[0]["pid"]))
    conns = f.tables.get("nccl_connections")
    if conns is not None and conns.num_rows == f.topology.num_rows and conns.num_rows:
        t = pl.from_arrow(f.topology.select(["transport", "detail"]))
        k = pl.from_arrow(conns.select(["line", "host", "pid"]))
        assert isinstance(t, pl.DataFrame) and isinstance(k, pl.DataFrame)
        ib = pl.concat([k, t], how="horizontal").filter(pl.col("transport").str.starts_with("NET/IB"))
        without = []
        for (host, pid), g in ib.group_by(["host", "pid"], maintain_order=True):
            if (host, pid) not in said and not g.get_column("detail").str.contains("GDRDMA").any():
                without.append(({"host": host, "pid": pid}, int(g.get_column("line").min()), g.height))
        if without:
            n_conns, who = sum(n for _, _, n in without), _who([p for p, _, _ in without])
            rows.append(_row("gdr-disabled", f.path, min(ln for _, ln, _ in without),
                             f"{n_conns} NET/IB connections of {who} "
                             "go without GPU Direct RDMA (no /GDRDMA in their transport lines): data is staged through "
                             "host memory (check nvidia-peermem and NCCL_NET_GDR_LEVEL)", without[0][0]["host"],
                             without[0][0]["pid"]))
    return rows


def _versions(files: list[ParsedFile]) -> list[dict[str, Any]]:
    """Every NCCL version of the job with where it first shows; one row per version beside the most common one."""
    seen: dict[str, list[tuple[str, int | None, int]]] = defaultdict(list)
    for f in files:
        for v, info in (f.meta.get("versions") or {}).items():
            seen[v].append((f.path, info.get("line"), int(info.get("count") or 0)))
        for p in f.meta.get("processes") or []:
            if p.get("version") and p["version"] not in f.meta.get("versions", {}):
                seen[p["version"]].append((f.path, p.get("version_line"), 1))
    if len(seen) < 2:
        return []
    counts = {v: sum(n for _, _, n in where) for v, where in seen.items()}
    common = sorted(counts, key=lambda v: (-counts[v], v))[0]
    listed = ", ".join(f"{v} ({counts[v]}x)" for v in sorted(counts))
    return [_row("version-mismatch", seen[v][0][0], seen[v][0][1],
                 f"NCCL {v} here, {common} elsewhere in the job (versions: {listed}): every rank must run the same "
                 "NCCL") for v in sorted(counts) if v != common]


def _watchdog(files: list[ParsedFile]) -> list[dict[str, Any]]:
    """Timeouts per rank, then which rank stopped first (module docstring)."""
    rows: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    timeouts: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for f in files:
        t = f.tables.get("pytorch_watchdog")
        if t is None or not t.num_rows:
            continue
        for r in t.to_pylist():
            r["path"] = f.path
            reports.append(r)
            if r.get("kind", "timeout") == "timeout" and r.get("seq_num") is not None:
                timeouts[(f.path, r.get("pg"), r["seq_num"], r.get("op_type"))].append(r)
    for (path, pg, seq, op), hits in timeouts.items():
        ranks = sorted({r["rank"] for r in hits})  # the exception's text repeats a rank's line
        ran = [r["ran_ms"] for r in hits if r.get("ran_ms")]
        after = f" after {max(ran) / 1000:g} s" if ran else ""
        rows.append(_row("watchdog-timeout", path, min(r["line"] for r in hits),
                         f"rank{'s' if len(ranks) > 1 else ''} {_rank_text(ranks)}: collective SeqNum {seq} "
                         f"({op or '?'}) timed out{after}" + (f" in process group {pg}" if pg else ""), rank=ranks[0]))
    by_pg: dict[Any, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in reports:
        if r.get("last_enqueued") is None:
            continue
        cur = by_pg[r.get("pg")].get(r["rank"])
        if cur is None or (r["last_enqueued"], r.get("last_completed") or -1) > (cur["last_enqueued"],
                                                                               cur.get("last_completed") or -1):
            by_pg[r.get("pg")][r["rank"]] = r
    for pg, per_rank in by_pg.items():
        if len(per_rank) < 2:
            continue
        enq = {rank: r["last_enqueued"] for rank, r in per_rank.items()}
        low, high = min(enq.values()), max(enq.values())
        where = f" of process group {pg}" if pg else ""
        if low < high:
            behind = sorted(rk for rk, v in enq.items() if v == low)
            ahead = sorted(rk for rk, v in enq.items() if v > low)
            first = per_rank[behind[0]]
            rows.append(_row("stopped-first", first["path"], first["line"],
                             f"rank{'s' if len(behind) > 1 else ''} {_rank_text(behind)}{where} stopped first: last "
                             f"enqueued work {low}, while rank{'s' if len(ahead) > 1 else ''} {_rank_text(ahead)} "
                             f"enqueued up to {high} and wait in it — look at what rank {behind[0]} was doing "
                             "(a collective it never called, a hang outside NCCL)", rank=behind[0]))
        else:
            done = {rank: r.get("last_completed") for rank, r in per_rank.items()}
            if all(v is not None and v < high for v in done.values()):
                first = per_rank[min(per_rank)]
                rows.append(_row("hung-collective", first["path"], first["line"],
                                 f"every rank that reports its work{where} (ranks {_rank_text(list(per_rank))}) "
                                 f"enqueued work {high} and none completed it: the collective itself hung (network, "
                                 "NCCL), not a rank that fell behind — unless a rank that logged nothing did",
                                 rank=first["rank"]))
    return rows


def problems(files: Iterable[ParsedFile], multi_node: bool | None = None) -> pa.Table:
    """NCCL_PROBLEMS of the job's NCCL logs (module docstring), in file and line order within each kind.
    ``multi_node``: whether the logs show traffic between hosts (False: all inside one host; None: not known)."""
    logs = [f for f in files if f.format == "nccl-log"]
    if not logs:
        return schema.empty(schema.NCCL_PROBLEMS)
    rows: list[dict[str, Any]] = []
    for f in logs:
        rows += _warnings(f)
    rows += _socket_fallback(logs, multi_node)
    for f in logs:
        rows += _gdr(f)
    rows += _versions(logs)
    rows += _watchdog(logs)
    if not rows:
        return schema.empty(schema.NCCL_PROBLEMS)
    return schema.table(schema.NCCL_PROBLEMS, {k: [r[k] for r in rows] for k in schema.NCCL_PROBLEMS.names})
