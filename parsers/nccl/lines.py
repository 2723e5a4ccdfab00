"""The per-line path of the NCCL log parser, and the state of one parse (:class:`_Parser`).

Each block of lines goes through the columnar path first (:mod:`.columnar`); the lines it leaves are
classified here one by one with the regexes of :mod:`.grammar` -- Init, transport, ring and tree,
TUNING, nNodes, WARN and watchdog lines, interleaved, bare and damaged lines -- into the parse state:
communicator instances (:class:`_Comm`), processes (:class:`_Proc`), rows, counters and the kinds of lines
not understood. Resolving across lines happens once the whole log is read (:mod:`.comms`,
:mod:`.tuning`, :mod:`.tables`).
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.model.diagnostics import Diagnostic

from .columnar import _fast_block, _utf8_lines
from .grammar import (
    ANCHOR,
    BARE,
    CHANNEL_COUNT,
    COLL,
    CONN,
    COUNTS_COMM,
    DUMP_FROM,
    GLOG_TIME,
    I32_MIN,
    INIT,
    KNOWN,
    LAST_COMPLETED,
    LAST_ENQUEUED,
    LAUNCHER_ONLY,
    NCCL_MARK,
    NCCL_TESTS,
    NETWORK,
    NNODES,
    RAN_FOR,
    RING,
    RING_LINK,
    TIMESTAMP,
    TREE_ITEM,
    TREE_LINK,
    TUNING,
    UNWIND,
    VERSION,
    WATCHDOG,
    WATCHDOG_SEQ,
    WORK_NCCL,
)
from .network import STARTS, network_line

#: NCCL <= 2.28 formats a line into a 1024-byte buffer: a line this long was cut by NCCL.
NCCL_LINE_LIMIT = 1023
#: Line numbers quoted in the summary of unparsed lines.
MAX_EXAMPLES = 5
#: An orphan body is paired with a widowed prefix at most this many lines earlier.
WIDOW_WINDOW = 8
#: Kinds of not-understood lines kept per file (the rest are counted together).
MAX_UNKNOWN_KINDS = 200
MAX_EXAMPLE_CHARS = 160


# ---------------------------------------------------------------------------------------------------
# per-line path: everything else


@dataclass
class _Comm:
    """One communicator instance in one process."""

    idx: int
    host: str | None
    pid: int | None
    comm: str
    first_line: int
    rank: int | None = None
    nranks: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    api: str | None = None
    parent: str | None = None
    split_count: int | None = None
    color: int | None = None
    key: int | None = None
    comm_id: str | None = None
    comm_id_source: str | None = None
    start_line: int | None = None
    init_line: int | None = None
    end_line: int | None = None
    end: str | None = None
    grank_hint: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    local_rank: int | None = None
    coll_channels: int | None = None
    collnet_channels: int | None = None
    nvls_channels: int | None = None
    p2p_channels: int | None = None
    p2p_channels_per_peer: int | None = None
    parent_comm_id: str | None = None
    end_comm_id: str | None = None  # commId printed on the Destroy/Abort line
    nnodes_line: int | None = None  # the ``comm %p rank %d nRanks %d nNodes %d ...`` line
    inferred: bool = False  # no Init line: known from its nNodes, Destroy or COLL lines only
    rank_source: str | None = None  # what says ``rank``: nccl-init, nccl-nnodes, nccl-destroy, topology, ...


@dataclass
class _Proc:
    host: str
    pid: int
    version: str | None = None
    network: list[str] = field(default_factory=list)
    devices: set[int] = field(default_factory=set)
    prefixes: list[str] = field(default_factory=list)
    rccl_globalrank: int | None = None
    tests_rank: int | None = None
    #: ``NCCL_* set by environment to VALUE`` lines: name -> (value, line)
    env: dict[str, tuple[str, int]] = field(default_factory=dict)
    plugin: str | None = None  # the network plugin: "internal" or the name of the one loaded
    #: lines saying InfiniBand was not used: (kind, line, text)
    net_issues: list[tuple[str, int, str]] = field(default_factory=list)
    version_line: int | None = None
    net_used: str | None = None  # the network of its ``Using network X`` line


_NUMBER = re.compile(r"\d+")


def _ranks_fit(text: str) -> bool:
    """Whether every number of a ring or tree line fits the int32 NCCL keeps ranks and channels in."""
    return all(len(n) < 10 or int(n) < -I32_MIN for n in _NUMBER.findall(text))


def _i(s: str | None) -> int | None:
    return int(s) if s is not None else None


def bare_pid(dev: int | None) -> int:
    """The pid given to lines without ``host:pid:tid``: -1, or -2 - d for lines tagged ``[d]`` (no real pid is
    negative, so these never mix with a logged process)."""
    return -1 if dev is None else -2 - dev


_NUMBERISH = re.compile(r"^[-+]?(?:0x[0-9a-fA-F]+|\(nil\)|\d[\w.,:/%+-]*)$")
_DIGITS = re.compile(r"\d+")


def _kind(body: str) -> str:
    """What kind of message a line is, for counting: its first words with numbers, pointers and hex ids
    replaced by ``#`` (``Setting affinity for GPU 3 to ff,ff`` -> ``Setting affinity for GPU # to``)."""
    words = []
    for w in body.split()[:6]:
        words.append("#" if _NUMBERISH.match(w) else _DIGITS.sub("#", w) if any(c.isdigit() for c in w) else w)
    return " ".join(words) or "(empty)"


def _version_tuple(v: str) -> tuple[int, int, int]:
    a, b, c = v.split(".")[:3]
    return int(a), int(b), int(c)


class _Parser:
    """State of one parse: accumulators of the per-line path and the fast-path tables."""

    def __init__(self, path: str, max_line: int) -> None:
        self.path = path
        #: the reader's line limit (:data:`.reader.MAX_LINE`): a longer line is not run through the regexes
        self.max_line = max_line
        self.diagnostics: list[Diagnostic] = []
        self.coll_tables: list[pa.Table] = []
        self.slow_coll: list[dict[str, Any]] = []
        self.procs: dict[tuple[str, int], _Proc] = {}
        self.comms: list[_Comm] = []
        self.cur_comm: dict[tuple[str | None, int | None, str], _Comm] = {}
        self.conns: list[dict[str, Any]] = []
        self.graph: list[dict[str, Any]] = []
        self.pending_ctx: list[tuple[str, int, dict[str, Any]]] = []  # (kind, line, row)
        self.tuning_tables: list[pa.Table] = []
        self.slow_tuning: list[dict[str, Any]] = []
        self.warnings: list[dict[str, Any]] = []
        self.watchdog: list[dict[str, Any]] = []
        self.nics: list[dict[str, Any]] = []  # network devices of the NET/<net> : Using lines (:mod:`.network`)
        self.gdr: list[dict[str, Any]] = []  # GPU Direct RDMA lines
        self.versions: dict[str, int] = {}
        self.version_lines: dict[str, int] = {}  # the first line of each version
        self.networks: list[str] = []
        self.widows: deque[tuple[int, str, int]] = deque()
        self.last_msg: dict[str, Any] | None = None
        self.era_lo: tuple[int, int, int] = (2, 0, 0)
        self.era_hi: tuple[int, int, int] = (99, 0, 0)
        self.counts: dict[str, int] = defaultdict(int)
        self.unparsed_examples: list[int] = []
        self.cut_examples: list[int] = []
        #: NCCL lines not understood, by (level, kind): [count, first line, first text, damaged]
        self.unknown: dict[tuple[str, str], list[Any]] = {}
        #: comm idx -> the ranks its attributed transport/ring/tree lines say (comms of unknown rank)
        self.rank_evidence: dict[int, set[int]] = {}

    # -- helpers ---------------------------------------------------------------------------------
    def proc(self, host: str, pid: int) -> _Proc:
        key = (host, pid)
        p = self.procs.get(key)
        if p is None:
            p = self.procs[key] = _Proc(host, pid)
        return p

    def era(self, lo: tuple[int, int, int] | None = None, hi: tuple[int, int, int] | None = None) -> None:
        if lo and lo > self.era_lo:
            self.era_lo = lo
        if hi and hi < self.era_hi:
            self.era_hi = hi

    def unparsed(self, line: int) -> None:
        self.counts["unparsed_lines"] += 1
        if len(self.unparsed_examples) < MAX_EXAMPLES:
            self.unparsed_examples.append(line)

    def not_understood(self, no: int, level: str, kind: str, text: str, damaged: bool = False) -> None:
        """Count an NCCL line the parser has no rule for (or could not read) under its kind, keeping the
        first example, so the file's diagnostics can say what was skipped."""
        self.counts["unrecognised_lines"] += 1
        entry = self.unknown.get((level, kind))
        if entry is None:
            if len(self.unknown) >= MAX_UNKNOWN_KINDS:
                kind = "(other kinds)"
                entry = self.unknown.get((level, kind))
            if entry is None:
                entry = self.unknown[(level, kind)] = [0, no, text.strip()[:MAX_EXAMPLE_CHARS], damaged]
        entry[0] += 1

    def damaged(self, no: int, level: str, what: str, body: str) -> None:
        """A line of a kind the parser reads, whose text does not fit that kind's grammar (cut, retyped)."""
        self.counts["unparsed_lines"] += 1
        self.counts["damaged_lines"] += 1
        self.not_understood(no, level, f"damaged {what} line", body, damaged=True)

    # -- blocks ----------------------------------------------------------------------------------
    def block(self, line0: int, data: bytes) -> int:
        """One block of whole lines: the columnar path first, then the per-line path, in line order,
        for what it left (lines it could not parse, and bodies of other INFO messages)."""
        data, starts, ends, lines = _utf8_lines(data)
        n = len(starts)
        self.counts["lines"] += n
        fast = _fast_block(data, starts, ends, lines, line0)
        if fast.coll is not None and fast.coll.num_rows:
            self.coll_tables.append(fast.coll)
            self.counts["nccl_lines"] += fast.coll.num_rows
        if fast.tuning is not None and fast.tuning.num_rows:
            self.tuning_tables.append(fast.tuning)
            self.counts["nccl_lines"] += fast.tuning.num_rows
        assert fast.done is not None
        self.counts["bare_lines"] += fast.bare
        idx = np.flatnonzero(~fast.done)
        texts = (lines if len(idx) == n else lines.take(pa.array(idx))).to_pylist() if len(idx) else []
        lens = (ends[idx] - starts[idx]).tolist()
        full = zip((line0 + idx).tolist(), texts, lens, strict=True)
        known = iter(fast.rest)
        nxt_full, nxt_known = next(full, None), next(known, None)
        while nxt_full is not None or nxt_known is not None:
            if nxt_known is None or (nxt_full is not None and nxt_full[0] < nxt_known[0]):
                self.line(*nxt_full)
                nxt_full = next(full, None)
            else:
                no, prefix, host, pid, tid, dev, body, nbytes = nxt_known
                self.counts["nccl_lines"] += 1
                self.message(no, 0, prefix or "", "INFO", host, pid, tid, dev, None, None, body.rstrip(),
                             nbytes)
                nxt_known = next(known, None)
        return n

    # -- one line --------------------------------------------------------------------------------
    def line(self, no: int, text: str, nbytes: int) -> None:
        """A line the columnar path did not take: find its anchors (several when processes
        interleaved), widowed prefixes, or treat it as a line without anchor."""
        if not text or text.isspace() or (len(text) < 200 and LAUNCHER_ONLY.match(text)):
            self.counts["blank_lines"] += 1
            return
        if nbytes > self.max_line:  # no NCCL line is this long: do not run regexes over megabytes
            self.counts["overlong_lines"] += 1
            self.unparsed(no)
            return
        anchors = list(ANCHOR.finditer(text)) if "NCCL" in text else []
        if not anchors:
            b = BARE.search(text) if "NCCL " in text else None
            if b is not None:
                self.bare(no, text, b, nbytes)
            else:
                self.no_anchor(no, text)
            return
        prefix = text[:anchors[0].start()]
        for k, a in enumerate(anchors):
            end = anchors[k + 1].start() if k + 1 < len(anchors) else len(text)
            body = text[a.end():end]
            host, pid = a["host"], int(a["pid"])
            if k + 1 < len(anchors) and not body.strip():
                self.counts["widowed_prefixes"] += 1
                self.widows.append((no, host, pid))
                continue
            self.counts["nccl_lines"] += 1
            self.message(no, k, prefix if k == 0 else "", a["level"], host, pid, int(a["tid"]),
                         _i(a["dev"]), a["loc"], a["func"], body.rstrip(), end - a.start())

    def bare(self, no: int, text: str, b: re.Match[str], nbytes: int) -> None:
        """A line without ``host:pid:tid`` (``[dev] NCCL INFO ...`` or ``NCCL INFO ...``): the lines of each
        ``[dev]`` are one pseudo-process (host ``""``, pid :func:`bare_pid`), the others another one."""
        self.counts["nccl_lines"] += 1
        self.counts["bare_lines"] += 1
        dev = _i(b["dev"])
        self.message(no, 0, text[:b.start()], b["level"], "", bare_pid(dev), None, dev, b["loc"], b["func"],
                     text[b.end():].rstrip(), nbytes - len(text[:b.start()].encode()))

    def no_anchor(self, no: int, text: str) -> None:
        """A line without ``host:pid:tid``: version line, continuation, orphan body, PyTorch or
        nccl-tests output, or something unparsable."""
        if text[0] in " \t" and self.last_msg is not None and "opCount" not in text:
            self.counts["continuation_lines"] += 1
            self.last_msg["message"] = self.last_msg["message"] + "\n" + text.strip()
            return
        self.last_msg = None
        m = VERSION.search(text)
        if m:
            self.version(m, None, no)
            return
        m = COLL.search(text)
        if m:
            self.counts["orphan_lines"] += 1
            host, pid = self.take_widow(no)
            self.coll(no, 0, text[:m.start()], m, host, pid, None, None, orphan=True)
            return
        stripped = text.strip()
        for regex in (CONN, INIT):
            m = regex.search(stripped)
            if m:
                self.counts["orphan_lines"] += 1
                host, pid = self.take_widow(no)
                if regex is CONN:
                    self.conn(no, m, host, pid, orphan=True)
                else:
                    self.init(no, m, host, pid)
                return
        m = WATCHDOG.search(text) if "Rank " in text else None
        if m:
            self.watchdog_line(no, m, text)
            return
        m = NCCL_TESTS.search(stripped.lstrip("> "))
        if m and max(int(m["pid"]), int(m["rank"]), int(m["dev"])) < -I32_MIN:  # else damaged: unparsed
            p = self.proc(m["host"], int(m["pid"]))
            p.tests_rank = int(m["rank"])
            p.devices.add(int(m["dev"]))
            return
        mark = NCCL_MARK.search(text)
        if mark:  # an NCCL line whose prefix is unreadable
            self.damaged(no, mark[0][5:], "prefix of an NCCL", text)
            return
        self.unparsed(no)

    def take_widow(self, no: int) -> tuple[str | None, int | None]:
        while self.widows and self.widows[0][0] < no - WIDOW_WINDOW:
            self.widows.popleft()
        if self.widows:
            _, host, pid = self.widows.popleft()
            return host, pid
        return None, None

    def message(self, no: int, sub: int, prefix: str, level: str, host: str, pid: int, tid: int | None,
                dev: int | None, loc: str | None, func: str | None, body: str, nbytes: int) -> None:
        """One NCCL message (the text after ``NCCL LEVEL``) of process (host, pid); ``nbytes`` is
        the length of NCCL's own text (anchor + body), to spot lines cut by NCCL's 1 KB buffer."""
        cut = nbytes >= NCCL_LINE_LIMIT
        if cut:
            self.counts["cut_lines"] += 1
            if len(self.cut_examples) < MAX_EXAMPLES:
                self.cut_examples.append(no)
        proc = self.proc(host, pid)
        if dev is not None:
            proc.devices.add(dev)
        self.last_msg = None
        if level not in ("INFO", "TRACE", "CALL", "VERSION"):
            self.warn(no, prefix, level, host, pid, tid, dev, loc, func, body)
            return
        if " opCount " in body:
            m = COLL.match(body)
            if m:
                self.coll(no, sub, prefix, m, host, pid, tid, dev, orphan=False)
            else:
                self.damaged(no, level, "COLL", body)
            return
        if body.startswith("NCCL version"):
            m = VERSION.match(body)
            if m:
                self.version(m, proc, no)
                return
        if "- Init " in body or "- Destroy " in body or "- Abort " in body:  # 2.27+ START: "key 0- Init"
            m = INIT.search(body)
            if m:
                self.init(no, m, host, pid)
            else:
                self.damaged(no, level, "Init", body)
            return
        if " via " in body:
            m = CONN.match(body)
            if m:
                self.conn(no, m, host, pid, orphan=False)
                return
        if body.startswith(("Channel ", "Ring ")):
            m = RING.match(body) or RING_LINK.match(body)
            if m and not _ranks_fit(m.group()):  # a rank past int32: the line is damaged, and counted so
                self.damaged(no, level, "Ring", body)
                return
            if m and m.re is RING:
                self.ring(no, m, host, pid, cut)
                return
            if m:
                self.link(no, "ring_link", int(m["ch"]), f"{m['prev']}->{m['rank']}->{m['next']}", host, pid)
                return
        if body.startswith("Tree"):
            if not _ranks_fit(body):
                self.damaged(no, level, "Tree", body)
                return
            if body.startswith("Trees"):
                self.trees(no, level, body, host, pid, cut)
                return
            m = TREE_LINK.match(body)
            if m:  # as the Trees line writes it: children->rank->parent
                self.link(no, "tree", int(m["ch"]), f"{m['down']}->{m['rank']}->{m['up']}", host, pid)
                return
        if " Bytes -> " in body:
            m = TUNING.match(body)
            if m:
                self.tuning_line(no, m, host, pid)
            else:
                self.damaged(no, level, "TUNING", body)
            return
        if "nNodes" in body:
            m = NNODES.search(body)
            if m:
                self.nnodes(no, m, host, pid)
                return
        if " channels" in body and "coll channels" in body:
            self.channel_counts(no, body, host, pid)
            return
        if body.lstrip().startswith(STARTS) and network_line(self, no, body, host, pid):
            return
        m = NETWORK.match(body)
        if m:
            net = m["net"] or m["net2"]
            if m["net"]:
                proc.net_used = net
            if net not in proc.network:
                proc.network.append(net)
            if net not in self.networks:
                self.networks.append(net)
            return
        if UNWIND.match(body):
            self.counts["unwind_lines"] += 1
            return
        if KNOWN.match(body.lstrip()) or not body.strip():
            self.counts["ignored_lines"] += 1
            return
        self.not_understood(no, level, _kind(body), body)

    # -- messages --------------------------------------------------------------------------------
    def version(self, m: re.Match[str], proc: _Proc | None, no: int | None = None) -> None:
        v = m["ver"]
        self.versions[v] = self.versions.get(v, 0) + 1
        if no is not None:
            self.version_lines.setdefault(v, no)
        if proc is not None:
            proc.version, proc.version_line = v, no

    def warn(self, no: int, prefix: str, level: str, host: str, pid: int, tid: int, dev: int | None,
             loc: str | None, func: str | None, body: str) -> None:
        self.counts["warn_lines"] += 1
        ts = TIMESTAMP.search(prefix)
        if ts:
            self.era(lo=(2, 26, 0))
        row = {"line": no, "host": host, "pid": pid, "tid": tid, "device": dev, "level": level,
               "loc": loc, "func": func,
               "message": body.strip(), "log_time": ts["ts"] if ts else None}
        self.warnings.append(row)
        self.last_msg = row

    def coll(self, no: int, sub: int, prefix: str, m: re.Match[str], host: str | None,
             pid: int | None, tid: int | None, dev: int | None, *, orphan: bool) -> None:
        count = int(m["count"])
        self.slow_coll.append({
            "line": no, "sub": sub, "host": host, "pid": pid, "tid": tid, "device": dev,
            "op_raw": m["op"], "opcount": int(m["opcount"], 16) if len(m["opcount"]) < 16 else None,
            "in_place": m["sendbuff"] == m["recvbuff"],
            "count": count if count < (1 << 63) else None, "dtype_id": int(m["dtype"]),
            "redop": int(m["redop"]), "root": int(m["root"]), "comm": m["comm"],
            "nranks": int(m["nranks"]), "stream": m["stream"], "prefix": prefix or None,
            "rest": m["rest"] or None, "orphan": orphan})

    def init(self, no: int, m: re.Match[str], host: str | None, pid: int | None) -> None:
        what = m["what"]
        ptr = m["comm"]
        key = (host, pid, ptr)
        cur = self.cur_comm.get(key)
        commid = "0x" + m["commid"].lower() if m["commid"] else None
        rank, nranks = int(m["rank"]), int(m["nranks"])
        if not (I32_MIN <= rank < -I32_MIN and 0 <= nranks < -I32_MIN):  # damaged: ranks are int32 everywhere
            self.unparsed(no)
            return
        # era evidence
        if what == "Init START":
            self.era(lo=(2, 18, 3))
            self.counts["init_start_lines"] += 1
        elif what == "Init COMPLETE" and commid is not None:
            self.counts["init_complete_with_id"] += 1
        if m["api"]:
            self.era(lo=(2, 21, 0))
        if m["countkind"]:
            self.era(lo=(2, 27, 0) if m["countkind"] == "splitCount" else (2, 29, 0))
        if what.startswith("Init"):
            if m["busid"] is None:
                self.era(hi=(2, 4, 99))
            elif commid is None and m["parent"] is None:
                self.era(lo=(2, 5, 0), hi=(2, 15, 99))
            elif commid is not None:
                self.era(lo=(2, 16, 0))
        if what in ("Destroy COMPLETE", "Abort COMPLETE"):
            if cur is None or cur.end_line is not None:
                cur = self.new_comm(no, host, pid, ptr)
                self.fill(cur, m, rank, nranks)
                cur.inferred, cur.rank_source = True, "nccl-destroy"
            cur.end_line = no
            cur.end = "destroy" if what.startswith("Destroy") else "abort"
            if commid and cur.comm_id is None:
                cur.end_comm_id = commid  # 2.27+ prints it here even for splits; checked when resolving
            return
        new = (cur is None or cur.end_line is not None
               or (what == "Init START" and (cur.start_line is not None or cur.init_line is not None))
               or (what == "Init COMPLETE" and cur.init_line is not None)
               or cur.rank != rank or cur.nranks != nranks
               or (commid is not None and cur.comm_id is not None and cur.comm_id != commid
                   and cur.comm_id_source == "log"))
        if new:
            cur = self.new_comm(no, host, pid, ptr)
        self.fill(cur, m, rank, nranks)
        cur.inferred, cur.rank_source = False, "nccl-init"
        if commid:
            cur.comm_id, cur.comm_id_source = commid, "log"
        if what == "Init START":
            cur.start_line = no
        else:
            cur.init_line = no

    def new_comm(self, no: int, host: str | None, pid: int | None, ptr: str) -> _Comm:
        c = _Comm(len(self.comms), host, pid, ptr, no)
        self.comms.append(c)
        self.cur_comm[(host, pid, ptr)] = c
        return c

    @staticmethod
    def fill(c: _Comm, m: re.Match[str], rank: int, nranks: int) -> None:
        c.rank, c.nranks = rank, nranks
        c.cuda_dev = _i(m["cudadev"])
        if m["nvmldev"] is not None:
            c.nvml_dev = int(m["nvmldev"])
        if m["busid"] is not None:
            c.bus_id = m["busid"].lower()
        if m["api"]:
            c.api = m["api"]
        if m["parent"] is not None:
            c.parent = m["parent"]
        if m["splitcount"] is not None:
            c.split_count = int(m["splitcount"])
        if m["color"] is not None:
            c.color, c.key = int(m["color"]), int(m["key"])
        if m["grank"] is not None:
            c.grank_hint = int(m["grank"])

    def conn(self, no: int, m: re.Match[str], host: str | None, pid: int | None, *, orphan: bool) -> None:
        kw, conn = m["kw"], m["conn"]
        via = m["via"]
        if kw == "Ring":
            self.era(hi=(2, 6, 99))
        elif kw == "Coll":
            self.era(lo=(2, 7, 0), hi=(2, 11, 99))
        elif kw == "Channel":
            # the connection index /c: NET lines from 2.12, P2P lines from 2.14, SHM lines never
            if via.startswith("NET/"):
                self.era(lo=(2, 12, 0)) if conn is not None else self.era(lo=(2, 7, 0), hi=(2, 11, 99))
            elif via.startswith("SHM/"):
                self.era(lo=(2, 14, 0))
            elif via.startswith("direct shared memory"):
                self.era(lo=(2, 7, 0), hi=(2, 13, 99))
            elif conn is not None:
                self.era(lo=(2, 14, 0))
            else:
                self.era(lo=(2, 7, 0), hi=(2, 13, 99))
        row = {"line": no, "host": host, "pid": pid, "channel": int(m["ch"]), "conn": _i(conn),
               "src": int(m["src"]), "dst": _i(m["dst"]), "src_dev": m["sdev"], "dst_dev": m["ddev"],
               "direction": m["dir"], "detail": m["via"].strip(), "orphan": orphan}
        self.conns.append(row)

    def ring(self, no: int, m: re.Match[str], host: str, pid: int, cut: bool) -> None:
        ranks = m["ranks"].split()
        if m["more"]:  # NCCL >= 2.19 ends a ring longer than 128 characters with "...", over a number's digits
            cut = True
            if ranks and not m["more"][:1].isspace():
                ranks = ranks[:-1]
        self.graph.append({"line": no, "host": host, "pid": pid, "kind": "ring", "channel": int(m["ch"]),
                           "nchannels": _i(m["n"]), "value": " ".join(ranks), "cut": cut})

    def trees(self, no: int, level: str, body: str, host: str, pid: int, cut: bool) -> None:
        items = TREE_ITEM.findall(body)
        if not items:
            self.damaged(no, level, "Trees", body)
            return
        if "|" in body:
            self.era(hi=(2, 6, 99))
        for ch, tree in items:
            self.graph.append({"line": no, "host": host, "pid": pid, "kind": "tree", "channel": int(ch),
                               "nchannels": None, "value": tree, "cut": cut})

    def link(self, no: int, kind: str, channel: int, value: str, host: str, pid: int) -> None:
        """A 2.19+ per-rank ring (``prev->rank->next``) or tree (``children->rank->parent``) line."""
        self.era(lo=(2, 19, 0))
        self.graph.append({"line": no, "host": host, "pid": pid, "kind": kind, "channel": channel,
                           "nchannels": None, "value": value, "cut": False})

    def tuning_line(self, no: int, m: re.Match[str], host: str, pid: int) -> None:
        self.slow_tuning.append({"line": no, "host": host, "pid": pid, **{
            k: m[k] for k in ("op", "bytes", "algo", "proto", "time", "lo", "hi", "kernel", "tail")}})

    def nnodes(self, no: int, m: re.Match[str], host: str, pid: int) -> None:
        """The nNodes line (2.12+) names the comm, the rank and the size: without an Init line before it
        (an excerpt, or eras without Init START) it starts the communicator instance."""
        c = self.cur_comm.get((host, pid, m["comm"]))
        rank, nranks = int(m["rank"]), int(m["nranks"])
        vals = int(m["nnodes"]), int(m["lranks"]), int(m["lrank"])
        if max(abs(rank), nranks, *vals) >= -I32_MIN:  # damaged: these are int32 everywhere
            self.unparsed(no)
            return
        if c is None or c.end_line is not None or c.init_line is not None or c.nnodes_line is not None:
            # one nNodes line per initialisation: a second one at the pointer is a new instance
            c = self.new_comm(no, host, pid, m["comm"])
            c.inferred = True
        if c.rank is None:
            c.rank, c.nranks, c.rank_source = rank, nranks, "nccl-nnodes"
        elif (c.rank, c.nranks) != (rank, nranks):
            return
        c.nnodes_line = no
        c.nnodes, c.local_ranks, c.local_rank = vals

    def channel_counts(self, no: int, body: str, host: str, pid: int) -> None:
        vals: dict[str, int] = {}
        for m in CHANNEL_COUNT.finditer(body):
            vals[m["kind"] + ("_per_peer" if m["pp"] else "")] = int(m["n"])
        cm = COUNTS_COMM.search(body)
        row = {"line": no, "host": host, "pid": pid, "kind": "counts", "vals": vals,
               "comm": cm["comm"] if cm else None}
        self.pending_ctx.append(("counts", no, row))

    def watchdog_line(self, no: int, m: re.Match[str], text: str) -> None:
        """A line of PyTorch's ProcessGroupNCCL watchdog: a collective that timed out (``WorkNCCL(SeqNum=...,
        OpType=...)``, how long it ran), the work it stopped at with the last work each rank enqueued and
        completed, a dump signal from another rank, the periodic progress line."""
        what = m["what"]
        w = WORK_NCCL.search(what)
        args = dict(kv.split("=", 1) for kv in w["args"].split(", ") if "=" in kv) if w else {}

        def num(k: str) -> int | None:
            v = args.get(k, "")
            return int(v) if v.isdigit() and len(v) < 19 else None

        def found(regex: re.Pattern[str], key: str = "n") -> int | None:
            f = regex.search(what)
            return int(f[key]) if f else None

        kind = ("timeout" if what.startswith("Watchdog caught") else "dump" if what.startswith("Received a dump")
                else "progress" if what.startswith("NCCL Work update") else "failed" if what.startswith("Some NCCL")
                else "exception")
        seq = num("SeqNum")
        if seq is None:
            seq = found(WATCHDOG_SEQ, "seq")
        pg = m["desc"] or m["pg"]
        if m["pg"] is not None and m["desc"]:
            pg = f"{m['pg']} ({m['desc']})"
        glog = GLOG_TIME.search(text[:m.start()])
        self.watchdog.append({"line": no, "rank": int(m["rank"]), "seq_num": seq, "op_type": args.get("OpType"),
                              "numel_in": num("NumelIn"), "numel_out": num("NumelOut"),
                              "timeout_ms": num("Timeout(ms)"), "text": text.strip(), "kind": kind, "pg": pg,
                              "last_enqueued": found(LAST_ENQUEUED), "last_completed": found(LAST_COMPLETED),
                              "ran_ms": found(RAN_FOR, "ms"), "dump_from": found(DUMP_FROM, "rank"),
                              "log_time": glog["ts"] if glog else None})
