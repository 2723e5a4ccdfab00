"""NCCL debug logs (``NCCL_DEBUG=INFO``, FORMATS.md section 2) into tracekit tables.

A log is text lines written by one or many processes (a per-process ``NCCL_DEBUG_FILE``, or a shared
stdout with launcher prefixes and interleaving). This parser turns it into:

``collectives`` (COLLECTIVES schema), one row per ``COLL`` line (``NCCL_DEBUG_SUBSYS`` must contain
``COLL``), in line order:

* ``rank`` -- the **global** rank of the process that logged the line when known (its rank in its
  largest communicator, the "world" comm, or RCCL's ``globalrank``), otherwise its rank in the
  communicator of the call, otherwise null. ``tables["nccl_calls"].rank_is_global`` says which.
* ``collective_id`` -- row number in this file (0-based, line order).
* ``pg`` -- the NCCL ``commId`` as printed (``0x`` + lower-case hex), equal on every member. NCCL 2.27+
  split communicators print no commId: it is *derived* exactly as NCCL computes it, from the parent's
  commId, ``splitCount`` and ``color``. Before NCCL 2.16 no commId exists at all: ``pg`` is then the
  synthetic ``synthetic-n{nranks}-{k}`` = the k-th communicator of that size created by the process
  (ranks create communicators in the same order, so it matches across ranks; two *disjoint* groups of
  equal size collide -- flagged by a diagnostic when both are in one file).
  ``tables["nccl_comms"].comm_id_source`` says which (``log``, ``derived``, ``synthetic``). Null when no
  Init line of the communicator is in the log (e.g. ``NCCL_DEBUG_SUBSYS=COLL`` only).
* ``seq`` -- 0-based index of the call among the calls of the same process on the same communicator
  (``pg``), in line order: the k-th call of a comm is the same collective on every member (FORMATS 2.4).
  NCCL's ``opCount`` is *not* a call id (stuck at 0 or shared by a group); it is in ``nccl_calls``.
* ``op`` -- ``allreduce allgather reduce_scatter broadcast reduce send recv all_to_all gather scatter``,
  other NCCL names lower-cased (``PutSignal`` -> ``putsignal``).
* ``dtype`` -- ``int8 uint8 int32 uint32 int64 uint64 float16 float32 float64 bfloat16 float8e4m3
  float8e5m2`` from the ``ncclDataType_t`` id (stable across NCCL 2.x), ``unknown(N)`` otherwise.
* ``count`` -- NCCL's count (elements; per-rank for allgather/reduce_scatter, per peer for all_to_all).
* ``bytes`` -- S of FORMATS.md section 4 (full buffer): ``n*c*s`` for allgather, reduce_scatter,
  all_to_all, gather, scatter; ``c*s`` otherwise; null for unknown datatypes.
* ``nranks`` -- the ``[nranks=N]`` of the line (size of the communicator).
* ``peer`` -- root of broadcast/reduce/gather/scatter, peer of send/recv, null otherwise. Converted
  to a global rank when the log says who that is (the comm is the world comm, or the peer's Init line
  is in this file); otherwise it stays the rank *in the communicator* and ``nccl_calls.peer_is_global``
  is false (the TraceSet can finish the job with the other ranks' files).
* ``algorithm`` / ``protocol`` -- from TUNING lines (rank 0 of the comm prints them after the group's
  COLL lines; they hold for every member, so they are copied to all rows of the same (pg, seq)):
  ``TREE RING COLLNET_DIRECT COLLNET_CHAIN NVLS NVLS_TREE PAT``, ``LL LL128 SIMPLE``.
* ``start_ns`` / ``end_ns`` -- null: NCCL logs COLL lines at enqueue and has no completion line.
* ``lane`` -- ``nccl/stream <cudaStream pointer>``; ``source`` -- ``nccl-log``.

``topology`` (TOPOLOGY schema), one row per transport line (``Ring/Channel NN[/c] : a[x] -> b[y]
[send|receive] via T``): ``rank`` is the rank **in the communicator** of the process that logged it
(``a``, or ``b`` for ``[receive]``), ``peer`` the other end (in-comm, like ``rank``), ``transport`` the
family (``P2P SHM NET/IB NET/Socket NET/<plugin> COLLNET NVLS ...``), ``detail`` the whole ``via`` text.
Transport lines do not name their communicator: they are attributed to the communicator being
initialised by that process (between Init START and COMPLETE, or before a COMPLETE in eras without
START), or -- for lazily connected channels -- to the comm of the process's last COLL line, checked
against the process's rank in it; null ``comm_id`` when that is ambiguous.

Extra tables (``ParsedFile.tables``), all with a ``line`` column (1-based line of the log):

* ``nccl_calls`` -- aligned row by row with ``collectives``: ``host pid tid device comm`` (host
  pointer) ``comm_rank global_rank rank_is_global peer_comm_rank peer_is_global opcount`` (int, from hex)
  ``redop in_place`` (sendbuff == recvbuff) ``prefix`` (launcher prefix before the NCCL text)
  ``log_time`` (the 2.26+ ``[%F %T]`` text when present) ``orphan`` (body found without its
  ``host:pid:tid`` prefix, FORMATS 2.6) ``task`` (RCCL) ``repeated`` (Ray ``[repeated Nx ...]``: lines
  Ray dropped).
* ``nccl_comms`` -- one row per communicator instance per process (a ``comm`` pointer reused after
  Destroy is a new instance): ``host pid comm comm_id comm_id_source rank nranks cuda_dev nvml_dev
  bus_id api parent parent_comm_id split_count color key start_line init_line end_line end`` (destroy /
  abort) ``nnodes local_ranks local_rank coll_channels collnet_channels nvls_channels p2p_channels
  p2p_channels_per_peer calls``.
* ``nccl_connections`` -- aligned row by row with ``topology``: ``host pid comm channel conn src dst
  src_dev dst_dev`` (the brackets, opaque strings) ``dev_kind`` (``cudaDev`` <= 2.4, ``busId``
  2.5-2.18.1, ``nvmlDev`` >= 2.18.3, null if the era is unknown) ``global_rank`` (of the logger)
  ``orphan``.
* ``nccl_graph`` -- ring orders (``kind=ring``: ``value`` = the space-separated in-comm ranks) and trees
  (``kind=tree``: ``value`` = ``children->rank->parent``) per channel, with ``nchannels`` and ``cut``
  (line hit NCCL's 1 KB limit).
* ``nccl_tuning`` -- every TUNING line: ``host pid op bytes algorithm protocol channel_lo channel_hi
  time_us kernel comm_id seq collective_id matched_by`` (how it was matched to its call).
* ``nccl_warnings`` -- WARN (and other non-INFO/TRACE levels) lines: ``host pid tid device level loc
  func message log_time``; indented continuation lines are appended to the message.
* ``pytorch_watchdog`` -- ProcessGroupNCCL watchdog lines: ``rank seq_num op_type numel_in numel_out
  timeout_ms text``.

``meta``: ``format_version`` / ``nccl_version`` (version line, else ``None``), ``era`` (inferred
version range), ``backend`` (``nccl``), ``world_size`` (largest comm), ``network`` (``IB``,
``Socket``, ...), ``processes`` (list of ``{host, pid, rank, rank_source, nranks, devices, comms,
version, network, prefixes}``, ``comms`` being ``[{comm, comm_id, rank, nranks, cuda_dev, bus_id, parent,
color, key}]``), and when the file holds exactly one process also ``rank host pid device``. Counters:
``lines``, ``blank_lines``, ``nccl_lines``, ``ignored_lines`` (NCCL lines of no interest),
``unparsed_lines``, ``warn_lines``, ``cut_lines``, ``orphan_lines``, ``widowed_prefixes``,
``ray_repeats``, ``continuation_lines``.

How: the input streams through :func:`parsers.source.iter_blocks` (gzip too) in blocks of whole lines.
COLL lines -- the bulk of a big log -- never reach Python one by one: each block is cut into lines by
numpy, the candidates are split into space-separated tokens by Arrow, and every field is taken by
position relative to the ``opCount`` token and validated by vectorised kernels. Only lines that fail
that check (other messages, interleaved or damaged lines) go through the per-line Python path with the
FORMATS.md regexes. Nothing raises on bad lines: they are counted and summarised in one diagnostic.
"""

from __future__ import annotations

import re
import struct
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.diagnostics import Diagnostic, TraceError
from tracekit.schema import COLLECTIVES, TOPOLOGY, ParsedFile, table

from .source import iter_blocks

PARSER_VERSION = "1"
FORMAT = "nccl-log"

#: Longest line kept whole (NCCL itself cuts at 1 KB; launcher prefixes add a little). Longer runs
#: without a newline are cut here and counted, so a binary file cannot exhaust memory.
MAX_LINE = 64 << 10
#: NCCL <= 2.28 formats a line into a 1024-byte buffer: a line this long was cut by NCCL.
NCCL_LINE_LIMIT = 1023
#: Individual diagnostics for the first WARN lines; the rest are counted in one summary.
MAX_WARN_DIAGNOSTICS = 20
#: Line numbers quoted in the summary of unparsed lines.
MAX_EXAMPLES = 5
#: An orphan body is paired with a widowed prefix at most this many lines earlier.
WIDOW_WINDOW = 8

# ---------------------------------------------------------------------------------------------------
# vocabulary

#: ``ncclDataType_t`` ids -> (tracekit name, element size in bytes); unchanged since NCCL 2.0
#: (bfloat16 from 2.10, fp8 from 2.24 only add ids).
DTYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2),
    10: ("float8e4m3", 1), 11: ("float8e5m2", 1),
}

DTYPE_SIZES: dict[str, int] = dict(DTYPES.values())

#: NCCL COLL names -> tracekit op names; other names are lower-cased.
OPS: dict[str, str] = {
    "AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv",
    "AlltoAll": "all_to_all", "AllToAll": "all_to_all", "Gather": "gather", "Scatter": "scatter",
}
#: ops whose ``bytes`` (S) is n * count * size: count is per rank / per peer.
FULL_BUFFER_OPS = ("allgather", "reduce_scatter", "all_to_all", "gather", "scatter")
#: ops whose ``root`` field is meaningful (root of rooted collectives, peer of point-to-point).
ROOTED_OPS = ("broadcast", "reduce", "gather", "scatter", "send", "recv")

ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS = ("LL", "LL128", "SIMPLE")
_ALGO_NAMES = {a.replace("_", "").lower(): a for a in ALGOS}
_PROTO_NAMES = {p.lower(): p for p in PROTOS}


def _norm_op(name: str) -> str:
    return OPS.get(name, name.lower())


def _norm_algo(text: str | None) -> str | None:
    if text is None:
        return None
    if text.isdigit():
        i = int(text)
        return ALGOS[i] if i < len(ALGOS) else f"algo{i}"
    return _ALGO_NAMES.get(text.replace("_", "").lower(), text.upper())


def _norm_proto(text: str | None) -> str | None:
    if text is None:
        return None
    if text.isdigit():
        i = int(text)
        return PROTOS[i] if i < len(PROTOS) else f"proto{i}"
    return _PROTO_NAMES.get(text.lower(), text.upper())


# ---------------------------------------------------------------------------------------------------
# grammar (FORMATS.md 2.2-2.6), for the per-line path

#: The anchor ``host:pid:tid [dev] [ms] [file:line [(func)]] NCCL LEVEL``. The host must start the
#: line or follow a non-host character, so a search never backtracks through a word.
ANCHOR = re.compile(
    r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]*+):(?P<pid>\d++):(?P<tid>\d++) (?:\[(?P<dev>-?\d+)\] )?"
    r"(?:(?P<ms>\d+\.\d+) )?(?:(?P<loc>[^\s()]+:\d+) (?:\((?P<func>[^)]*)\) )?)?NCCL (?P<level>[A-Z]+)\b ?")
VERSION = re.compile(r"NCCL version (?P<ver>\d+\.\d+\.\d+)(?P<suffix>[-+]\S*)?")
INIT = re.compile(
    r"(?:\[Rank (?P<grank>\d+)\] )?(?:(?P<api>nccl\w+) )?comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) "
    r"rank (?P<rank>-?\d+) n[rR]anks (?P<nranks>-?\d+) cudaDev (?P<cudadev>-?\d+)"
    r"(?: nvmlDev (?P<nvmldev>-?\d+))?(?: busId (?P<busid>[0-9a-fA-F]+))?(?: parent (?P<parent>\S+))?"
    r"(?: (?P<countkind>splitCount|childCount) (?P<splitcount>-?\d+))?"
    r"(?: color (?P<color>-?\d+) key (?P<key>-?\d+))?(?: commId 0x(?P<commid>[0-9a-fA-F]+))?"
    r"\s*- (?P<what>Init START|Init COMPLETE|Destroy COMPLETE|Abort COMPLETE)")
NNODES = re.compile(
    r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
    r"localRanks (?P<lranks>\d+) localRank (?P<lrank>\d+)")
CONN = re.compile(
    r"(?P<kw>Ring|Channel|CollNet) (?P<ch>\d+)(?:/(?P<conn>\d+))? : "
    r"(?P<src>\d+)(?:\[(?P<sdev>[0-9a-fA-F]+)\])?(?: -> (?P<dst>\d+)(?:\[(?P<ddev>[0-9a-fA-F]+)\])?)?"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$")
RING = re.compile(r"^(?:Ring|Channel) (?P<ch>\d+)(?:/(?P<n>\d+))? :(?P<ranks>(?: +\d+)*) *$")
TREE_ITEM = re.compile(r"\[(?P<ch>\d+)\] (?P<tree>\S+)")
CHANNEL_COUNT = re.compile(r"(?P<n>\d+) (?P<kind>coll|collnet|nvls|p2p) channels(?P<pp> per peer)?")
COUNTS_COMM = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+)")
TUNING = re.compile(
    r"^\s*(?:(?P<op>[A-Za-z]+)(?P<sym> \[Symmetric\])?: )?\s*(?P<bytes>\d+) Bytes -> "
    r"(?:Algo (?P<algo>\S+) proto (?P<proto>\S+)(?: time (?P<time>\S+))?"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?|Kernel (?P<kernel>\S+))(?P<tail>.*)$")
COLL = re.compile(
    r"(?P<op>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) "
    r"root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)(?P<rest>.*)$")
REST = re.compile(
    r"^(?: task (?P<task>\d+) globalrank (?P<grank>\d+))?(?P<tail>.*?)"
    r"(?: ?\[repeated (?P<rep>\d+)x across cluster\])?\s*$")
NETWORK = re.compile(r"^(?:Using network (?P<net>\S+)|NET/(?P<net2>[^\s:]+) ?: Using)")
UNWIND = re.compile(r"^\S+\.(?:cc|cu|h|c|cpp):\d+ -> \d+")
WATCHDOG = re.compile(
    r"ProcessGroupNCCL\.cpp:\d+\]\s*\[Rank (?P<rank>\d+)\]\s*(?P<what>.*?WorkNCCL\((?P<args>[^)]*)\).*)$")
NCCL_TESTS = re.compile(r"^#\s+Rank\s+(?P<rank>\d+)\s+Group\s+\d+\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
                        r"\s+device\s+(?P<dev>\d+)")
RAY_REPEAT = re.compile(r"\[repeated (?P<n>\d+)x across cluster\]")
#: a 2.26+ timestamp at the end of a prefix: ``[...]`` with a digit and one of ``-:.`` (or a long epoch)
TIMESTAMP = re.compile(r"\[(?P<ts>[^\[\]]*\d[-:./][^\[\]]*|\d{9,}[^\[\]]*)\] ?$")

#: Sniffer: the anchor or a version line anywhere in the head.
_SNIFF = re.compile(
    rb"(?:^|[\s:\[\]])[^\s:\[\]]*:\d+:\d+ (?:\[-?\d+\] )?(?:\d+\.\d+ )?(?:[^\s()]+:\d+ (?:\([^)]*\) )?)?"
    rb"NCCL [A-Z]+\b|NCCL version \d+\.\d+\.\d+")


def sniff(head: bytes) -> bool:
    """True for text whose lines carry the NCCL anchor (``host:pid:tid [dev] NCCL INFO``), also behind
    launcher prefixes, or an ``NCCL version`` line; false for JSON and binary data."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text or text[:1] == b"{" or re.match(rb"\[\s*[{\]\"]", text):
        return False
    if b"\x00" in text[:4096]:
        return False
    return _SNIFF.search(head) is not None


# ---------------------------------------------------------------------------------------------------
# reading whole lines in blocks


@dataclass
class _Damage:
    """What happened while reading the bytes (not the lines)."""

    overlong: list[int] = field(default_factory=list)  # line numbers cut at MAX_LINE
    read_error: TraceError | None = None


def _line_blocks(path: str, damage: _Damage) -> Any:
    """Yield ``(first_line_number, data)``: the decompressed input as blocks of whole lines, each
    ending with ``\\n``. A run of more than MAX_LINE bytes without a newline is cut there (the rest of
    that line is dropped and its number recorded). A corrupt gzip stream ends the input (recorded)."""
    carry = b""
    skipping = False  # inside the dropped tail of an overlong line
    line_no = 1
    try:
        for _, block in iter_blocks(path):
            if skipping:
                nl = block.find(b"\n")
                if nl < 0:
                    continue
                block = block[nl + 1:]
                skipping = False
            data = carry + block if carry else block
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                if len(carry) > MAX_LINE:
                    damage.overlong.append(line_no)
                    yield line_no, carry[:MAX_LINE] + b"\n"
                    line_no += 1
                    carry = b""
                    skipping = True
                continue
            carry = data[cut + 1:]
            out = data[:cut + 1]
            if len(carry) > MAX_LINE:
                damage.overlong.append(line_no + out.count(b"\n"))
                out = out + carry[:MAX_LINE] + b"\n"
                carry = b""
                skipping = True
            yield line_no, out
            line_no += out.count(b"\n")
    except TraceError as exc:
        damage.read_error = exc
    if carry:
        yield line_no, carry + b"\n"


def _split_lines(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Line boundaries of a block: ``(data, starts, ends)``; ``ends`` excludes ``\\n`` and ``\\r``.
    Invalid UTF-8 is replaced (U+FFFD) so Arrow string kernels apply; newlines are unaffected."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = data.decode("utf-8", "replace").encode("utf-8")
    buf = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.empty(len(nl), np.int64)
    if len(nl):
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
    ends = nl.astype(np.int64)
    if len(nl):
        cr = (buf[np.maximum(nl - 1, 0)] == 13) & (nl > starts)
        ends -= cr
    return data, starts, ends


def _slices(data: bytes, starts: np.ndarray, ends: np.ndarray) -> pa.StringArray:
    """Zero-parse string array of ``data[starts[i]:ends[i]]`` (sorted, non-overlapping ranges): one
    array over the block with interleaved offsets, of which every other element is kept."""
    n = len(starts)
    if n == 0:
        return pa.array([], pa.string())
    off = np.empty(2 * n + 1, np.int32 if len(data) < (1 << 31) else np.int64)
    off[0:2 * n:2] = starts
    off[1:2 * n:2] = ends
    off[2 * n] = len(data)
    typ = pa.string() if off.dtype == np.int32 else pa.large_string()
    both = pa.Array.from_buffers(typ, 2 * n, [None, pa.py_buffer(off), pa.py_buffer(data)])
    return both.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


# ---------------------------------------------------------------------------------------------------
# fast path: COLL lines, columnar

_KEYWORDS = ((2, "sendbuff"), (4, "recvbuff"), (6, "count"), (8, "datatype"), (10, "op"), (12, "root"),
             (14, "comm"), (17, "stream"), (-2, "INFO"), (-3, "NCCL"))

#: columns of the raw COLL table (fast and per-line paths alike)
_RAW_COLL = pa.schema([
    ("line", pa.int64()), ("sub", pa.int32()), ("host", pa.string()), ("pid", pa.int64()),
    ("tid", pa.int64()), ("device", pa.int32()), ("op_raw", pa.string()), ("opcount", pa.string()),
    ("in_place", pa.bool_()), ("count", pa.int64()), ("dtype_id", pa.int32()), ("redop", pa.int32()),
    ("root", pa.int32()), ("comm", pa.string()), ("nranks", pa.int32()), ("stream", pa.string()),
    ("prefix", pa.string()), ("rest", pa.string()), ("orphan", pa.bool_()),
])


def _np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def _str_offsets(arr: pa.Array) -> np.ndarray:
    """The value offsets of a string array (absolute positions in its data buffer), as int64."""
    dt = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    raw = np.frombuffer(arr.buffers()[1], dt)
    return raw[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)


def _digits(arr: pa.Array) -> np.ndarray:
    """Mask of tokens that are 1..18 ASCII digits (castable to int64 without overflow)."""
    return _np(pc.and_(pc.utf8_is_digit(arr), pc.less_equal(pc.utf8_length(arr), 18)))


def _fast_coll(data: bytes, starts: np.ndarray, ends: np.ndarray, lines: pa.StringArray,
               cand: np.ndarray, line0: int) -> tuple[pa.Table | None, np.ndarray]:
    """Parse the candidate lines ``cand`` (indices into ``lines``) that are well-formed COLL lines with
    exactly one anchor. Returns the raw COLL table and the mask (over ``cand``) of the lines done."""
    done = np.zeros(len(cand), bool)
    if len(cand) == 0:
        return None, done
    cl = lines if len(cand) == len(lines) else lines.take(pa.array(cand))
    one_anchor = _np(pc.equal(pc.count_substring(cl, "NCCL "), 1))
    toks = pc.split_pattern(cl, " ")
    loff = _np(toks.offsets).astype(np.int64)
    flat = toks.values
    p = np.flatnonzero(_np(pc.equal(flat, "opCount")))
    if len(p) == 0:
        return None, done
    row = np.searchsorted(loff, p, side="right") - 1
    per_row = np.bincount(row, minlength=len(cand))
    ok = (per_row[row] == 1) & one_anchor[row] & (p - 4 >= loff[row]) & (p + 18 < loff[row + 1])
    p, row = p[ok], row[ok]

    def tk(idx: np.ndarray) -> pa.Array:
        return flat.take(pa.array(idx))

    ok = np.ones(len(p), bool)
    for d, kw in _KEYWORDS:
        ok &= _np(pc.equal(tk(p + d), kw))
    p, row = p[ok], row[ok]
    opt = tk(p - 1)
    nr = tk(p + 16)
    ok = _np(pc.ends_with(opt, ":")) & _np(pc.starts_with(nr, "[nranks=")) & _np(pc.ends_with(nr, "]"))
    opname = pc.utf8_slice_codeunits(opt, 0, -1)
    nrv = pc.utf8_slice_codeunits(nr, 8, -1)
    ok &= _np(pc.utf8_is_alpha(opname)) & _digits(nrv)
    for d in (7, 9, 11):
        ok &= _digits(tk(p + d))
    ok &= _digits(pc.utf8_ltrim(tk(p + 13), "-"))
    devt = tk(p - 4)
    has_dev = _np(pc.starts_with(devt, "[")) & _np(pc.ends_with(devt, "]"))
    devv = pc.utf8_slice_codeunits(devt, 1, -1)
    has_dev &= _digits(pc.utf8_ltrim(devv, "-"))
    aidx = np.where(has_dev, p - 5, p - 4)
    ok &= aidx >= loff[row]
    aidx = np.where(ok, aidx, p - 4)
    parts = pc.split_pattern(tk(aidx), ":", max_splits=3, reverse=True)
    poff = _np(parts.offsets).astype(np.int64)
    plen = poff[1:] - poff[:-1]
    pv = parts.values
    ok &= plen >= 3
    last = np.where(plen >= 3, poff[1:] - 1, poff[:-1])
    tid_s = pv.take(pa.array(last))
    pid_s = pv.take(pa.array(np.maximum(last - 1, 0)))
    host_s = pv.take(pa.array(np.maximum(last - 2, 0)))
    ok &= _digits(tid_s) & _digits(pid_s)
    ok &= ~(_np(pc.match_substring(host_s, "[")) | _np(pc.match_substring(host_s, "]")))
    if not ok.any():
        return None, done
    sel = np.flatnonzero(ok)
    p, row, aidx, has_dev = p[sel], row[sel], aidx[sel], has_dev[sel]
    plen, poff = plen[sel], poff[:-1][sel]
    selp = pa.array(sel)

    def field_(arr: pa.Array) -> pa.Array:
        return arr.take(selp)

    glued_len = np.zeros(len(p), np.int64)
    gl = plen == 4
    if gl.any():
        glued = pv.take(pa.array(poff[gl]))
        glued_len[gl] = _np(pc.binary_length(glued)) + 1  # + the ':' after it
    fo = _str_offsets(flat)
    first = loff[row]

    def char_pos(j: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Byte position of token ``j`` in its line (tokens are separated by one space)."""
        return fo[j] - fo[first] + (j - first)

    line_idx = cand[row]
    lstart = starts[line_idx]
    plen_chars = char_pos(aidx, first) + glued_len
    prefix = pa.nulls(len(p), pa.string())
    has_prefix = plen_chars > 0
    if has_prefix.any():
        hp = np.flatnonzero(has_prefix)
        vals = _slices(data, lstart[hp], lstart[hp] + plen_chars[hp])
        prefix = pc.replace_with_mask(prefix, pa.array(has_prefix), vals)
    rest = pa.nulls(len(p), pa.string())
    has_rest = loff[row + 1] > p + 19
    if has_rest.any():
        hr = np.flatnonzero(has_rest)
        rs = lstart[hr] + char_pos(p[hr] + 18, first[hr]) + _np(pc.binary_length(tk(p[hr] + 18)))
        vals = _slices(data, rs, ends[line_idx[hr]])
        rest = pc.replace_with_mask(rest, pa.array(has_rest), vals)
    dv = _np(pc.cast(pc.if_else(pa.array(has_dev), field_(devv), "0"), pa.int32()))
    dev = pa.array(dv, pa.int32(), mask=~has_dev)
    tbl = pa.table({
        "line": pa.array(line0 + line_idx, pa.int64()),
        "sub": pa.array(np.zeros(len(p), np.int32)),
        "host": field_(host_s),
        "pid": pc.cast(field_(pid_s), pa.int64()),
        "tid": pc.cast(field_(tid_s), pa.int64()),
        "device": dev,
        "op_raw": field_(opname),
        "opcount": tk(p + 1),
        "in_place": pc.equal(tk(p + 3), tk(p + 5)),
        "count": pc.cast(tk(p + 7), pa.int64()),
        "dtype_id": pc.cast(tk(p + 9), pa.int32()),
        "redop": pc.cast(tk(p + 11), pa.int32()),
        "root": pc.cast(tk(p + 13), pa.int32()),
        "comm": tk(p + 15),
        "nranks": pc.cast(field_(nrv), pa.int32()),
        "stream": tk(p + 18),
        "prefix": prefix,
        "rest": rest,
        "orphan": pa.array(np.zeros(len(p), bool)),
    }, schema=_RAW_COLL)
    done[row] = True
    return tbl, done


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


def _i(s: str | None) -> int | None:
    return int(s) if s is not None else None


def _version_tuple(v: str) -> tuple[int, int, int]:
    a, b, c = v.split(".")[:3]
    return int(a), int(b), int(c)


class _Parser:
    """State of one parse: accumulators of the per-line path and the fast-path tables."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.diagnostics: list[Diagnostic] = []
        self.coll_tables: list[pa.Table] = []
        self.slow_coll: list[dict[str, Any]] = []
        self.procs: dict[tuple[str, int], _Proc] = {}
        self.comms: list[_Comm] = []
        self.cur_comm: dict[tuple[str | None, int | None, str], _Comm] = {}
        self.conns: list[dict[str, Any]] = []
        self.graph: list[dict[str, Any]] = []
        self.pending_ctx: list[tuple[str, int, dict[str, Any]]] = []  # (kind, line, row)
        self.tuning: list[dict[str, Any]] = []
        self.warnings: list[dict[str, Any]] = []
        self.watchdog: list[dict[str, Any]] = []
        self.versions: dict[str, int] = {}
        self.networks: list[str] = []
        self.widows: deque[tuple[int, str, int]] = deque()
        self.last_msg: dict[str, Any] | None = None
        self.era_lo: tuple[int, int, int] = (2, 0, 0)
        self.era_hi: tuple[int, int, int] = (99, 0, 0)
        self.counts: dict[str, int] = defaultdict(int)
        self.unparsed_examples: list[int] = []
        self.cut_examples: list[int] = []

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

    # -- blocks ----------------------------------------------------------------------------------
    def block(self, line0: int, data: bytes) -> None:
        data, starts, ends = _split_lines(data)
        n = len(starts)
        self.counts["lines"] += n
        lines = _slices(data, starts, ends)
        cand_mask = _np(pc.match_substring(lines, " opCount "))
        cand = np.flatnonzero(cand_mask)
        tbl, done = _fast_coll(data, starts, ends, lines, cand, line0)
        if tbl is not None and tbl.num_rows:
            self.coll_tables.append(tbl)
            self.counts["nccl_lines"] += tbl.num_rows
        slow = np.ones(n, bool)
        slow[cand[done]] = False
        idx = np.flatnonzero(slow)
        if len(idx) == 0:
            return
        lens = ends[idx] - starts[idx]
        texts = (lines if len(idx) == n else lines.take(pa.array(idx))).to_pylist()
        for i, text, ln in zip(idx.tolist(), texts, lens.tolist(), strict=True):
            self.line(line0 + i, text, ln)

    # -- one line --------------------------------------------------------------------------------
    def line(self, no: int, text: str, nbytes: int) -> None:
        if not text or text.isspace():
            self.counts["blank_lines"] += 1
            return
        anchors = list(ANCHOR.finditer(text)) if "NCCL" in text else []
        if not anchors:
            self.no_anchor(no, text)
            return
        if nbytes - anchors[0].start() >= NCCL_LINE_LIMIT:
            self.counts["cut_lines"] += 1
            if len(self.cut_examples) < MAX_EXAMPLES:
                self.cut_examples.append(no)
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
            self.message(no, k, prefix if k == 0 else "", a, host, pid, body.rstrip())

    def no_anchor(self, no: int, text: str) -> None:
        """A line without ``host:pid:tid``: version line, continuation, orphan body, PyTorch or
        nccl-tests output, or something unparsable."""
        if text[0] in " \t" and self.last_msg is not None and "opCount" not in text:
            self.counts["continuation_lines"] += 1
            self.last_msg["message"] = self.last_msg["message"] + "\n" + text.strip()
            return
        m = VERSION.search(text)
        if m:
            self.version(m, None)
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
        m = WATCHDOG.search(text)
        if m:
            self.watchdog_line(no, m, text)
            return
        m = NCCL_TESTS.search(stripped.lstrip("> "))
        if m:
            p = self.proc(m["host"], int(m["pid"]))
            p.tests_rank = int(m["rank"])
            p.devices.add(int(m["dev"]))
            return
        self.unparsed(no)

    def take_widow(self, no: int) -> tuple[str | None, int | None]:
        while self.widows and self.widows[0][0] < no - WIDOW_WINDOW:
            self.widows.popleft()
        if self.widows:
            _, host, pid = self.widows.popleft()
            return host, pid
        return None, None

    def message(self, no: int, sub: int, prefix: str, a: re.Match[str], host: str, pid: int,
                body: str) -> None:
        level = a["level"]
        proc = self.proc(host, pid)
        dev = a["dev"]
        if dev is not None:
            proc.devices.add(int(dev))
        self.last_msg = None
        if level not in ("INFO", "TRACE", "CALL", "VERSION"):
            self.warn(no, prefix, a, host, pid, body)
            return
        if " opCount " in body:
            m = COLL.match(body)
            if m:
                self.coll(no, sub, prefix, m, host, pid, a["tid"], dev, orphan=False)
            else:
                self.unparsed(no)
            return
        if body.startswith("NCCL version"):
            m = VERSION.match(body)
            if m:
                self.version(m, proc)
                return
        if " - Init " in body or " - Destroy " in body or " - Abort " in body:
            m = INIT.search(body)
            if m:
                self.init(no, m, host, pid)
            else:
                self.unparsed(no)
            return
        if " via " in body:
            m = CONN.match(body)
            if m:
                self.conn(no, m, host, pid, orphan=False)
                return
        if body.startswith(("Channel ", "Ring ")):
            m = RING.match(body)
            if m:
                self.ring(no, m, host, pid, a.end() - a.start() + len(body))
                return
        if body.startswith("Trees"):
            self.trees(no, body, host, pid)
            return
        if " Bytes -> " in body:
            m = TUNING.match(body)
            if m:
                self.tuning_line(no, m, host, pid)
            else:
                self.unparsed(no)
            return
        if "nNodes" in body:
            m = NNODES.search(body)
            if m:
                self.nnodes(no, m, host, pid)
                return
        if " channels" in body and "coll channels" in body:
            self.channel_counts(no, body, host, pid)
            return
        m = NETWORK.match(body)
        if m:
            net = m["net"] or m["net2"]
            if net not in proc.network:
                proc.network.append(net)
            if net not in self.networks:
                self.networks.append(net)
            return
        if UNWIND.match(body):
            self.counts["unwind_lines"] += 1
            return
        self.counts["ignored_lines"] += 1

    # -- messages --------------------------------------------------------------------------------
    def version(self, m: re.Match[str], proc: _Proc | None) -> None:
        v = m["ver"]
        self.versions[v] = self.versions.get(v, 0) + 1
        if proc is not None:
            proc.version = v

    def warn(self, no: int, prefix: str, a: re.Match[str], host: str, pid: int, body: str) -> None:
        self.counts["warn_lines"] += 1
        ts = TIMESTAMP.search(prefix)
        if ts:
            self.era(lo=(2, 26, 0))
        row = {"line": no, "host": host, "pid": pid, "tid": int(a["tid"]),
               "device": _i(a["dev"]), "level": a["level"], "loc": a["loc"], "func": a["func"],
               "message": body.strip(), "log_time": ts["ts"] if ts else None}
        self.warnings.append(row)
        self.last_msg = row

    def coll(self, no: int, sub: int, prefix: str, m: re.Match[str], host: str | None,
             pid: int | None, tid: str | None, dev: str | None, *, orphan: bool) -> None:
        count = int(m["count"])
        self.slow_coll.append({
            "line": no, "sub": sub, "host": host, "pid": pid, "tid": _i(tid), "device": _i(dev),
            "op_raw": m["op"], "opcount": m["opcount"], "in_place": m["sendbuff"] == m["recvbuff"],
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
        # era evidence
        if what == "Init START":
            self.era(lo=(2, 18, 3))
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
            cur.end_line = no
            cur.end = "destroy" if what.startswith("Destroy") else "abort"
            if commid and cur.comm_id != commid:
                if cur.comm_id_source == "derived":
                    self.counts["derived_mismatch"] += 1
                cur.comm_id, cur.comm_id_source = commid, "log"
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
        if kw == "Ring":
            self.era(hi=(2, 6, 99))
        elif kw == "Channel":
            self.era(lo=(2, 14, 0) if conn is not None else (2, 7, 0), hi=None if conn else (2, 13, 99))
        row = {"line": no, "host": host, "pid": pid, "channel": int(m["ch"]), "conn": _i(conn),
               "src": int(m["src"]), "dst": _i(m["dst"]), "src_dev": m["sdev"], "dst_dev": m["ddev"],
               "direction": m["dir"], "detail": m["via"].strip(), "orphan": orphan}
        self.conns.append(row)

    def ring(self, no: int, m: re.Match[str], host: str, pid: int, nbytes: int) -> None:
        self.graph.append({"line": no, "host": host, "pid": pid, "kind": "ring", "channel": int(m["ch"]),
                           "nchannels": _i(m["n"]), "value": " ".join(m["ranks"].split()),
                           "cut": nbytes >= NCCL_LINE_LIMIT})

    def trees(self, no: int, body: str, host: str, pid: int) -> None:
        items = TREE_ITEM.findall(body)
        if not items:
            self.unparsed(no)
            return
        if "|" in body:
            self.era(hi=(2, 6, 99))
        for ch, tree in items:
            self.graph.append({"line": no, "host": host, "pid": pid, "kind": "tree", "channel": int(ch),
                               "nchannels": None, "value": tree, "cut": len(body) >= NCCL_LINE_LIMIT - 40})

    def tuning_line(self, no: int, m: re.Match[str], host: str, pid: int) -> None:
        algo = m["algo"]
        if m["kernel"] is not None:
            self.era(lo=(2, 27, 0))
        elif algo is not None and algo.isdigit():
            self.era(lo=(2, 20, 0), hi=(2, 23, 99))
        else:
            self.era(lo=(2, 24, 0))
        cm = COUNTS_COMM.search(m["tail"] or "")
        t = m["time"]
        try:
            time_us = float(t) if t is not None else None
        except ValueError:
            time_us = None
        self.tuning.append({
            "line": no, "host": host, "pid": pid, "op": _norm_op(m["op"]) if m["op"] else None,
            "bytes": int(m["bytes"]),
            "algorithm": "SYMMETRIC" if m["kernel"] is not None else _norm_algo(algo),
            "protocol": _norm_proto(m["proto"]), "channel_lo": _i(m["lo"]), "channel_hi": _i(m["hi"]),
            "time_us": time_us, "kernel": m["kernel"], "comm": cm["comm"] if cm else None})

    def nnodes(self, no: int, m: re.Match[str], host: str, pid: int) -> None:
        c = self.cur_comm.get((host, pid, m["comm"]))
        if c is None or c.end_line is not None:
            return
        c.nnodes, c.local_ranks, c.local_rank = int(m["nnodes"]), int(m["lranks"]), int(m["lrank"])

    def channel_counts(self, no: int, body: str, host: str, pid: int) -> None:
        vals: dict[str, int] = {}
        for m in CHANNEL_COUNT.finditer(body):
            vals[m["kind"] + ("_per_peer" if m["pp"] else "")] = int(m["n"])
        cm = COUNTS_COMM.search(body)
        row = {"line": no, "host": host, "pid": pid, "kind": "counts", "vals": vals,
               "comm": cm["comm"] if cm else None}
        self.pending_ctx.append(("counts", no, row))

    def watchdog_line(self, no: int, m: re.Match[str], text: str) -> None:
        args = dict(kv.split("=", 1) for kv in m["args"].split(", ") if "=" in kv)

        def num(k: str) -> int | None:
            v = args.get(k, "")
            return int(v) if v.isdigit() else None

        self.watchdog.append({"line": no, "rank": int(m["rank"]), "seq_num": num("SeqNum"),
                              "op_type": args.get("OpType"), "numel_in": num("NumelIn"),
                              "numel_out": num("NumelOut"), "timeout_ms": num("Timeout(ms)"),
                              "text": text.strip()})


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
# putting it together


def parse(path: str) -> ParsedFile:
    """Parse one NCCL debug log (plain or gzip) into a :class:`ParsedFile` (see the module docstring).

    Raises :class:`TraceError` when the file cannot be read, is empty, or holds no NCCL line."""
    st = _Parser(path)
    damage = _Damage()
    total = 0
    for line0, data in _line_blocks(path, damage):
        total += len(data)
        st.block(line0, data)
    if damage.read_error is not None and total == 0:
        raise damage.read_error
    if total == 0:
        raise TraceError(path, "empty file")
    has_nccl = (st.counts["nccl_lines"] or st.versions or st.counts["orphan_lines"])
    if not has_nccl:
        raise TraceError(path, "no NCCL log lines found (expected lines like "
                         "'host:pid:tid [dev] NCCL INFO ...' from NCCL_DEBUG=INFO)", line=1)
    return _finish(st, damage)


def _finish(st: _Parser, damage: _Damage) -> ParsedFile:
    path = st.path
    diags = st.diagnostics
    comms = _resolve_comm_ids(st)
    raw = _prepare_raw(st, comms)
    procs_df, world = _process_ranks(st)
    coll, calls = _collectives(raw, comms, procs_df, world)
    topo, conns = _topology(st, comms, coll, procs_df)
    graph = _graph(st, comms, coll)
    tuning = _attach_tuning(st, coll)
    coll, calls = _apply_tuning(coll, calls, tuning)
    _check_sizes(st, coll)
    _counts_diagnostics(st, damage, coll)

    collectives = table(COLLECTIVES, {
        "rank": coll["rank"].to_arrow(), "collective_id": coll["collective_id"].to_arrow(),
        "pg": coll["pg"].to_arrow(), "seq": coll["seq"].to_arrow(), "op": coll["op"].to_arrow(),
        "dtype": coll["dtype"].to_arrow(), "count": coll["count"].to_arrow(),
        "bytes": coll["bytes"].to_arrow(), "nranks": coll["nranks"].to_arrow(),
        "peer": coll["peer"].to_arrow(), "algorithm": coll["algorithm"].to_arrow(),
        "protocol": coll["protocol"].to_arrow(), "lane": coll["lane"].to_arrow(),
        "source": pa.array([FORMAT] * coll.height, pa.string()),
    })
    comm_rows = _comms_table(comms, coll)
    meta = _meta(st, comms, procs_df, world)
    tables = {
        "nccl_calls": calls.to_arrow(),
        "nccl_comms": comm_rows,
        "nccl_connections": conns,
        "nccl_graph": graph,
        "nccl_tuning": tuning.to_arrow(),
        "nccl_warnings": _rows_table(st.warnings, _WARN_SCHEMA),
        "pytorch_watchdog": _rows_table(st.watchdog, _WATCHDOG_SCHEMA),
    }
    tables = {k: _plain(v) for k, v in tables.items()}
    complete = damage.read_error is None
    if damage.read_error is not None:
        diags.append(Diagnostic(path, f"input ends early: {damage.read_error.message}; kept the "
                                f"{st.counts['lines']} lines before it", offset=damage.read_error.offset))
    return ParsedFile(path=path, format=FORMAT, collectives=collectives, topology=topo, tables=tables,
                      meta=meta, diagnostics=diags, complete=complete)


def _plain(t: pa.Table) -> pa.Table:
    """Arrow tables with plain (not large/view/dictionary) string columns, for a stable contract."""
    cols = []
    for f in t.schema:
        col = t.column(f.name)
        if pa.types.is_large_string(f.type) or pa.types.is_string_view(f.type) or (
                pa.types.is_dictionary(f.type)):
            col = col.cast(pa.string())
        elif pa.types.is_large_list(f.type):
            col = col.cast(pa.list_(pa.string()))
        cols.append(col)
    return pa.Table.from_arrays(cols, names=t.column_names)


_WARN_SCHEMA = pa.schema([("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()),
                          ("tid", pa.int64()), ("device", pa.int32()), ("level", pa.string()),
                          ("loc", pa.string()), ("func", pa.string()), ("message", pa.string()),
                          ("log_time", pa.string())])
_WATCHDOG_SCHEMA = pa.schema([("line", pa.int64()), ("rank", pa.int32()), ("seq_num", pa.int64()),
                              ("op_type", pa.string()), ("numel_in", pa.int64()),
                              ("numel_out", pa.int64()), ("timeout_ms", pa.int64()), ("text", pa.string())])


def _rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()


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
    for c in sorted(comms, key=lambda c: c.first_line):
        par = parent_of(c)
        if par is not None:
            c.parent_comm_id = par.comm_id
        if c.comm_id is not None:
            continue
        if par is not None and par.comm_id and c.split_count is not None and c.color is not None:
            c.comm_id, c.comm_id_source = split_comm_id(par.comm_id, c.split_count, c.color), "derived"
        elif c.init_line is not None or c.start_line is not None:
            k = synth_k[(c.host, c.pid, c.nranks)]
            synth_k[(c.host, c.pid, c.nranks)] += 1
            c.comm_id, c.comm_id_source = f"synthetic-n{c.nranks}-{k}", "synthetic"
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
    return comms


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
            rank, src = w.rank, "nccl-init"
        elif p.tests_rank is not None:
            rank, src = p.tests_rank, "nccl-tests"
        else:
            rank, src = None, None
        rows.append({"host": host, "pid": pid, "global_rank": rank, "rank_source": src,
                     "world_nranks": w.nranks if w else None})
    df = pl.DataFrame(rows, schema={"host": pl.String, "pid": pl.Int64, "global_rank": pl.Int32,
                                    "rank_source": pl.String, "world_nranks": pl.Int32})
    return df, world


_COMM_SCHEMA = {"host": pl.String, "pid": pl.Int64, "comm": pl.String, "first_line": pl.Int64,
                "comm_idx": pl.Int64, "comm_id": pl.String, "comm_rank": pl.Int32}


def _comm_frame(comms: list[_Comm]) -> pl.DataFrame:
    return pl.DataFrame([{"host": c.host, "pid": c.pid, "comm": c.comm, "first_line": c.first_line,
                          "comm_idx": c.idx, "comm_id": c.comm_id, "comm_rank": c.rank}
                         for c in comms if c.host is not None], schema=_COMM_SCHEMA)


def _raw_coll(st: _Parser) -> pl.DataFrame:
    parts = [pl.from_arrow(t) for t in st.coll_tables]
    if st.slow_coll:
        parts.append(pl.from_arrow(pa.Table.from_pylist(st.slow_coll, schema=_RAW_COLL)))
    if not parts:
        return pl.from_arrow(_RAW_COLL.empty_table())
    df = pl.concat(parts, how="vertical_relaxed", rechunk=True)
    return df.sort(["line", "sub"])


def _prepare_raw(st: _Parser, comms: list[_Comm]) -> pl.DataFrame:
    """All COLL rows in line order, orphans resolved, the RCCL/Ray tail and the prefix split; registers
    every process seen (devices, launcher prefixes, RCCL globalrank) on the parser state."""
    raw = _raw_coll(st)
    if raw.height == 0:
        return raw
    # orphans: identify the process by its comm pointer when one process in the file has it
    if raw["orphan"].any():
        raw = _resolve_orphans(raw, comms)
    # rest: RCCL task/globalrank, Ray repeats
    if raw["rest"].is_not_null().any():
        raw = raw.with_columns(pl.col("rest").str.extract_groups(REST.pattern).alias("_rest"))
        raw = raw.with_columns(
            pl.col("_rest").struct.field("task").cast(pl.Int64).alias("task"),
            pl.col("_rest").struct.field("grank").cast(pl.Int32).alias("rccl_globalrank"),
            pl.col("_rest").struct.field("rep").cast(pl.Int64).alias("repeated"),
        ).drop("_rest")
    else:
        raw = raw.with_columns(pl.lit(None, pl.Int64).alias("task"),
                               pl.lit(None, pl.Int32).alias("rccl_globalrank"),
                               pl.lit(None, pl.Int64).alias("repeated"))
    gr = raw.filter(pl.col("rccl_globalrank").is_not_null() & pl.col("host").is_not_null())
    for host, pid, g in gr.group_by(["host", "pid"]).agg(pl.col("rccl_globalrank").first()).iter_rows():
        st.proc(host, pid).rccl_globalrank = g
    st.counts["ray_repeats"] += int(raw["repeated"].fill_null(0).sum())
    # prefix: launcher part and 2.26+ timestamp
    if raw["prefix"].is_not_null().any():
        raw = raw.with_columns(
            pl.col("prefix").str.extract(TIMESTAMP.pattern, 1).alias("log_time"),
            pl.col("prefix").str.replace(TIMESTAMP.pattern, "").alias("prefix"),
        ).with_columns(pl.when(pl.col("prefix") == "").then(None).otherwise(pl.col("prefix")).alias("prefix"))
        if raw["log_time"].is_not_null().any():
            st.era(lo=(2, 26, 0))
    else:
        raw = raw.with_columns(pl.lit(None, pl.String).alias("log_time"))
    named = raw.filter(pl.col("host").is_not_null())
    for host, pid in named.select("host", "pid").unique().iter_rows():
        st.proc(host, pid)
    for host, pid, pre in named.filter(pl.col("prefix").is_not_null()).group_by(["host", "pid"]).agg(
            pl.col("prefix").unique().sort().head(4)).iter_rows():
        proc = st.proc(host, pid)
        for x in pre:
            if x not in proc.prefixes and len(proc.prefixes) < 4:
                proc.prefixes.append(x)
    for host, pid, devs in named.filter(pl.col("device").is_not_null()).group_by(["host", "pid"]).agg(
            pl.col("device").unique()).iter_rows():
        st.proc(host, pid).devices.update(devs)
    return raw


def _collectives(raw: pl.DataFrame, comms: list[_Comm], procs: pl.DataFrame,
                 world: dict[tuple[str | None, int | None], _Comm]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The collectives rows (plus join keys) and the aligned ``nccl_calls`` table."""
    if raw.height == 0:
        return (pl.DataFrame(schema={**_COLL_SCHEMA, "comm": pl.String, "host": pl.String, "pid": pl.Int64,
                                     "line": pl.Int64, "comm_idx": pl.Int64, "comm_rank": pl.Int32}),
                pl.DataFrame(schema=_CALLS_SCHEMA))
    # join the communicator instance live at the line (pointers are reused after destroy)
    cf = _comm_frame(comms).sort("first_line")
    raw = raw.with_row_index("_row")
    joined = raw.sort("line").join_asof(
        cf, left_on="line", right_on="first_line", by=["host", "pid", "comm"], strategy="backward",
        check_sortedness=False).sort("_row")
    coll = joined.join(procs.select("host", "pid", "global_rank"), on=["host", "pid"], how="left",
                       maintain_order="left")
    # calls without a communicator id are sequenced per (process, comm pointer)
    coll = coll.with_columns(
        pl.coalesce(pl.col("comm_id"), pl.lit("ptr:") + pl.col("comm")).alias("_seqkey"))
    coll = coll.with_columns(
        pl.when(pl.col("host").is_not_null())
        .then(pl.int_range(pl.len()).over(["host", "pid", "_seqkey"]))
        .otherwise(None).cast(pl.Int64).alias("seq"))
    # op, dtype, bytes
    dt_names = pl.DataFrame({"dtype_id": list(DTYPES), "dtype": [v[0] for v in DTYPES.values()],
                             "_size": [v[1] for v in DTYPES.values()]},
                            schema={"dtype_id": pl.Int32, "dtype": pl.String, "_size": pl.Int64})
    op_map = pl.DataFrame({"op_raw": list(OPS), "op": list(OPS.values())})
    coll = coll.join(dt_names, on="dtype_id", how="left", maintain_order="left").join(
        op_map, on="op_raw", how="left", maintain_order="left")
    coll = coll.with_columns(
        pl.coalesce(pl.col("op"), pl.col("op_raw").str.to_lowercase()).alias("op"),
        pl.coalesce(pl.col("dtype"), pl.lit("unknown(") + pl.col("dtype_id").cast(pl.String) + pl.lit(")"))
        .alias("dtype"),
    )
    coll = coll.with_columns(
        (pl.col("count") * pl.col("_size") * pl.when(pl.col("op").is_in(FULL_BUFFER_OPS))
         .then(pl.col("nranks").cast(pl.Int64)).otherwise(1)).alias("bytes"),
        pl.when(pl.col("op").is_in(ROOTED_OPS)).then(pl.col("root")).otherwise(None).alias("peer_comm_rank"),
    )
    # peer -> global rank: identity in the process's world comm, else the member's Init line
    world_ids = pl.DataFrame(
        [{"host": h, "pid": p, "_world_id": c.comm_id} for (h, p), c in world.items()],
        schema={"host": pl.String, "pid": pl.Int64, "_world_id": pl.String})
    members = _members(comms, procs)
    coll = coll.join(world_ids, on=["host", "pid"], how="left", maintain_order="left").join(
        members, left_on=["comm_id", "peer_comm_rank"], right_on=["comm_id", "comm_rank"], how="left",
        maintain_order="left")
    in_world = (pl.col("comm_id") == pl.col("_world_id")) & pl.col("comm_id").is_not_null()
    coll = coll.with_columns(
        pl.when(in_world).then(pl.col("peer_comm_rank")).otherwise(pl.col("_member_grank")).alias("_pg"))
    coll = coll.with_columns(
        pl.col("_pg").is_not_null().alias("peer_is_global"),
        pl.coalesce(pl.col("_pg"), pl.col("peer_comm_rank")).cast(pl.Int32).alias("peer"),
        pl.coalesce(pl.col("rccl_globalrank"), pl.col("global_rank")).alias("global_rank"),
    )
    coll = coll.with_columns(
        pl.col("global_rank").is_not_null().alias("rank_is_global"),
        pl.coalesce(pl.col("global_rank"), pl.col("comm_rank")).cast(pl.Int32).alias("rank"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("collective_id"),
        pl.col("comm_id").alias("pg"),
        (pl.lit("nccl/stream ") + pl.col("stream")).alias("lane"),
        pl.col("opcount").str.to_integer(base=16, strict=False).alias("opcount"),
        pl.lit(None, pl.String).alias("algorithm"), pl.lit(None, pl.String).alias("protocol"),
    )
    calls = coll.select(list(_CALLS_SCHEMA))
    out = coll.select([*_COLL_SCHEMA, "comm", "host", "pid", "line", "comm_idx", "comm_rank"])
    return out, calls


_COLL_SCHEMA = {"rank": pl.Int32, "collective_id": pl.Int64, "pg": pl.String, "seq": pl.Int64,
                "op": pl.String, "dtype": pl.String, "count": pl.Int64, "bytes": pl.Int64,
                "nranks": pl.Int32, "peer": pl.Int32, "algorithm": pl.String, "protocol": pl.String,
                "lane": pl.String}
_CALLS_SCHEMA = {"collective_id": pl.Int64, "line": pl.Int64, "host": pl.String, "pid": pl.Int64,
                 "tid": pl.Int64, "device": pl.Int32, "comm": pl.String, "comm_rank": pl.Int32,
                 "global_rank": pl.Int32, "rank_is_global": pl.Boolean, "peer_comm_rank": pl.Int32,
                 "peer_is_global": pl.Boolean, "opcount": pl.Int64, "redop": pl.Int32,
                 "in_place": pl.Boolean, "prefix": pl.String, "log_time": pl.String, "orphan": pl.Boolean,
                 "task": pl.Int64, "repeated": pl.Int64}


def _members(comms: list[_Comm], procs: pl.DataFrame) -> pl.DataFrame:
    """(comm_id, rank in comm) -> global rank of the member process, from the Init lines in the file."""
    rows = [{"comm_id": c.comm_id, "comm_rank": c.rank, "host": c.host, "pid": c.pid}
            for c in comms if c.comm_id and c.rank is not None and c.host is not None]
    df = pl.DataFrame(rows, schema={"comm_id": pl.String, "comm_rank": pl.Int32, "host": pl.String,
                                    "pid": pl.Int64})
    df = df.join(procs.select("host", "pid", "global_rank"), on=["host", "pid"], how="left")
    df = df.filter(pl.col("global_rank").is_not_null()).group_by(["comm_id", "comm_rank"]).agg(
        pl.col("global_rank").first().alias("_member_grank"), pl.col("global_rank").n_unique().alias("_n"))
    return df.filter(pl.col("_n") == 1).drop("_n")


def _resolve_orphans(raw: pl.DataFrame, comms: list[_Comm]) -> pl.DataFrame:
    """An orphan COLL body names its comm pointer: when exactly one process in the file has a
    communicator at that pointer, the line is that process's. Otherwise a widowed prefix paired
    with it (kept in host/pid) is accepted only if that process has the pointer."""
    owners: dict[str, set[tuple[str | None, int | None]]] = defaultdict(set)
    for c in comms:
        if c.host is not None:
            owners[c.comm].add((c.host, c.pid))
    hosts, pids = raw["host"].to_list(), raw["pid"].to_list()
    orphan, comm = raw["orphan"].to_list(), raw["comm"].to_list()
    for i in np.flatnonzero(np.asarray(orphan, bool)).tolist():
        cands = owners.get(comm[i], set())
        if (hosts[i], pids[i]) in cands:
            continue
        if len(cands) == 1:
            hosts[i], pids[i] = next(iter(cands))
        else:
            hosts[i], pids[i] = None, None
    return raw.with_columns(pl.Series("host", hosts, pl.String), pl.Series("pid", pids, pl.Int64))


def _context_index(st: _Parser, coll: pl.DataFrame) -> dict[tuple[str, int], Any]:
    """Per process: its communicator instances and the (line, comm instance) of its COLL lines, to
    attribute lines that name no communicator (transport, ring, tree, channel counts)."""
    idx: dict[tuple[str, int], Any] = {}
    by_proc: dict[tuple[str | None, int | None], list[_Comm]] = defaultdict(list)
    for c in st.comms:
        by_proc[(c.host, c.pid)].append(c)
    lines_of: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    if coll.height:
        sub = coll.filter(pl.col("host").is_not_null()).select("host", "pid", "line", "comm_idx")
        for (host, pid), g in sub.group_by(["host", "pid"]):
            lines_of[(host, pid)] = (g["line"].to_numpy(), g["comm_idx"].fill_null(-1).to_numpy())
    for key in set(by_proc) | set(lines_of):
        idx[key] = (by_proc.get(key, []), lines_of.get(key))
    return idx


def _candidates(ctx: Any, line: int) -> list[_Comm]:
    """Communicators a nameless init-time line of a process may belong to, most likely first:

    1. one being initialised (Init START seen, COMPLETE not yet);
    2. in eras without START lines, the next comm to complete, if no COLL line of the process lies
       between (initialisation is synchronous: its lines run up to its COMPLETE);
    3. the comm of the process's last COLL line, if no Init completed since (connections made lazily
       at the first call);
    4. the last comm completed before the line."""
    if ctx is None:
        return []
    comms, colls = ctx
    out: list[_Comm] = []
    open_ = [c for c in comms if c.start_line is not None and c.start_line < line
             and (c.init_line is None or c.init_line > line) and (c.end_line is None or c.end_line > line)]
    out += sorted(open_, key=lambda c: -(c.start_line or 0))
    lines, cidx = colls if colls is not None else (np.empty(0, np.int64), np.empty(0, np.int64))
    k = int(np.searchsorted(lines, line)) - 1
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


def _dev_kind(st: _Parser) -> str | None:
    v = _file_version(st)
    lo, hi = (_version_tuple(v),) * 2 if v else (st.era_lo, st.era_hi)
    if hi <= (2, 4, 99):
        return "cudaDev"
    if lo >= (2, 18, 3):
        return "nvmlDev"
    if lo >= (2, 5, 0) and hi <= (2, 18, 2):
        return "busId"
    return None


def _family(via: str) -> str:
    parts = via.split("/")
    head = parts[0].strip().upper()
    if head == "NET" and len(parts) > 1:
        return "NET/" + parts[1].strip()
    return head


def _topology(st: _Parser, comms: list[_Comm], coll: pl.DataFrame,
              procs: pl.DataFrame) -> tuple[pa.Table, pa.Table]:
    ctx = _context_index(st, coll)
    granks = {(h, p): g for h, p, g in procs.select("host", "pid", "global_rank").iter_rows()}
    dev_kind = _dev_kind(st)
    rows, extra = [], []
    unattributed = 0
    for r in st.conns:
        logger = r["dst"] if r["direction"] == "receive" and r["dst"] is not None else r["src"]
        peer = r["src"] if logger == r["dst"] and r["direction"] == "receive" else r["dst"]
        chosen = None
        for c in _candidates(ctx.get((r["host"], r["pid"])), r["line"]):
            if c.rank == logger and c.nranks is not None and max(r["src"], r["dst"] or 0) < c.nranks:
                chosen = c
                break
        if chosen is None:
            unattributed += 1
        rows.append({"comm_id": chosen.comm_id if chosen else None, "rank": logger,
                     "nranks": chosen.nranks if chosen else None, "channel": r["channel"], "peer": peer,
                     "direction": r["direction"], "transport": _family(r["detail"]),
                     "detail": r["detail"], "host": r["host"]})
        extra.append({"line": r["line"], "host": r["host"], "pid": r["pid"],
                      "comm": chosen.comm if chosen else None, "channel": r["channel"], "conn": r["conn"],
                      "src": r["src"], "dst": r["dst"], "src_dev": r["src_dev"], "dst_dev": r["dst_dev"],
                      "dev_kind": dev_kind, "global_rank": granks.get((r["host"], r["pid"])),
                      "orphan": r["orphan"]})
    if unattributed:
        st.diagnostics.append(Diagnostic(st.path, f"{unattributed} transport lines could not be "
                                         "attributed to a communicator (comm_id left null)"))
    topo = table(TOPOLOGY, {k: [r[k] for r in rows] for k in TOPOLOGY.names}) if rows else \
        TOPOLOGY.empty_table()
    schema = pa.schema([("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()),
                        ("comm", pa.string()), ("channel", pa.int32()), ("conn", pa.int32()),
                        ("src", pa.int32()), ("dst", pa.int32()), ("src_dev", pa.string()),
                        ("dst_dev", pa.string()), ("dev_kind", pa.string()), ("global_rank", pa.int32()),
                        ("orphan", pa.bool_())])
    return topo, _rows_table(extra, schema)


def _graph(st: _Parser, comms: list[_Comm], coll: pl.DataFrame) -> pa.Table:
    """Ring orders and trees per channel, plus channel counts folded into the communicators."""
    ctx = _context_index(st, coll)
    rows = []
    for r in st.graph:
        cands = _candidates(ctx.get((r["host"], r["pid"])), r["line"])
        chosen = None
        for c in cands:
            if r["kind"] == "tree":
                mid = r["value"].split("->")
                if len(mid) >= 2 and mid[1].lstrip("-").isdigit() and int(mid[1]) != c.rank:
                    continue
            chosen = c
            break
        rows.append({"line": r["line"], "host": r["host"], "pid": r["pid"],
                     "comm": chosen.comm if chosen else None, "comm_id": chosen.comm_id if chosen else None,
                     "rank": chosen.rank if chosen else None, "kind": r["kind"], "channel": r["channel"],
                     "nchannels": r["nchannels"], "value": r["value"], "cut": r["cut"]})
    for _, line, r in st.pending_ctx:
        chosen = None
        if r["comm"] is not None:
            chosen = next((c for c in reversed(comms) if c.comm == r["comm"] and c.host == r["host"]
                           and c.pid == r["pid"] and c.first_line <= line), None)
        if chosen is None:
            cands = _candidates(ctx.get((r["host"], r["pid"])), line)
            chosen = cands[0] if cands else None
        if chosen is not None:
            v = r["vals"]
            chosen.coll_channels = v.get("coll", chosen.coll_channels)
            chosen.collnet_channels = v.get("collnet", chosen.collnet_channels)
            chosen.nvls_channels = v.get("nvls", chosen.nvls_channels)
            chosen.p2p_channels = v.get("p2p", chosen.p2p_channels)
            chosen.p2p_channels_per_peer = v.get("p2p_per_peer", chosen.p2p_channels_per_peer)
    schema = pa.schema([("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()),
                        ("comm", pa.string()), ("comm_id", pa.string()), ("rank", pa.int32()),
                        ("kind", pa.string()), ("channel", pa.int32()), ("nchannels", pa.int32()),
                        ("value", pa.string()), ("cut", pa.bool_())])
    return _rows_table(rows, schema)


_TUNING_SCHEMA = {"line": pl.Int64, "host": pl.String, "pid": pl.Int64, "op": pl.String, "bytes": pl.Int64,
                  "algorithm": pl.String, "protocol": pl.String, "channel_lo": pl.Int32,
                  "channel_hi": pl.Int32, "time_us": pl.Float64, "kernel": pl.String, "comm_id": pl.String,
                  "seq": pl.Int64, "collective_id": pl.Int64, "matched_by": pl.String}


def _tuning_sizes(c: dict[str, Any]) -> tuple[int | None, int | None]:
    """The sizes a TUNING line may print for call ``c``: S (2.20-2.23 print the full buffer) and
    count * element size (2.24+)."""
    size = DTYPE_SIZES.get(c["dtype"])
    return c["bytes"], (c["count"] * size if size is not None and c["count"] is not None else None)


def _match_tuning(t: dict[str, Any],
                  pending: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str | None]:
    """The pending call a TUNING line describes: same op (when the line names it, 2.23+) and size,
    else the first of the same op; same size only for 2.20-2.22 lines without an op name."""
    cands = [c for c in pending if t["comm"] is None or c["comm"] == t["comm"]]
    if t["op"] is not None:
        cands = [c for c in cands if c["op"] == t["op"]]
    for kind in (0, 1):
        for c in cands:
            if _tuning_sizes(c)[kind] == t["bytes"]:
                return c, ("op+bytes" if t["op"] is not None else "bytes")
    if t["op"] is not None and cands:
        return cands[0], "op"
    return None, None


def _attach_tuning(st: _Parser, coll: pl.DataFrame) -> pl.DataFrame:
    """Match each TUNING line to the call it describes. Rank 0 of a communicator prints them after the
    COLL lines of the group, so per process: its COLL lines on comms where it is rank 0 since the
    previous TUNING run form the pending group; see :func:`_match_tuning`."""
    if not st.tuning:
        return pl.DataFrame(schema=_TUNING_SCHEMA)
    out = []
    by_proc: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for t in st.tuning:
        by_proc[(t["host"], t["pid"])].append(t)
    for (host, pid), tl in by_proc.items():
        crow = coll.filter((pl.col("host") == host) & (pl.col("pid") == pid)
                           & ~pl.col("op").is_in(["send", "recv"])
                           & (pl.col("comm_rank").is_null() | (pl.col("comm_rank") == 0))).select(
            "line", "op", "bytes", "count", "dtype", "pg", "seq", "collective_id", "comm").to_dicts()
        i = 0
        pending: list[dict[str, Any]] = []
        after_tuning = False
        for t in tl:
            while i < len(crow) and crow[i]["line"] < t["line"]:
                if after_tuning:
                    pending, after_tuning = [], False
                pending.append(crow[i])
                i += 1
            after_tuning = True
            match, how = _match_tuning(t, pending)
            row = dict(t)
            row.pop("comm", None)
            if match is not None:
                pending.remove(match)
                row.update(comm_id=match["pg"], seq=match["seq"], collective_id=match["collective_id"],
                           matched_by=how)
            else:
                row.update(comm_id=None, seq=None, collective_id=None, matched_by=None)
            out.append(row)
    df = pl.DataFrame(out, schema=_TUNING_SCHEMA).sort("line")
    unmatched = df.filter(pl.col("collective_id").is_null()).height
    if unmatched:
        st.diagnostics.append(Diagnostic(st.path, f"{unmatched} of {df.height} TUNING lines match no "
                                         "preceding COLL line of their process (algorithm/protocol "
                                         "left unknown for those calls)"))
    return df


def _apply_tuning(coll: pl.DataFrame, calls: pl.DataFrame,
                  tuning: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Copy algorithm/protocol to every member's row of the same (pg, seq) (and to the matched row)."""
    m = tuning.filter(pl.col("collective_id").is_not_null())
    if m.height == 0:
        return coll, calls
    by_id = m.select("collective_id", pl.col("algorithm").alias("_a1"), pl.col("protocol").alias("_p1"))
    by_seq = m.filter(pl.col("comm_id").is_not_null()).group_by(["comm_id", "seq"]).agg(
        pl.col("algorithm").first().alias("_a2"), pl.col("protocol").first().alias("_p2")).rename(
        {"comm_id": "pg"})
    coll = coll.join(by_id, on="collective_id", how="left", maintain_order="left").join(
        by_seq, on=["pg", "seq"], how="left", maintain_order="left")
    coll = coll.with_columns(pl.coalesce("_a1", "_a2").alias("algorithm"),
                             pl.coalesce("_p1", "_p2").alias("protocol")).drop("_a1", "_a2", "_p1", "_p2")
    return coll, calls


def _check_sizes(st: _Parser, coll: pl.DataFrame) -> None:
    """Members of one call must agree on op, count, datatype and size of the comm (send/recv pairs
    legitimately differ and are not checked)."""
    if coll.height == 0:
        return
    g = coll.filter(pl.col("pg").is_not_null() & ~pl.col("op").is_in(["send", "recv"])).group_by(
        ["pg", "seq"]).agg(pl.struct("op", "count", "dtype", "nranks").n_unique().alias("_n"),
                           pl.len().alias("_members"), pl.col("line").min().alias("_line"))
    bad = g.filter(pl.col("_n") > 1).sort("_line")
    if bad.height:
        first = bad.row(0, named=True)
        st.diagnostics.append(Diagnostic(
            st.path, f"{bad.height} calls disagree between ranks on op/count/datatype/nranks for the "
            f"same (commId, seq) -- first: pg {first['pg']} seq {first['seq']}; the log is missing or "
            "reordering COLL lines (or ids collide), so cross-rank matching of these calls is unreliable",
            line=first["_line"]))


def _counts_diagnostics(st: _Parser, damage: _Damage, coll: pl.DataFrame) -> None:
    path, c = st.path, st.counts
    if c["unparsed_lines"]:
        ex = ", ".join(map(str, st.unparsed_examples))
        st.diagnostics.append(Diagnostic(
            path, f"{c['unparsed_lines']} of {c['lines']} lines are not NCCL log lines or are damaged "
            f"(skipped; first at lines {ex})", line=st.unparsed_examples[0]))
    if damage.overlong:
        st.diagnostics.append(Diagnostic(path, f"{len(damage.overlong)} lines longer than {MAX_LINE} bytes "
                                         "were cut", line=damage.overlong[0]))
    if c["cut_lines"]:
        st.diagnostics.append(Diagnostic(path, f"{c['cut_lines']} lines reach NCCL's 1 KB line limit and "
                                         "are probably cut (rings/trees may be incomplete)",
                                         line=st.cut_examples[0]))
    if c["ray_repeats"]:
        st.diagnostics.append(Diagnostic(path, f"Ray dropped {c['ray_repeats']} repeated lines "
                                         "('[repeated Nx across cluster]'): calls of other workers are "
                                         "missing from this log"))
    if c["orphan_lines"] or c["widowed_prefixes"]:
        lost = coll.filter(pl.col("host").is_null()).height if coll.height else 0
        st.diagnostics.append(Diagnostic(
            path, f"interleaved output: {c['widowed_prefixes']} prefixes without a body, "
            f"{c['orphan_lines']} bodies without a prefix"
            + (f" ({lost} calls could not be given a process)" if lost else ""), level="info"))
    for w in st.warnings[:MAX_WARN_DIAGNOSTICS]:
        st.diagnostics.append(Diagnostic(path, f"NCCL {w['level']} from {w['host']}:{w['pid']}: "
                                         f"{w['message'].splitlines()[0] if w['message'] else ''}",
                                         line=w["line"]))
    if c["warn_lines"] > MAX_WARN_DIAGNOSTICS:
        st.diagnostics.append(Diagnostic(path, f"{c['warn_lines']} NCCL WARN lines in all (see table "
                                         "nccl_warnings)"))


def _comms_table(comms: list[_Comm], coll: pl.DataFrame) -> pa.Table:
    calls: dict[int, int] = {}
    if coll.height:
        for idx, n in coll.filter(pl.col("comm_idx").is_not_null()).group_by("comm_idx").len().iter_rows():
            calls[idx] = n
    rows = [{"host": c.host, "pid": c.pid, "comm": c.comm, "comm_id": c.comm_id,
             "comm_id_source": c.comm_id_source, "rank": c.rank, "nranks": c.nranks, "cuda_dev": c.cuda_dev,
             "nvml_dev": c.nvml_dev, "bus_id": c.bus_id, "api": c.api, "parent": c.parent,
             "parent_comm_id": c.parent_comm_id, "split_count": c.split_count, "color": c.color,
             "key": c.key, "start_line": c.start_line, "init_line": c.init_line, "end_line": c.end_line,
             "end": c.end, "nnodes": c.nnodes, "local_ranks": c.local_ranks, "local_rank": c.local_rank,
             "coll_channels": c.coll_channels, "collnet_channels": c.collnet_channels,
             "nvls_channels": c.nvls_channels, "p2p_channels": c.p2p_channels,
             "p2p_channels_per_peer": c.p2p_channels_per_peer, "calls": calls.get(c.idx, 0)}
            for c in comms]
    i32, i64, s = pa.int32(), pa.int64(), pa.string()
    schema = pa.schema([("host", s), ("pid", i64), ("comm", s), ("comm_id", s), ("comm_id_source", s),
                        ("rank", i32), ("nranks", i32), ("cuda_dev", i32), ("nvml_dev", i32),
                        ("bus_id", s), ("api", s), ("parent", s), ("parent_comm_id", s),
                        ("split_count", i32), ("color", i32), ("key", i32), ("start_line", i64),
                        ("init_line", i64), ("end_line", i64), ("end", s), ("nnodes", i32),
                        ("local_ranks", i32), ("local_rank", i32), ("coll_channels", i32),
                        ("collnet_channels", i32), ("nvls_channels", i32), ("p2p_channels", i32),
                        ("p2p_channels_per_peer", i32), ("calls", i64)])
    return _rows_table(rows, schema)


def _file_version(st: _Parser) -> str | None:
    if not st.versions:
        vs = {p.version for p in st.procs.values() if p.version}
        return sorted(vs)[-1] if vs else None
    return max(st.versions, key=lambda v: st.versions[v])


def _era_text(st: _Parser) -> str | None:
    lo, hi = st.era_lo, st.era_hi
    if lo == (2, 0, 0) and hi == (99, 0, 0):
        return None
    f = lambda v: ".".join(map(str, v))  # noqa: E731
    if hi == (99, 0, 0):
        return f">={f(lo)}"
    if lo == (2, 0, 0):
        return f"<={f(hi)}".replace(".99", ".x")
    return f"{f(lo)}-{f(hi)}".replace(".99", ".x")


def _meta(st: _Parser, comms: list[_Comm], procs: pl.DataFrame,
          world: dict[tuple[str | None, int | None], _Comm]) -> dict[str, Any]:
    version = _file_version(st)
    ranks = {(h, p): (g, s) for h, p, g, s in procs.select("host", "pid", "global_rank",
                                                             "rank_source").iter_rows()}
    plist = []
    for (host, pid), p in sorted(st.procs.items(), key=lambda kv: (
            ranks.get(kv[0], (None,))[0] if ranks.get(kv[0], (None,))[0] is not None else 1 << 30, kv[0])):
        g, src = ranks.get((host, pid), (None, None))
        w = world.get((host, pid))
        plist.append({
            "host": host, "pid": pid, "rank": g, "rank_source": src, "nranks": w.nranks if w else None,
            "devices": sorted(p.devices), "version": p.version or version, "network": p.network,
            "prefixes": p.prefixes,
            "comms": [{"comm": c.comm, "comm_id": c.comm_id, "rank": c.rank, "nranks": c.nranks,
                       "cuda_dev": c.cuda_dev, "bus_id": c.bus_id, "parent": c.parent, "color": c.color,
                       "key": c.key} for c in comms if c.host == host and c.pid == pid],
        })
    world_size = max((c.nranks for c in comms if c.nranks), default=None)
    meta: dict[str, Any] = {
        "format_version": version, "nccl_version": version, "era": _era_text(st), "backend": "nccl",
        "world_size": world_size, "network": st.networks, "processes": plist,
    }
    if len(plist) == 1:
        p0 = plist[0]
        meta.update(rank=p0["rank"], host=p0["host"], pid=p0["pid"],
                    device=p0["devices"][0] if len(p0["devices"]) == 1 else None)
    for k in ("lines", "blank_lines", "nccl_lines", "ignored_lines", "unparsed_lines", "warn_lines",
              "cut_lines", "orphan_lines", "widowed_prefixes", "ray_repeats", "continuation_lines",
              "unwind_lines"):
        meta[k] = int(st.counts.get(k, 0))
    return meta
