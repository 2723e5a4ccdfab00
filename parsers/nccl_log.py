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
  split communicators print no commId on their Init lines: it is *derived* with NCCL's own hash of the
  parent's commId, ``splitCount`` and ``color`` (src/init.cc), and replaced by the commId of the
  Destroy line when the log has one (a mismatch is reported). Before NCCL 2.16 no commId exists at
  all: ``pg`` is then the
  synthetic ``synthetic-n{nranks}-{k}`` = the k-th communicator of that size created by the process
  (ranks create communicators in the same order, so it matches across ranks; two *disjoint* groups of
  equal size collide -- flagged by a diagnostic when both are in one file).
  ``tables["nccl_comms"].comm_id_source`` says which (``log``, ``derived``, ``synthetic``). Null when no
  Init line of the communicator is in the log (e.g. ``NCCL_DEBUG_SUBSYS=COLL`` only).
* ``seq`` -- 0-based index of the call among the calls of the same process on the same communicator
  (``pg``), in line order: the k-th call of a comm is the same collective on every member (FORMATS 2.4).
  NCCL's ``opCount`` is *not* a call id (stuck at 0 or shared by a group); it is in ``nccl_calls``.
  Calls on a comm without Init line are counted per comm pointer; null for an orphan body whose
  process could not be recovered. A lost or cut COLL line shifts the seq of that process's later calls
  on that comm: members then disagree on (pg, seq), which is reported as a diagnostic.
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

Extra tables (``ParsedFile.tables``), all with a ``line`` column (1-based line of the log; a
``(pid, line)`` pair identifies a row's source). Column types are fixed (``string``, ``int32/64``,
``bool``, ``double``); in ``nccl_calls`` the repetitive ``host``, ``comm`` and ``prefix`` are
``dictionary<int32, string>``:

* ``nccl_calls`` -- aligned row by row with ``collectives`` (same ``collective_id``): ``line host pid
  tid device`` (the ``[dev]`` of the line: the CUDA ordinal, not a rank) ``comm`` (host pointer)
  ``comm_rank`` (rank in the comm) ``global_rank`` ``rank_is_global`` (``collectives.rank`` is global)
  ``peer_comm_rank`` (root/peer in the comm) ``peer_is_global`` (``collectives.peer`` is global)
  ``opcount`` (NCCL's opCount, int from hex; not a call id) ``redop`` (0 sum, 1 prod, 2 max, 3 min,
  4 avg, >= 5 user) ``in_place`` (sendbuff == recvbuff) ``prefix`` (launcher prefix before the NCCL
  text, e.g. ``[default5]:``) ``log_time`` (the 2.26+ ``[%F %T]`` text, local wall time, when present)
  ``orphan`` (body found without its ``host:pid:tid`` prefix, FORMATS 2.6, process recovered from its
  comm pointer) ``task`` (RCCL) ``repeated`` (Ray ``[repeated Nx across cluster]``: lines Ray dropped).
* ``nccl_comms`` -- one row per communicator instance per process (a ``comm`` pointer reused after
  Destroy is a new instance): ``host pid comm comm_id comm_id_source`` (``log`` printed on an Init or
  Destroy line, ``derived`` 2.27+ split hash, ``synthetic`` before 2.16) ``rank nranks cuda_dev nvml_dev
  bus_id api`` (``ncclCommInitRank``, ``ncclCommSplit``, ... 2.21+) ``parent parent_comm_id split_count
  color key start_line init_line`` (Init START / COMPLETE) ``end_line end`` (``destroy`` / ``abort``)
  ``nnodes local_ranks local_rank coll_channels collnet_channels nvls_channels p2p_channels
  p2p_channels_per_peer calls`` (COLL lines on it).
* ``nccl_connections`` -- aligned row by row with ``topology``: ``line host pid comm channel conn``
  (the ``/c`` connection index, 2.14+) ``src dst`` (in-comm ranks as printed) ``src_dev dst_dev`` (the
  brackets, opaque strings) ``dev_kind`` (what the brackets are: ``cudaDev`` <= 2.4, ``busId``
  2.5-2.18.1, ``nvmlDev`` >= 2.18.3, null if the era is unknown) ``global_rank`` (of the process that
  logged it) ``orphan``.
* ``nccl_graph`` -- ring orders (``kind=ring``, rank 0 of the comm prints them: ``value`` = the
  space-separated in-comm ranks) and trees (``kind=tree``: ``value`` = ``children->rank->parent``, or
  the joined up|down trees of 2.4-2.6) per channel: ``comm comm_id rank channel nchannels cut`` (the
  line hit NCCL's 1 KB limit, so the ring may be incomplete).
* ``nccl_tuning`` -- every TUNING line: ``host pid op`` (null before 2.23) ``bytes algorithm protocol
  channel_lo channel_hi time_us`` (predicted, 2.20-2.23) ``kernel`` (2.27+ symmetric kernels, then
  ``algorithm`` = ``SYMMETRIC``) ``size_kind`` (``S``: the line prints the full buffer, 2.20-2.23;
  ``cs``: count * element size, 2.24+) and the call it was matched to: ``comm_id seq collective_id
  matched_by`` (``op+bytes``, ``bytes``, ``op``; null when unmatched).
* ``nccl_warnings`` -- WARN (and other non-INFO/TRACE levels) lines: ``host pid tid device level loc``
  (``file.cc:line``) ``func`` (2.30.7+) ``message log_time``; indented continuation lines are appended
  to the message.
* ``pytorch_watchdog`` -- ProcessGroupNCCL watchdog lines: ``rank seq_num op_type numel_in numel_out
  timeout_ms text``.

``meta``: ``format_version`` / ``nccl_version`` (from the version line; ``None`` without one),
``era`` (version range inferred from the formats seen, e.g. ``2.21.0-2.23.x``), ``backend``
(``nccl``), ``world_size`` (largest comm), ``network`` (``IB``, ``Socket``, ...), ``processes`` (list
of ``{host, pid, rank, rank_source, nranks, devices, comms, version, network, prefixes}``, ``comms``
being ``[{comm, comm_id, rank, nranks, cuda_dev, bus_id, parent, color, key}]``; ``rank_source`` is
``rccl-globalrank``, ``nccl-init`` or ``nccl-tests``), and when the file holds exactly one process
also ``rank host pid device``. Counters: ``lines blank_lines nccl_lines ignored_lines`` (NCCL lines
of no interest) ``unparsed_lines warn_lines cut_lines orphan_lines widowed_prefixes ray_repeats
continuation_lines unwind_lines`` (``file.cc:123 -> 6`` error-return lines).

How: the input streams through :func:`parsers.source.iter_blocks` (gzip too) in 4 MiB blocks of whole
lines; memory holds one block's work plus the output rows. COLL and (2.24+) TUNING lines -- the bulk
of a big log -- never reach Python one by one: numpy cuts the block into lines, Arrow splits them into
space-separated tokens, the anchor is the tokens before ``NCCL INFO``, every field is taken by its
position after it and checked by vectorised kernels, and repetitive tokens (anchors, ``[dev]``, op
names, datatypes, ``[nranks=N]``) are parsed once per distinct value. Other TUNING shapes go through
one RE2 call per block. Only the rest (Init, transport and other messages, interleaved or damaged
lines) goes through the per-line Python path with the FORMATS.md regexes. Cross-line resolution
(communicator instances, ranks, seq, tuning, peers) runs once at the end on integer keys in polars.
Nothing raises on bad lines: they are counted and summarised in one diagnostic.
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

PARSER_VERSION = "2"
FORMAT = "nccl-log"

#: Decompressed bytes per block: big enough to amortise the per-block kernels, small enough to keep
#: the transient memory of a block (its tokens) near 60 MB.
BLOCK = 4 << 20
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
#: line or follow a non-host character, so a search never backtracks through a word. Pids and tids of
#: more than 18 digits, devices of more than 9 are no anchor (as in _ANCHOR_TOKEN: they fit int64/int32).
ANCHOR = re.compile(
    r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]*+):(?P<pid>\d{1,18}+):(?P<tid>\d{1,18}+) (?:\[(?P<dev>-?\d{1,9})\] )?"
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
    r"ProcessGroupNCCL\.cpp:\d+\]\s*\[Rank (?P<rank>\d+)\]\s*"
    r"(?P<what>.*?WorkNCCL\((?P<args>(?:[^()]|\([^()]*\))*)\).*)$")
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
    """Yield ``(data, overlong)``: the decompressed input as blocks of whole lines, each ending with
    ``\\n``. A run of more than MAX_LINE bytes without a newline is cut there (the rest of that line is
    dropped) and becomes the last line of its block (``overlong`` true). A corrupt gzip stream ends the
    input (recorded in ``damage``)."""
    carry = b""
    skipping = False  # inside the dropped tail of an overlong line
    try:
        for _, block in iter_blocks(path, BLOCK):
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
                    yield carry[:MAX_LINE] + b"\n", True
                    carry = b""
                    skipping = True
                continue
            carry = data[cut + 1:]
            out = data[:cut + 1]
            if len(carry) > MAX_LINE:
                yield out + carry[:MAX_LINE] + b"\n", True
                carry = b""
                skipping = True
                continue
            yield out, False
    except TraceError as exc:
        damage.read_error = exc
    if carry:
        yield carry + b"\n", False


def _split_lines(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Line boundaries of a block: ``(data, starts, ends)``; ``ends`` excludes ``\\n`` and ``\\r``."""
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


def _utf8_lines(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray, pa.StringArray]:
    """The lines of a block as an Arrow string array (zero parse). Invalid UTF-8 is replaced
    (U+FFFD) so Arrow's string kernels apply; newlines are unaffected, so line numbers hold."""
    data, starts, ends = _split_lines(data)
    lines = _slices(data, starts, ends)
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        data, starts, ends = _split_lines(data.decode("utf-8", "replace").encode("utf-8"))
        lines = _slices(data, starts, ends)
    return data, starts, ends, lines


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

#: COLL keywords at their offsets from the ``opCount`` token
_KEYWORDS = ((2, "sendbuff"), (4, "recvbuff"), (6, "count"), (8, "datatype"), (10, "op"), (12, "root"),
             (14, "comm"), (17, "stream"))

#: columns of the raw COLL table (fast and per-line paths alike); repetitive strings are dictionaries
_DICT = pa.dictionary(pa.int32(), pa.string())
_RAW_COLL = pa.schema([
    ("line", pa.int64()), ("sub", pa.int32()), ("host", _DICT), ("pid", pa.int64()),
    ("tid", pa.int64()), ("device", pa.int32()), ("op_raw", _DICT), ("opcount", pa.int64()),
    ("in_place", pa.bool_()), ("count", pa.int64()), ("dtype_id", pa.int32()), ("redop", pa.int32()),
    ("root", pa.int32()), ("comm", _DICT), ("nranks", pa.int32()), ("stream", _DICT),
    ("prefix", _DICT), ("rest", pa.string()), ("orphan", pa.bool_()),
])


def _hex(arr: pa.Array) -> pa.Array:
    """Hex strings (no ``0x``) to int64; null where not hex or too big."""
    return pl.from_arrow(arr).str.to_integer(base=16, strict=False).cast(pl.Int64).to_arrow()


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


def _ints(arr: pa.Array, typ: pa.DataType, signed: bool = False) -> tuple[pa.Array, np.ndarray]:
    """Cast decimal tokens to ``typ`` and the mask of valid ones. The whole array is cast at once (the
    usual case: all valid); only when that fails are the bad tokens found and masked."""
    try:
        return pc.cast(arr, typ), np.ones(len(arr), bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = _digits(pc.utf8_ltrim(arr, "-") if signed else arr)
        fixed = pc.cast(pc.if_else(pa.array(ok), arr, "0"), typ)
        return fixed, ok


@dataclass
class _Fast:
    """What the columnar path made of a block: COLL rows, TUNING rows, and the other single-anchor
    INFO lines with their anchor already parsed (for the per-line path)."""

    coll: pa.Table | None = None
    tuning: pa.Table | None = None
    done: np.ndarray | None = None  # over the block's lines: handled here (fully or anchor-parsed)
    rest: list[tuple[int, str | None, str, int, int, int | None, str, int]] = field(default_factory=list)


#: TUNING lines in RE2 syntax (Arrow's regex kernels): raw text, normalised in :func:`_tuning_frame`
TUNING_RE2 = (
    r"^\s*(?:(?P<op>[A-Za-z]+)(?: \[Symmetric\])?: )?\s*(?P<bytes>\d{1,18}) Bytes -> "
    r"(?:Algo (?P<algo>\S+) proto (?P<proto>\S+)(?: time (?P<time>\S+))?"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d{1,9})\.\.(?P<hi>\d{1,9})\})?|Kernel (?P<kernel>\S+))(?P<tail>.*)$")

#: TUNING fields as text (the RE2 and per-line paths) ...
_TEXT_TUNING = pa.schema([
    ("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()), ("op", pa.string()),
    ("bytes", pa.string()), ("algo", pa.string()), ("proto", pa.string()), ("time", pa.string()),
    ("lo", pa.string()), ("hi", pa.string()), ("kernel", pa.string()), ("tail", pa.string()),
])
#: ... and typed, as kept per block (raw NCCL names; normalised in :func:`_tuning_frame`)
_RAW_TUNING = pa.schema([
    ("line", pa.int64()), ("host", _DICT), ("pid", pa.int64()), ("op", _DICT), ("bytes", pa.int64()),
    ("algo", _DICT), ("proto", _DICT), ("time", pa.float64()), ("lo", pa.int32()), ("hi", pa.int32()),
    ("kernel", _DICT), ("tail", pa.string()),
])


def _typed_tuning(t: pa.Table) -> pa.Table:
    """A ``_TEXT_TUNING`` table as ``_RAW_TUNING`` ("" from RE2's non-participating groups -> null)."""
    cols = {}
    for f in _RAW_TUNING:
        c = t.column(f.name)
        if pa.types.is_string(c.type):
            if f.name != "host":  # an empty host is a host
                c = pc.if_else(pc.equal(c, ""), pa.scalar(None, pa.string()), c)
            if f.type == _DICT:
                c = pc.dictionary_encode(c)
            elif f.type != pa.string():
                c = pc.cast(c, f.type, safe=False) if f.name != "time" else _floats(c)
        cols[f.name] = c
    return pa.table(cols, schema=_RAW_TUNING)


def _floats(arr: pa.ChunkedArray) -> pa.Array:
    """Text to float64, null where it is not a number."""
    return pl.from_arrow(arr).cast(pl.Float64, strict=False).to_arrow()


#: one token ``[launcher]:host:pid:tid``: the host starts after the last ``:``, ``[`` or ``]`` before it
#: (as in ANCHOR)
_ANCHOR_TOKEN = re.compile(
    r"^(?P<glued>.*[:\[\]])?(?P<host>[^\s:\[\]]*):(?P<pid>\d{1,18}):(?P<tid>\d{1,18})$")


def _parse_anchor_token(tok: str) -> tuple[str, int, int, int] | None:
    """``[default5]:host:pid:tid`` -> (host, pid, tid, length of the glued launcher prefix)."""
    m = _ANCHOR_TOKEN.match(tok)
    if m is None:
        return None
    # the glued prefix's length in bytes (it is sliced out of the block's bytes), not in characters
    return m["host"], int(m["pid"]), int(m["tid"]), len(m["glued"].encode()) if m["glued"] else 0


def _int_or_none(tok: str, lo: int = 0) -> int | None:
    t = tok[1:] if tok[:1] == "-" else tok
    if not (t.isascii() and t.isdigit()) or len(t) > 18:
        return None
    v = int(tok)
    return v if v >= lo else None


_CHANNELS = re.compile(r"^channel\{Lo\.\.Hi\}=\{(\d{1,9})\.\.(\d{1,9})\}$")


def _channel_range(tok: str) -> tuple[int, int] | None:
    m = _CHANNELS.match(tok)
    return (int(m[1]), int(m[2])) if m else None


def _by_value(arr: pa.Array, fn: Any, types: tuple[pa.DataType, ...]) -> tuple[list[pa.Array], np.ndarray]:
    """Map a column of repetitive tokens through ``fn`` once per distinct value (a dictionary encode
    and a Python call per distinct token instead of string kernels over every row). ``fn`` returns a
    tuple of len(types) or None; returns the mapped columns and the mask of rows that mapped."""
    enc = pc.dictionary_encode(arr)
    mapped = [fn(u) for u in enc.dictionary.to_pylist()]
    ok_u = np.array([m is not None for m in mapped], bool)
    cols = []
    for i, typ in enumerate(types):
        vals = pa.array([m[i] if m is not None else None for m in mapped], typ)
        cols.append(vals.take(enc.indices))
    idx = _np(enc.indices)
    return cols, ok_u[idx] if len(idx) else np.zeros(0, bool)


def _fast_block(data: bytes, starts: np.ndarray, ends: np.ndarray, lines: pa.StringArray,
                line0: int) -> _Fast:
    """Columnar parse of the lines with exactly one ``host:pid:tid [dev] NCCL INFO`` anchor: the line
    is split into space-separated tokens, the anchor found as the tokens before ``NCCL INFO``, and
    COLL fields taken by position after it. Repetitive tokens (anchors, ``[dev]``, op names, datatypes,
    ``[nranks=N]``) are parsed once per distinct value; the rest by vectorised kernels. Lines that fail
    any check are left for the per-line path (``done`` false)."""
    n = len(lines)
    res = _Fast(done=np.zeros(n, bool))
    if n == 0:
        return res
    # every line is tokenised; a second anchor in a line shows as a second "NCCL" token below
    toks = pc.split_pattern(lines, " ")
    loff = _np(toks.offsets).astype(np.int64)
    flat = toks.values
    q = np.flatnonzero(_np(pc.equal(flat, "NCCL")))
    if len(q) == 0:
        return res
    row = np.searchsorted(loff, q, side="right") - 1
    per_row = np.bincount(row, minlength=n)
    ok = (per_row[row] == 1) & (q - 2 >= loff[row]) & (q + 1 < loff[row + 1])
    q, row = q[ok], row[ok]

    def tk(idx: np.ndarray) -> pa.Array:
        return flat.take(pa.array(idx))

    ok = _np(pc.equal(tk(q + 1), "INFO"))
    # "[dev]" before NCCL (INFO lines always have it), then the host:pid:tid token
    (dev,), has_dev = _by_value(tk(q - 1), lambda t: (_int_or_none(t[1:-1], -1),)
                                if t[:1] == "[" and t[-1:] == "]" and _int_or_none(t[1:-1], -1) is not None
                                else None, (pa.int32(),))
    ok &= has_dev
    (host_s, pid_a, tid_a, glued), good = _by_value(tk(q - 2), _parse_anchor_token,
                                                      (pa.string(), pa.int64(), pa.int64(), pa.int64()))
    ok &= good
    if not ok.any():
        return res
    sel = np.flatnonzero(ok)
    if len(sel) < len(q):
        selp = pa.array(sel)
        q, row = q[sel], row[sel]
        dev, host_s, pid_a, tid_a, glued = (a.take(selp) for a in (dev, host_s, pid_a, tid_a, glued))
    fo = _str_offsets(flat)
    first, rend = loff[row], loff[row + 1]

    def char_pos(j: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Byte position of token ``j`` in its line (tokens are separated by one space)."""
        return fo[j] - fo[first] + (j - first)

    line_idx = row
    lstart, lend = starts[line_idx], ends[line_idx]
    plen_chars = char_pos(q - 2, first) + _np(glued)
    has_prefix = plen_chars > 0
    prefix = pa.nulls(len(q), pa.string())
    if has_prefix.any():
        hp = np.flatnonzero(has_prefix)
        prefix = pc.replace_with_mask(prefix, pa.array(has_prefix),
                                      _slices(data, lstart[hp], lstart[hp] + plen_chars[hp]))
    body_start = np.minimum(lstart + char_pos(q + 1, first) + 5, lend)  # after "INFO "
    handled = np.zeros(len(q), bool)

    # COLL: "NCCL INFO <Op>: opCount ..." -- fields at fixed offsets from the opCount token
    p = q + 3
    is_coll = p + 18 < rend
    is_coll[is_coll] &= _np(pc.equal(tk(p[is_coll]), "opCount"))
    ci = np.flatnonzero(is_coll)
    if len(ci):
        pc_ = p[ci]
        t = {d: tk(pc_ + d) for d in (-1, 1, 2, 4, 6, 8, 10, 12, 14, 17)}
        cok = np.ones(len(ci), bool)
        for d, kw in _KEYWORDS:
            cok &= _np(pc.equal(t[d], kw))
        (opname,), good = _by_value(t[-1], lambda x: (x[:-1],) if x[-1:] == ":" and x[:-1].isalpha() and
                                    x[:-1].isascii() else None, (pa.string(),))
        cok &= good
        small = {}
        for d, lo in ((9, 0), (11, 0), (13, -(1 << 31)), (16, 0)):
            tok = tk(pc_ + d)
            if d == 16:
                (v,), good = _by_value(tok, lambda x: (_int_or_none(x[8:-1]),) if x.startswith("[nranks=") and
                                       x[-1:] == "]" and _int_or_none(x[8:-1]) is not None else None,
                                       (pa.int32(),))
            else:
                (v,), good = _by_value(tok, lambda x, lo=lo: None if _int_or_none(x, lo) is None or
                                       abs(_int_or_none(x, lo) or 0) >= 1 << 31 else (_int_or_none(x, lo),),
                                       (pa.int32(),))
            small[d] = v
            cok &= good
        count, good = _ints(tk(pc_ + 7), pa.int64())
        cok &= good
        sendb, recvb = tk(pc_ + 3), tk(pc_ + 5)
        if not cok.all():
            mask = pa.array(cok)
            ci, pc_ = ci[cok], pc_[cok]
            t = {d: v.filter(mask) for d, v in t.items()}
            small = {d: v.filter(mask) for d, v in small.items()}
            opname, count, sendb, recvb = (a.filter(mask) for a in (opname, count, sendb, recvb))
        if len(ci):
            ca = pa.array(ci)
            stream = tk(pc_ + 18)
            rest = pa.nulls(len(ci), pa.string())
            has_rest = rend[ci] > pc_ + 19
            if has_rest.any():
                hr = np.flatnonzero(has_rest)
                rs = (lstart[ci][hr] + char_pos(pc_[hr] + 18, first[ci][hr])
                      + _np(pc.binary_length(stream.take(pa.array(hr)))))
                rest = pc.replace_with_mask(rest, pa.array(has_rest), _slices(data, rs, lend[ci][hr]))
            res.coll = pa.table({
                "line": pa.array(line0 + line_idx[ci], pa.int64()),
                "sub": pa.array(np.zeros(len(ci), np.int32)),
                "host": pc.dictionary_encode(host_s.take(ca)), "pid": pid_a.take(ca), "tid": tid_a.take(ca),
                "device": dev.take(ca), "op_raw": pc.dictionary_encode(opname), "opcount": _hex(t[1]),
                "in_place": pc.equal(sendb, recvb), "count": count, "dtype_id": small[9],
                "redop": small[11], "root": small[13], "comm": pc.dictionary_encode(tk(pc_ + 15)),
                "nranks": small[16], "stream": pc.dictionary_encode(stream),
                "prefix": pc.dictionary_encode(prefix.take(ca)),
                "rest": rest, "orphan": pa.array(np.zeros(len(ci), bool)),
            }, schema=_RAW_COLL)
            handled[ci] = True

    # TUNING, 2.24+: "<Op>: <bytes> Bytes -> Algo <algo> proto <proto> [channel{Lo..Hi}={lo..hi}]"
    tuning: list[pa.Table] = []
    oi = np.flatnonzero(~handled)
    ti = oi[(rend[oi] == q[oi] + 10) | (rend[oi] == q[oi] + 11)]
    if len(ti):
        qt = q[ti]
        tok = {d: tk(qt + d) for d in (2, 3, 4, 5, 6, 7, 8, 9)}
        tm = (_np(pc.equal(tok[4], "Bytes")) & _np(pc.equal(tok[5], "->")) & _np(pc.equal(tok[6], "Algo"))
              & _np(pc.equal(tok[8], "proto")))
        (top,), good = _by_value(tok[2], lambda x: (x[:-1],) if x[-1:] == ":" and x[:-1].isascii()
                                 and x[:-1].isalpha() else None, (pa.string(),))
        tm &= good
        nbytes, good = _ints(tok[3], pa.int64())
        tm &= good
        has_ch = rend[ti] == qt + 11
        lo = hi = pa.nulls(len(ti), pa.int32())
        if has_ch.any():
            (lo, hi), good = _by_value(tk(np.where(has_ch, qt + 10, qt + 9)), _channel_range,
                                       (pa.int32(), pa.int32()))
            tm &= good | ~has_ch
        if tm.any():
            mk = pa.array(tm)
            src = pa.array(ti[tm])
            tuning.append(pa.table({
                "line": pa.array(line0 + line_idx[ti[tm]], pa.int64()),
                "host": pc.dictionary_encode(host_s.take(src)), "pid": pid_a.take(src),
                "op": pc.dictionary_encode(top.filter(mk)), "bytes": nbytes.filter(mk),
                "algo": pc.dictionary_encode(tok[7].filter(mk)),
                "proto": pc.dictionary_encode(tok[9].filter(mk)),
                "time": pa.nulls(int(tm.sum()), pa.float64()), "lo": lo.filter(mk), "hi": hi.filter(mk),
                "kernel": pa.nulls(int(tm.sum()), _DICT), "tail": pa.nulls(int(tm.sum()), pa.string()),
            }, schema=_RAW_TUNING))
            handled[ti[tm]] = True

    # everything else: the body after "NCCL INFO " (other TUNING shapes through RE2)
    oi = np.flatnonzero(~handled)
    if len(oi):
        bodies = _slices(data, body_start[oi], lend[oi])
        is_tuning = _np(pc.match_substring(bodies, " Bytes -> "))
        if is_tuning.any():
            ti = np.flatnonzero(is_tuning)
            ext = pc.extract_regex(bodies.take(pa.array(ti)), TUNING_RE2)
            valid = _np(ext.is_valid())
            if valid.any():
                tv = ti[valid]
                good = ext.filter(pa.array(valid))
                src = pa.array(oi[tv])
                tuning.append(_typed_tuning(pa.table({
                    "line": pa.array(line0 + line_idx[oi[tv]], pa.int64()),
                    "host": host_s.take(src), "pid": pid_a.take(src),
                    **{k: good.field(k) for k in ("op", "bytes", "algo", "proto", "time", "lo", "hi",
                                                   "kernel", "tail")},
                }, schema=_TEXT_TUNING)))
                handled[oi[tv]] = True
        left = np.flatnonzero(~handled[oi])
        if len(left):
            li = oi[left]
            la = pa.array(li)
            res.rest = list(zip(
                (line0 + line_idx[li]).tolist(), prefix.take(la).to_pylist(), host_s.take(la).to_pylist(),
                pid_a.take(la).to_pylist(), tid_a.take(la).to_pylist(), dev.take(la).to_pylist(),
                bodies.take(pa.array(left)).to_pylist(), (lend[li] - lstart[li] - plen_chars[li]).tolist(),
                strict=True))
    if tuning:
        res.tuning = pa.concat_tables(tuning).unify_dictionaries().combine_chunks()
    res.done[line_idx] = True
    return res


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
        self.tuning_tables: list[pa.Table] = []
        self.slow_tuning: list[dict[str, Any]] = []
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
        if not text or text.isspace():
            self.counts["blank_lines"] += 1
            return
        if nbytes > MAX_LINE:  # no NCCL line is this long: do not run regexes over megabytes
            self.counts["overlong_lines"] += 1
            self.unparsed(no)
            return
        anchors = list(ANCHOR.finditer(text)) if "NCCL" in text else []
        if not anchors:
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
        if m and max(int(m["pid"]), int(m["rank"]), int(m["dev"])) < -_I32:  # else damaged: unparsed
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

    def message(self, no: int, sub: int, prefix: str, level: str, host: str, pid: int, tid: int,
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
                self.unparsed(no)
            return
        if body.startswith("NCCL version"):
            m = VERSION.match(body)
            if m:
                self.version(m, proc)
                return
        if "- Init " in body or "- Destroy " in body or "- Abort " in body:  # 2.27+ START: "key 0- Init"
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
                self.ring(no, m, host, pid, cut)
                return
        if body.startswith("Trees"):
            self.trees(no, body, host, pid, cut)
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
        if not (_I32 <= rank < -_I32 and 0 <= nranks < -_I32):  # damaged: ranks are int32 everywhere
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

    def ring(self, no: int, m: re.Match[str], host: str, pid: int, cut: bool) -> None:
        self.graph.append({"line": no, "host": host, "pid": pid, "kind": "ring", "channel": int(m["ch"]),
                           "nchannels": _i(m["n"]), "value": " ".join(m["ranks"].split()), "cut": cut})

    def trees(self, no: int, body: str, host: str, pid: int, cut: bool) -> None:
        items = TREE_ITEM.findall(body)
        if not items:
            self.unparsed(no)
            return
        if "|" in body:
            self.era(hi=(2, 6, 99))
        for ch, tree in items:
            self.graph.append({"line": no, "host": host, "pid": pid, "kind": "tree", "channel": int(ch),
                               "nchannels": None, "value": tree, "cut": cut})

    def tuning_line(self, no: int, m: re.Match[str], host: str, pid: int) -> None:
        self.slow_tuning.append({"line": no, "host": host, "pid": pid, **{
            k: m[k] for k in ("op", "bytes", "algo", "proto", "time", "lo", "hi", "kernel", "tail")}})

    def nnodes(self, no: int, m: re.Match[str], host: str, pid: int) -> None:
        c = self.cur_comm.get((host, pid, m["comm"]))
        if c is None or c.end_line is not None:
            return
        vals = int(m["nnodes"]), int(m["lranks"]), int(m["lrank"])
        if max(vals) >= -_I32:  # damaged
            self.unparsed(no)
            return
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
    line0 = 1
    for data, overlong in _line_blocks(path, damage):
        total += len(data)
        n = st.block(line0, data)
        if overlong:
            damage.overlong.append(line0 + n - 1)
        line0 += n
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
    """Resolve what needs the whole log (communicator ids, ranks, attribution, tuning) into tables."""
    path = st.path
    diags = st.diagnostics
    if st.counts["init_complete_with_id"] and not st.counts["init_start_lines"]:
        st.era(hi=(2, 18, 2))  # commIds but no Init START lines: 2.16-2.18.1
    comms = _resolve_comm_ids(st)
    raw = _prepare_raw(st, comms)
    procs_df, world = _process_ranks(st)
    coll = _collectives(raw, comms, procs_df, world)
    del raw
    ctx = _context_index(st, coll)
    topo, conns = _topology(st, comms, ctx, procs_df)
    graph = _graph(st, comms, ctx)
    tuning = _attach_tuning(st, coll)
    coll = _apply_tuning(coll, tuning)
    _check_sizes(st, coll)
    _counts_diagnostics(st, damage, coll)

    n = coll.height
    lane = pl.concat_str([pl.lit("nccl/stream "), pl.col("stream").cast(pl.String)])
    collectives = table(COLLECTIVES, {
        **{c: coll[c].to_arrow() for c in ("rank", "collective_id", "pg", "seq", "op", "dtype", "count",
                                            "bytes", "nranks", "peer", "algorithm", "protocol")},
        "lane": coll.select(lane.alias("lane"))["lane"].to_arrow(),
        "source": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([FORMAT]))
        .cast(pa.string()),
        "size_source": coll.select(pl.when(pl.col("bytes").is_not_null()).then(pl.lit(FORMAT))
                                   .alias("s"))["s"].to_arrow(),
    })
    calls = coll.select(list(_CALLS_SCHEMA)).to_arrow()
    comm_rows = _comms_table(comms, coll)
    meta = _meta(st, comms, procs_df, world)
    tables = {
        "nccl_calls": calls,
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
    """A stable Arrow contract for the extra tables: ``string`` (not large/view) columns, and
    repetitive strings (hosts, comm pointers, prefixes) as ``dictionary<int32, string>``."""
    cols = []
    for f in t.schema:
        col = t.column(f.name)
        if pa.types.is_dictionary(f.type):
            col = col.cast(_DICT)
        elif pa.types.is_large_string(f.type) or pa.types.is_string_view(f.type):
            col = col.cast(pa.string())
        cols.append(col)
    return pa.Table.from_arrays(cols, names=t.column_names)


_WARN_SCHEMA = pa.schema([("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()),
                          ("tid", pa.int64()), ("device", pa.int32()), ("level", pa.string()),
                          ("loc", pa.string()), ("func", pa.string()), ("message", pa.string()),
                          ("log_time", pa.string())])
_WATCHDOG_SCHEMA = pa.schema([("line", pa.int64()), ("rank", pa.int32()), ("seq_num", pa.int64()),
                              ("op_type", pa.string()), ("numel_in", pa.int64()),
                              ("numel_out", pa.int64()), ("timeout_ms", pa.int64()), ("text", pa.string())])


#: the least int32: communicator ranks and counts beyond int32 are damage
_I32 = -(1 << 31)


def _rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    if not rows:
        return schema.empty_table()
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, OverflowError):
        return pa.Table.from_pylist(_fit(rows, schema), schema=schema)


def _fit(rows: list[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    """``rows`` with every integer outside its column's type made null: a damaged number ('nranks
    22222000000000000', a 70-digit src rank) is unknown, not the end of the parse."""
    bounds = {f.name: (-(1 << (f.type.bit_width - 1)), 1 << (f.type.bit_width - 1))
              for f in schema if pa.types.is_signed_integer(f.type)}
    return [{k: (None if k in bounds and isinstance(v, int) and not bounds[k][0] <= v < bounds[k][1] else v)
             for k, v in r.items()} for r in rows]


def _is_hex(comm_id: str | None) -> bool:
    """A commId NCCL logged (``0x...``): a split's id derives from it; a synthetic one it cannot."""
    try:
        return comm_id is not None and int(comm_id, 16) >= 0
    except ValueError:
        return False


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
        if par is not None and _is_hex(par.comm_id) and c.split_count is not None and c.color is not None:
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


def _comm_frame(comms: list[_Comm]) -> pl.DataFrame:
    """Communicator instances keyed like the COLL rows (categorical host and pointer)."""
    df = pl.DataFrame([{"host": c.host, "pid": c.pid, "comm": c.comm, "first_line": c.first_line,
                        "comm_idx": c.idx} for c in comms if c.host is not None],
                      schema={"host": pl.String, "pid": pl.Int64, "comm": pl.String, "first_line": pl.Int64,
                              "comm_idx": pl.Int64})
    return df.with_columns(pl.col("host").cast(pl.Categorical), pl.col("comm").cast(pl.Categorical))


def _raw_coll(st: _Parser) -> pl.DataFrame:
    """All COLL rows, in line order."""
    parts = [pl.from_arrow(t) for t in st.coll_tables]
    st.coll_tables = []
    if st.slow_coll:
        parts.append(pl.from_arrow(pa.Table.from_pylist(st.slow_coll, schema=_RAW_COLL)))
    if not parts:
        return pl.from_arrow(_RAW_COLL.empty_table())
    df = pl.concat(parts, how="vertical_relaxed", rechunk=True)
    if st.slow_coll:  # the columnar rows are in line order already
        df = df.sort(["line", "sub"])
    return df


def _prepare_raw(st: _Parser, comms: list[_Comm]) -> pl.DataFrame:
    """All COLL rows in line order, orphans resolved, the RCCL/Ray tail and the prefix split; registers
    every process seen (devices, launcher prefixes, RCCL globalrank) on the parser state."""
    raw = _raw_coll(st)
    if raw.height == 0:
        return raw.with_columns(pl.lit(None, pl.Int64).alias("task"), pl.lit(None, pl.Int32).alias(
            "rccl_globalrank"), pl.lit(None, pl.Int64).alias("repeated"), pl.lit(None, pl.String).alias(
            "log_time"))
    if raw["orphan"].any():
        raw = _resolve_orphans(raw, comms)
    # rest: RCCL task/globalrank, Ray repeats
    if raw["rest"].is_not_null().any():
        ext = raw.select(pl.col("rest").str.extract_groups(REST.pattern).alias("r")).unnest("r")
        raw = raw.with_columns(ext["task"].cast(pl.Int64, strict=False).alias("task"),  # too big: null
                               ext["grank"].cast(pl.Int32, strict=False).alias("rccl_globalrank"),
                               ext["rep"].cast(pl.Int64, strict=False).alias("repeated"))
    else:
        raw = raw.with_columns(pl.lit(None, pl.Int64).alias("task"),
                               pl.lit(None, pl.Int32).alias("rccl_globalrank"),
                               pl.lit(None, pl.Int64).alias("repeated"))
    gr = raw.filter(pl.col("rccl_globalrank").is_not_null() & pl.col("host").is_not_null())
    for host, pid, g in gr.group_by(["host", "pid"]).agg(pl.col("rccl_globalrank").first()).iter_rows():
        st.proc(host, pid).rccl_globalrank = g
    st.counts["ray_repeats"] += int(raw["repeated"].fill_null(0).sum())
    # prefix: launcher part and 2.26+ timestamp, worked out once per distinct prefix
    if raw["prefix"].is_not_null().any():
        uniq = raw.select(pl.col("prefix").unique().cast(pl.String))["prefix"].drop_nulls().to_list()
        launcher, stamp = {}, {}
        for text in uniq:
            m = TIMESTAMP.search(text)
            launcher[text] = (text[:m.start()] if m else text) or None
            stamp[text] = m["ts"] if m else None
        pmap = pl.DataFrame({"prefix": uniq, "_l": [launcher[u] for u in uniq],
                             "_t": [stamp[u] for u in uniq]},
                            schema={"prefix": pl.String, "_l": pl.String, "_t": pl.String}).with_columns(
            pl.col("prefix").cast(pl.Categorical), pl.col("_l").cast(pl.Categorical))
        mapped = raw.select("prefix").join(pmap, on="prefix", how="left", maintain_order="left")
        raw = raw.with_columns(mapped["_l"].alias("prefix"), mapped["_t"].alias("log_time"))
        if any(stamp.values()):
            st.era(lo=(2, 26, 0))
    else:
        raw = raw.with_columns(pl.lit(None, pl.String).alias("log_time"))
    named = raw.select("host", "pid", "prefix", "device").filter(pl.col("host").is_not_null())
    for host, pid in named.select("host", "pid").unique().iter_rows():
        st.proc(host, pid)
    for host, pid, pres in named.filter(pl.col("prefix").is_not_null()).group_by(["host", "pid"]).agg(
            pl.col("prefix").unique().head(4)).iter_rows():
        proc = st.proc(host, pid)
        for x in sorted(pres):
            if x not in proc.prefixes and len(proc.prefixes) < 4:
                proc.prefixes.append(x)
    for host, pid, devs in named.filter(pl.col("device").is_not_null()).group_by(["host", "pid"]).agg(
            pl.col("device").unique()).iter_rows():
        st.proc(host, pid).devices.update(devs)
    return raw


def _collectives(raw: pl.DataFrame, comms: list[_Comm], procs: pl.DataFrame,
                 world: dict[tuple[str | None, int | None], _Comm]) -> pl.DataFrame:
    """The COLL rows with everything resolved: communicator instance (as of the line: pointers are
    reused after destroy), pg, seq, global rank, op/dtype names, bytes, peer. Joins run on narrow
    integer keys and add columns to the wide frame, which is never copied; per-value mappings are
    computed once per distinct value (ops, datatypes, communicators) in Python."""
    if raw.height == 0:
        return pl.DataFrame(schema=_COLL_FRAME)
    by_idx = {c.idx: c for c in comms}
    keys = raw.select("line", "host", "pid", "comm").with_row_index("_r")
    idx = keys.join_asof(_comm_frame(comms).sort("first_line"), left_on="line", right_on="first_line",
                         by=["host", "pid", "comm"], strategy="backward", check_sortedness=False)
    if not idx["_r"].is_sorted():
        idx = idx.sort("_r")
    idx = idx["comm_idx"]
    pg_ids = sorted({c.comm_id for c in comms if c.comm_id})
    pgi_of = {cid: i for i, cid in enumerate(pg_ids)}
    world_idx = {c.idx for c in world.values()}
    world_ids = {(h, p): c.comm_id for (h, p), c in world.items()}
    ci = pl.col("comm_idx")
    pr = procs.with_columns(pl.col("host").cast(pl.Categorical))
    grank = raw.select("host", "pid").join(pr.select("host", "pid", "global_rank"), on=["host", "pid"],
                                           how="left", maintain_order="left")["global_rank"]
    df = raw.with_columns(idx, grank)
    ops = {o: _norm_op(o) for o in df.select(pl.col("op_raw").unique().cast(pl.String))["op_raw"]
           .to_list() if o is not None}
    dts = df["dtype_id"].unique().drop_nulls().to_list()
    dt_name = {d: DTYPES[d][0] if d in DTYPES else f"unknown({d})" for d in dts}
    dt_size = {d: DTYPES[d][1] for d in dts if d in DTYPES}
    # is the call on its process's world comm (the one its global rank comes from)?
    in_world = {c.idx: c.idx in world_idx or (c.comm_id is not None and world_ids.get((c.host, c.pid))
                                                == c.comm_id) for c in comms}
    df = df.with_columns(
        ci.replace_strict({i: c.comm_id for i, c in by_idx.items()}, default=None, return_dtype=pl.String)
        .alias("pg"),
        ci.replace_strict({i: pgi_of.get(c.comm_id) for i, c in by_idx.items()}, default=None,
                          return_dtype=pl.Int32).alias("pgi"),
        ci.replace_strict({i: c.rank for i, c in by_idx.items()}, default=None, return_dtype=pl.Int32)
        .alias("comm_rank"),
        ci.replace_strict(in_world, default=False, return_dtype=pl.Boolean).alias("_world"),
        pl.col("op_raw").cast(pl.String).replace_strict(ops, default=None, return_dtype=pl.String)
        .alias("op"),
        pl.col("dtype_id").replace_strict(dt_name, default=None, return_dtype=pl.String).alias("dtype"),
        pl.col("dtype_id").replace_strict(dt_size, default=None, return_dtype=pl.Int64).alias("_size"),
    )
    df = df.with_columns(
        # per (process, communicator instance); calls whose comm never had an Init line: per pointer
        pl.when(pl.col("host").is_not_null()).then(
            pl.int_range(pl.len(), dtype=pl.Int64).over(
                ["host", "pid", "comm", pl.col("pgi").fill_null(-1)])).alias("seq"),
        (pl.col("count") * pl.col("_size") * pl.when(pl.col("op").is_in(FULL_BUFFER_OPS))
         .then(pl.col("nranks").cast(pl.Int64)).otherwise(1)).alias("bytes"),
        pl.when(pl.col("op").is_in(ROOTED_OPS)).then(pl.col("root")).otherwise(None).alias("peer_comm_rank"),
    ).drop("_size")
    # peer -> global rank: identity in the process's world comm, else the member's Init line in this file
    members = _members(comms, procs)
    if members.height:
        mem = members.with_columns(
            pl.col("comm_id").replace_strict(pgi_of, default=None, return_dtype=pl.Int32).alias("pgi"),
        ).select("pgi", "comm_rank", "_member_grank")
        mg = df.select("pgi", "peer_comm_rank").join(mem, left_on=["pgi", "peer_comm_rank"],
                                                     right_on=["pgi", "comm_rank"], how="left",
                                                     maintain_order="left")["_member_grank"]
    else:
        mg = pl.Series("_member_grank", [None] * df.height, pl.Int32)
    df = df.with_columns(mg.alias("_mg")).with_columns(
        pl.when(pl.col("_world")).then(pl.col("peer_comm_rank")).otherwise(pl.col("_mg")).cast(pl.Int32)
        .alias("_pglob"))
    df = df.with_columns(
        pl.col("_pglob").is_not_null().alias("peer_is_global"),
        pl.coalesce("_pglob", "peer_comm_rank").cast(pl.Int32).alias("peer"),
        pl.coalesce(pl.col("rccl_globalrank"), pl.col("global_rank")).cast(pl.Int32).alias("global_rank"),
    )
    df = df.with_columns(
        pl.col("global_rank").is_not_null().alias("rank_is_global"),
        pl.coalesce(pl.col("global_rank"), pl.col("comm_rank")).cast(pl.Int32).alias("rank"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("collective_id"),
        pl.lit(None, pl.String).alias("algorithm"), pl.lit(None, pl.String).alias("protocol"),
    )
    return df.select(list(_COLL_FRAME))


#: the resolved COLL frame (the ``collectives`` columns, the ``nccl_calls`` columns and join keys)
_COLL_FRAME = {
    "rank": pl.Int32, "collective_id": pl.Int64, "pg": pl.String, "seq": pl.Int64, "op": pl.String,
    "dtype": pl.String, "count": pl.Int64, "bytes": pl.Int64, "nranks": pl.Int32, "peer": pl.Int32,
    "algorithm": pl.String, "protocol": pl.String, "stream": pl.Categorical, "line": pl.Int64,
    "pgi": pl.Int32, "dtype_id": pl.Int32,
    "host": pl.Categorical, "pid": pl.Int64, "tid": pl.Int64, "device": pl.Int32, "comm": pl.Categorical,
    "comm_idx": pl.Int64, "comm_rank": pl.Int32, "global_rank": pl.Int32, "rank_is_global": pl.Boolean,
    "peer_comm_rank": pl.Int32, "peer_is_global": pl.Boolean, "opcount": pl.Int64, "redop": pl.Int32,
    "in_place": pl.Boolean, "prefix": pl.Categorical, "log_time": pl.String, "orphan": pl.Boolean,
    "task": pl.Int64, "repeated": pl.Int64,
}
#: columns of ``nccl_calls`` (aligned with ``collectives``)
_CALLS_SCHEMA = ("collective_id", "line", "host", "pid", "tid", "device", "comm", "comm_rank",
                 "global_rank", "rank_is_global", "peer_comm_rank", "peer_is_global", "opcount", "redop",
                 "in_place", "prefix", "log_time", "orphan", "task", "repeated")


def _members(comms: list[_Comm], procs: pl.DataFrame) -> pl.DataFrame:
    """(comm_id, rank in comm) -> global rank of the member process, from the Init lines in the file
    (dropped when two processes claim the same slot: colliding synthetic ids)."""
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
    communicator at that pointer, the line is that process's. A widowed prefix paired with it (kept in
    host/pid) is accepted only if that process has the pointer."""
    owners: dict[str, set[tuple[str | None, int | None]]] = defaultdict(set)
    for c in comms:
        if c.host is not None:
            owners[c.comm].add((c.host, c.pid))
    hosts, pids = raw["host"].cast(pl.String).to_list(), raw["pid"].to_list()
    orphan, comm = raw["orphan"].to_list(), raw["comm"].cast(pl.String).to_list()
    for i in np.flatnonzero(np.asarray(orphan, bool)).tolist():
        cands = owners.get(comm[i], set())
        if (hosts[i], pids[i]) in cands:
            continue
        if len(cands) == 1:
            hosts[i], pids[i] = next(iter(cands))
        else:
            hosts[i], pids[i] = None, None
    return raw.with_columns(pl.Series("host", hosts, pl.String).cast(pl.Categorical),
                            pl.Series("pid", pids, pl.Int64))


def _context_index(st: _Parser, coll: pl.DataFrame) -> dict[tuple[str, int], Any]:
    """Per process: its communicator instances and the (line, comm instance) of its COLL lines, to
    attribute lines that name no communicator (transport, ring, tree, channel counts)."""
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


def _topology(st: _Parser, comms: list[_Comm], ctx: dict[tuple[str, int], Any],
              procs: pl.DataFrame) -> tuple[pa.Table, pa.Table]:
    """TOPOLOGY rows and the aligned ``nccl_connections`` rows, one per transport line."""
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
    rows = _fit(rows, TOPOLOGY)
    topo = table(TOPOLOGY, {k: [r[k] for r in rows] for k in TOPOLOGY.names}) if rows else \
        TOPOLOGY.empty_table()
    schema = pa.schema([("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()),
                        ("comm", pa.string()), ("channel", pa.int32()), ("conn", pa.int32()),
                        ("src", pa.int32()), ("dst", pa.int32()), ("src_dev", pa.string()),
                        ("dst_dev", pa.string()), ("dev_kind", pa.string()), ("global_rank", pa.int32()),
                        ("orphan", pa.bool_())])
    return topo, _rows_table(extra, schema)


def _graph(st: _Parser, comms: list[_Comm], ctx: dict[tuple[str, int], Any]) -> pa.Table:
    """Ring orders and trees per channel, plus channel counts folded into the communicators."""
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
                  "channel_hi": pl.Int32, "time_us": pl.Float64, "kernel": pl.String, "size_kind": pl.String,
                  "comm_id": pl.String, "seq": pl.Int64, "collective_id": pl.Int64, "matched_by": pl.String}


def _tuning_frame(st: _Parser) -> pl.DataFrame:
    """All TUNING lines, normalised: op (tracekit name or null before 2.23), bytes, algorithm,
    protocol (NCCL names, ids mapped), channel range, predicted time (2.20-2.23), symmetric kernel
    (2.27+), and ``size_kind``: ``S`` when the line prints the full buffer (2.20-2.23, numeric ids),
    ``cs`` when it prints count * element size (2.24+)."""
    parts = [pl.from_arrow(t) for t in st.tuning_tables]
    if st.slow_tuning:
        parts.append(pl.from_arrow(_typed_tuning(pa.Table.from_pylist(st.slow_tuning, schema=_TEXT_TUNING))))
    if not parts:
        return pl.DataFrame(schema=_RAW_TUNING_PL)
    raw = pl.concat(parts, how="vertical_relaxed").sort("line").with_columns(
        pl.col(c).cast(pl.String) for c in ("host", "op", "algo", "proto", "kernel"))
    algo_map = {**{str(i): a for i, a in enumerate(ALGOS)}, **_ALGO_NAMES}
    proto_map = {**{str(i): p for i, p in enumerate(PROTOS)}, **_PROTO_NAMES}
    op_map = pl.DataFrame({"op": list(OPS), "_op": list(OPS.values())})
    df = raw.join(op_map, on="op", how="left", maintain_order="left").with_columns(
        pl.coalesce("_op", pl.col("op").str.to_lowercase()).alias("op"),
        pl.col("bytes").cast(pl.Int64),
        pl.when(pl.col("kernel").is_not_null()).then(pl.lit("SYMMETRIC")).otherwise(
            pl.col("algo").str.to_lowercase().str.replace_all("_", "").replace_strict(
                algo_map, default=pl.col("algo").str.to_uppercase())).alias("algorithm"),
        pl.col("proto").str.to_lowercase().replace_strict(
            proto_map, default=pl.col("proto").str.to_uppercase()).alias("protocol"),
        pl.col("lo").alias("channel_lo"), pl.col("hi").alias("channel_hi"), pl.col("time").alias("time_us"),
        pl.when(pl.col("algo").str.contains(r"^\d+$")).then(pl.lit("S")).otherwise(pl.lit("cs"))
        .alias("size_kind"),
    ).drop("_op")
    if df["kernel"].is_not_null().any():
        st.era(lo=(2, 27, 0))
    if (df["size_kind"] == "S").any():
        st.era(lo=(2, 20, 0), hi=(2, 23, 99))
        if df.filter(pl.col("size_kind") == "S")["op"].is_not_null().any():
            st.era(lo=(2, 23, 0))
    elif df["algo"].is_not_null().any():
        st.era(lo=(2, 24, 0))
    return df.select(list(_RAW_TUNING_PL))


_RAW_TUNING_PL = {"line": pl.Int64, "host": pl.String, "pid": pl.Int64, "op": pl.String, "bytes": pl.Int64,
                  "algorithm": pl.String, "protocol": pl.String, "channel_lo": pl.Int32,
                  "channel_hi": pl.Int32, "time_us": pl.Float64, "kernel": pl.String, "size_kind": pl.String}


def _ordinal(df: pl.DataFrame, order: str) -> pl.DataFrame:
    """Add ``_k``: the 0-based rank of each row among the rows with the same ``_h``, by ``order``.
    A sort and a running index, not a window: windows over very many tiny groups are slow."""
    df = df.sort(["_h", order])
    i = pl.int_range(pl.len(), dtype=pl.Int64)
    start = pl.when(pl.col("_h") != pl.col("_h").shift(1)).then(i).otherwise(None).fill_null(0)
    return df.with_columns((i - pl.when(i == 0).then(0).otherwise(start).cum_max()).alias("_k"))


def _attach_tuning(st: _Parser, coll: pl.DataFrame) -> pl.DataFrame:
    """Match each TUNING line to the call it describes, columnar.

    Rank 0 of a communicator prints TUNING lines after the COLL lines of the group (one
    ncclGroupEnd), in the group's order. So, per process, its COLL lines on comms where it is rank 0
    (send/recv excluded) and its TUNING lines are cut into groups (a COLL line after a TUNING line
    starts a new group), and inside a group the k-th TUNING line of an (op, size) is the k-th call of
    that (op, size). Passes, each on what is still unmatched: op + the size the era prints (S up to
    2.23, count*size from 2.24), op + the other size, size only (2.20-2.22 lines name no op), op only.
    ``matched_by`` records the pass."""
    tun = _tuning_frame(st)
    if tun.height == 0:
        return pl.DataFrame(schema=_TUNING_SCHEMA)
    tun = tun.with_columns(pl.col("host").cast(pl.Categorical))
    sizes = pl.DataFrame({"dtype": list(DTYPE_SIZES), "_s": list(DTYPE_SIZES.values())},
                         schema={"dtype": pl.String, "_s": pl.Int64})
    calls = (coll.join(tun.select("host", "pid").unique(), on=["host", "pid"], how="semi")
             .filter(~pl.col("op").is_in(["send", "recv"])
                     & (pl.col("comm_rank").is_null() | (pl.col("comm_rank") == 0)))
             .join(sizes, on="dtype", how="left")
             .select("host", "pid", "line", "op", pl.col("bytes").alias("S"),
                     (pl.col("count") * pl.col("_s")).alias("cs"), "pg", "seq", "collective_id"))
    key = ["host", "pid"]
    tun = tun.with_row_index("_tid").with_columns(pl.col("_tid").cast(pl.Int64))
    ev = pl.concat([
        calls.select(*key, "line", pl.col("collective_id").alias("_id"), pl.lit(False).alias("_t")),
        tun.select(*key, "line", pl.col("_tid").alias("_id"), pl.lit(True).alias("_t")),
    ]).sort([*key, "line", "_t"], maintain_order=True)
    ev = ev.with_columns(
        ((~pl.col("_t")) & pl.col("_t").shift(1).over(key).fill_null(False)).cast(pl.Int64)
        .cum_sum().over(key).alias("_g"))
    calls = calls.join(ev.filter(~pl.col("_t")).select(pl.col("_id").alias("collective_id"), "_g"),
                       on="collective_id", how="left")
    tun = tun.join(ev.filter(pl.col("_t")).select(pl.col("_id").alias("_tid"), "_g"), on="_tid", how="left")
    matched: list[pl.DataFrame] = []
    left_t, left_c = tun, calls  # what is still unmatched

    def run(which: pl.Expr, tkeys: list[str], ckeys: list[str], how: str) -> None:
        nonlocal left_t, left_c
        tsub = left_t.filter(which)
        if tsub.height == 0 or left_c.height == 0:
            return
        # the k-th line of a key meets the k-th call of the same key; one hashed key column keeps the
        # windows cheap (groups are tiny: a few calls per ncclGroup)
        th = pl.struct([pl.col(c).cast(pl.String) if c == "host" else pl.col(c) for c in tkeys]).hash()
        ch = pl.struct([pl.col(c).cast(pl.String) if c == "host" else pl.col(c) for c in ckeys]).hash()
        tsub = _ordinal(tsub.with_columns(th.alias("_h")), "_tid")
        csub = _ordinal(left_c.with_columns(ch.alias("_h")), "collective_id")
        m = tsub.join(csub.select("_h", "_k", "pg", "seq", "collective_id"), on=["_h", "_k"], how="inner")
        if m.height:
            matched.append(m.select("_tid", pl.col("pg").alias("comm_id"), "seq", "collective_id",
                                    pl.lit(how).alias("matched_by")))
            left_t = left_t.join(m.select("_tid"), on="_tid", how="anti")
            left_c = left_c.join(m.select("collective_id"), on="collective_id", how="anti")

    named, kind_is = pl.col("op").is_not_null(), pl.col("size_kind")
    for kind, other in (("S", "cs"), ("cs", "S")):
        for size in (kind, other):
            run(named & (kind_is == kind), [*key, "_g", "op", "bytes"], [*key, "_g", "op", size], "op+bytes")
            run(~named & (kind_is == kind), [*key, "_g", "bytes"], [*key, "_g", size], "bytes")
    run(named, [*key, "_g", "op"], [*key, "_g", "op"], "op")
    links = pl.concat(matched) if matched else pl.DataFrame(
        schema={"_tid": pl.Int64, "comm_id": pl.String, "seq": pl.Int64, "collective_id": pl.Int64,
                "matched_by": pl.String})
    df = tun.join(links, on="_tid", how="left").sort("line").with_columns(
        pl.col("host").cast(pl.String)).select(list(_TUNING_SCHEMA))
    unmatched = df.filter(pl.col("collective_id").is_null()).height
    if unmatched:
        st.diagnostics.append(Diagnostic(st.path, f"{unmatched} of {df.height} TUNING lines match no "
                                         "preceding COLL line of their process (algorithm/protocol "
                                         "left unknown for those calls)"))
    return df


def _apply_tuning(coll: pl.DataFrame, tuning: pl.DataFrame) -> pl.DataFrame:
    """Copy algorithm/protocol to every member's row of the same (pg, seq) (and to the matched row)."""
    m = tuning.filter(pl.col("collective_id").is_not_null())
    if m.height == 0:
        return coll
    hit = coll.select("collective_id", "pgi", "seq").join(
        m.select("collective_id", "algorithm", "protocol"), on="collective_id", how="inner")
    by_id = hit.select("collective_id", pl.col("algorithm").alias("_a1"), pl.col("protocol").alias("_p1"))
    by_seq = hit.filter(pl.col("pgi").is_not_null()).group_by(["pgi", "seq"]).agg(
        pl.col("algorithm").first().alias("_a2"), pl.col("protocol").first().alias("_p2"))
    k = coll.select("collective_id", "pgi", "seq").join(by_id, on="collective_id", how="left",
                                                        maintain_order="left").join(
        by_seq, on=["pgi", "seq"], how="left", maintain_order="left")
    return coll.with_columns(k.select(pl.coalesce("_a1", "_a2").alias("algorithm"),
                                      pl.coalesce("_p1", "_p2").alias("protocol")))


def _check_sizes(st: _Parser, coll: pl.DataFrame) -> None:
    """Members of one call must agree on op, count, datatype and size of the comm (send/recv pairs
    legitimately differ and are not checked)."""
    if coll.height == 0:
        return
    sig = pl.struct(pl.col("op"), pl.col("count"), pl.col("dtype_id"), pl.col("nranks")).hash()
    g = coll.filter(pl.col("pgi").is_not_null() & ~pl.col("op").is_in(["send", "recv"])).select(
        "pgi", "seq", "line", sig.alias("_h")).group_by(["pgi", "seq"]).agg(
        (pl.col("_h").min() != pl.col("_h").max()).alias("_bad"), pl.col("line").min().alias("_line"))
    bad = g.filter(pl.col("_bad")).sort("_line")
    if bad.height:
        first = bad.row(0, named=True)
        pg = coll.filter(pl.col("pgi") == first["pgi"])["pg"][0]
        st.diagnostics.append(Diagnostic(
            st.path, f"{bad.height} calls disagree between ranks on op/count/datatype/nranks for the "
            f"same (commId, seq) -- first: pg {pg} seq {first['seq']}; the log is missing or "
            "reordering COLL lines (or ids collide), so cross-rank matching of these calls is unreliable",
            line=first["_line"]))


def _counts_diagnostics(st: _Parser, damage: _Damage, coll: pl.DataFrame) -> None:
    path, c = st.path, st.counts
    if c["unparsed_lines"]:
        ex = ", ".join(map(str, st.unparsed_examples))
        st.diagnostics.append(Diagnostic(
            path, f"{c['unparsed_lines']} of {c['lines']} lines are not NCCL log lines or are damaged "
            f"(skipped; first at lines {ex})", line=st.unparsed_examples[0]))
    if damage.overlong or c["overlong_lines"]:
        st.diagnostics.append(Diagnostic(
            path, f"{len(damage.overlong) + c['overlong_lines']} lines longer than {MAX_LINE} bytes were cut "
            "or skipped (binary data?)", line=damage.overlong[0] if damage.overlong else None))
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
