"""The entry points of the NCCL log parser (:mod:`tracekit.parsers.nccl`, whose docstring is the format's
contract): :func:`sniff`, and :func:`parse` -- the input read as blocks of whole lines (:data:`BLOCK`,
:data:`MAX_LINE`), each block through the columnar and per-line paths (:mod:`.lines`), then what needs the
whole log resolved (:mod:`.comms`, :mod:`.tuning`) into the output tables (:mod:`.tables`) and the summary of
what was not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.schema import COLLECTIVES, ParsedFile, table

from ..source import iter_blocks
from .comms import (
    _attribute,
    _comm_index,
    _context_index,
    _infer_ranks,
    _process_ranks,
    _resolve_comm_ids,
)
from .grammar import _SNIFF
from .lines import _Parser
from .tables import (
    _CALLS_SCHEMA,
    _WARN_SCHEMA,
    _WATCHDOG_SCHEMA,
    _check_sizes,
    _collectives,
    _comms_table,
    _communicators,
    _graph,
    _meta,
    _network,
    _plain,
    _prepare_raw,
    _rows_table,
    _topology,
)
from .tuning import _apply_tuning, _attach_tuning

PARSER_VERSION = "5"
FORMAT = "nccl-log"

#: Decompressed bytes per block: big enough to amortise the per-block kernels, small enough to keep
#: the transient memory of a block (its tokens) near 60 MB.
BLOCK = 4 << 20
#: Longest line kept whole (NCCL itself cuts at 1 KB; launcher prefixes add a little). Longer runs
#: without a newline are cut here and counted, so a binary file cannot exhaust memory.
MAX_LINE = 64 << 10
#: Individual diagnostics for the first WARN lines; the rest are counted in one summary.
MAX_WARN_DIAGNOSTICS = 20
#: Kinds of not-understood lines named in the diagnostic (all are in ``meta["unrecognised"]``).
MAX_UNKNOWN_SHOWN = 6


def sniff(head: bytes) -> bool:
    """True for text with NCCL debug lines of any era and prefix form: the anchor (``host:pid:tid [dev] NCCL
    INFO``) anywhere, also behind launcher prefixes; ``[dev] NCCL INFO`` / ``NCCL INFO`` lines without host
    prefix; an ``NCCL version`` line. False for JSON, binary data and text that merely mentions NCCL."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text or text[:1] == b"{" or re.match(rb"\[\s*[{\]\"]", text):
        return False
    if b"\x00" in text[:4096]:  # damaged lines (NUL bytes) are read past; a file mostly of them is binary
        lines = text[:4096].split(b"\n")
        damaged = sum(b"\x00" in line for line in lines)
        if damaged * 2 > len(lines):
            return False
        head = b"\n".join(line for line in head.split(b"\n") if b"\x00" not in line)
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


# ---------------------------------------------------------------------------------------------------
# putting it together


def parse(path: str) -> ParsedFile:
    """Parse one NCCL debug log (plain or gzip) into a :class:`ParsedFile` (see the module docstring).

    Raises :class:`TraceError` when the file cannot be read, is empty, or holds no NCCL line."""
    st = _Parser(path, MAX_LINE)
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
    has_nccl = (st.counts["nccl_lines"] or st.versions or st.counts["orphan_lines"] or st.watchdog)
    if not has_nccl:
        raise TraceError(path, "no NCCL log lines found (expected lines like "
                         "'host:pid:tid [dev] NCCL INFO ...' from NCCL_DEBUG=INFO)", line=1)
    return _finish(st, damage)


def _finish(st: _Parser, damage: _Damage) -> ParsedFile:
    """Resolve what needs the whole log (communicator ids, ranks, attribution, tuning) into tables."""
    path = st.path
    diags = st.diagnostics
    if st.counts["init_complete_with_id"] and not st.counts["init_start_lines"] and st.era_lo < (2, 18, 3):
        st.era(hi=(2, 18, 2))  # commIds but no Init START lines: 2.16-2.18.1 (unless newer forms say an excerpt)
    raw = _prepare_raw(st, st.comms)
    comm_idx = _comm_index(st, raw)
    ctx = _context_index(st, raw.select("host", "pid", "line").with_columns(comm_idx))
    conn_comms, graph_comms = _attribute(st, ctx)
    _infer_ranks(st)
    comms = _resolve_comm_ids(st)
    procs_df, world = _process_ranks(st)
    coll = _collectives(raw, comm_idx, comms, procs_df, world)
    del raw
    topo, conns = _topology(st, conn_comms, procs_df)
    graph = _graph(st, graph_comms, ctx)
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
    communicators = _communicators(st, comms, procs_df, coll)
    meta = _meta(st, comms, procs_df, world)
    tables = {
        "nccl_calls": calls,
        "nccl_comms": comm_rows,
        "nccl_connections": conns,
        "nccl_graph": graph,
        "nccl_tuning": tuning.to_arrow(),
        "nccl_warnings": _rows_table(st.warnings, _WARN_SCHEMA),
        "pytorch_watchdog": _rows_table(st.watchdog, _WATCHDOG_SCHEMA),
        "communicators": communicators,
        "nccl_network": _network(st),
    }
    tables = {k: _plain(v) for k, v in tables.items()}
    complete = damage.read_error is None
    if damage.read_error is not None:
        diags.append(Diagnostic(path, f"input ends early: {damage.read_error.message}; kept the "
                                f"{st.counts['lines']} lines before it", offset=damage.read_error.offset))
    return ParsedFile(path=path, format=FORMAT, collectives=collectives, topology=topo, tables=tables,
                      meta=meta, diagnostics=diags, complete=complete)


def _counts_diagnostics(st: _Parser, damage: _Damage, coll: pl.DataFrame) -> None:
    path, c = st.path, st.counts
    text_lines = c["unparsed_lines"] - c["damaged_lines"]
    if text_lines > 0 and st.unparsed_examples:
        ex = ", ".join(map(str, st.unparsed_examples))
        st.diagnostics.append(Diagnostic(
            path, f"{text_lines} of {c['lines']} lines are not NCCL log lines "
            f"(skipped; first at lines {ex})", line=st.unparsed_examples[0]))
    if st.unknown:
        kinds = sorted(st.unknown.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
        shown = "; ".join(f"{n}x {level} '{kind}' (first at line {first}: {text})"
                          for (level, kind), (n, first, text, _) in kinds[:MAX_UNKNOWN_SHOWN])
        more = len(kinds) - MAX_UNKNOWN_SHOWN
        st.diagnostics.append(Diagnostic(
            path, f"{c['unrecognised_lines']} NCCL lines of {len(kinds)} kinds were not understood and skipped: "
            f"{shown}" + (f"; and {more} more kinds (meta 'unrecognised')" if more > 0 else ""),
            line=min(v[1] for v in st.unknown.values())))
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


__all__ = ["BLOCK", "FORMAT", "MAX_LINE", "PARSER_VERSION", "parse", "sniff"]
