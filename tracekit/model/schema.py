"""The Arrow data model of tracekit, in one place (DESIGN.md "The data model").

Every parser produces tables with these schemas and every analysis consumes them. All times are int64
nanoseconds on the rank's own clock (``clock_offset_ns`` in ``ranks`` maps them to the job clock);
durations are int64 ``*_ns``; ratios are float ``*_share`` / ``*_utilisation``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tracekit.model.diagnostics import Diagnostic

if TYPE_CHECKING:
    import numpy as np

DICT_STR = pa.dictionary(pa.int32(), pa.string())


def _col(name: str, type_: pa.DataType, doc: str | None = None) -> pa.Field:
    """A schema field whose documentation travels in its Arrow metadata (and so into Parquet)."""
    return pa.field(name, type_, metadata={"doc": doc} if doc else None)


#: Event kinds (DESIGN.md). ``queue`` is Horovod's QUEUE phase: waiting behind earlier work on the
#: communication stream, neither transfer nor compute.
KINDS: tuple[str, ...] = (
    "compute",
    "comm",
    "memory",
    "cpu_op",
    "runtime",
    "annotation",
    "wait",
    "queue",
)

EVENTS = pa.schema(
    [
        _col("rank", pa.int32(), doc="global rank (null until the TraceSet assigns one)"),
        _col("lane", DICT_STR, doc="gpu{device}/stream{stream}, cpu/tid {tid}, or a format's own"),
        _col("kind", DICT_STR, doc="one of KINDS"),
        _col("name", DICT_STR),
        _col("cat", DICT_STR, doc="the source category, verbatim"),
        _col("start_ns", pa.int64()),
        _col("dur_ns", pa.int64()),
        _col("pid", pa.int64()),
        _col("tid", pa.int64()),
        _col("device", pa.int32()),
        _col("stream", pa.int64()),
        _col("correlation", pa.int64(), doc="CUPTI correlation id (launch <-> device activity)"),
        _col("external_id", pa.int64()),
        _col("bytes", pa.int64(), doc="bytes moved by a memcpy/memset or communication event"),
        _col("sync_stream", pa.int64(), doc="synchronisation events: the stream waited on"),
        _col("sync_correlation", pa.int64(), doc="synchronisation events: correlation of the event record waited on"),
        _col("iteration", pa.int64(), doc="ProfilerStep number (or other iteration id), null if none"),
        _col("collective_id", pa.int64(), doc="row of this rank's collectives table, null if none"),
    ]
)

COLLECTIVES = pa.schema(
    [
        _col("rank", pa.int32()),
        _col("collective_id", pa.int64(), doc="per-rank id, referenced by events.collective_id"),
        _col("pg", pa.string(), doc="process group name (Kineto) or NCCL commId"),
        _col("seq", pa.int64(), doc="sequence number shared by all members, when the source has one"),
        _col("op", pa.string(), doc="allreduce, allgather, reduce_scatter, broadcast, reduce, ..."),
        _col("dtype", pa.string()),
        _col("count", pa.int64(), doc="elements, NCCL meaning (FORMATS.md section 4)"),
        _col("bytes", pa.int64(), doc="S of the nccl-tests convention (full buffer)"),
        _col("nranks", pa.int32()),
        _col("peer", pa.int32(), doc="global peer rank of send/recv, root of rooted ops"),
        _col("algorithm", pa.string()),
        _col("protocol", pa.string()),
        _col("start_ns", pa.int64(), doc="start of the transfer activity (kernel / gloo work)"),
        _col("end_ns", pa.int64()),
        _col("lane", pa.string()),
        _col("source", pa.string(), doc="kineto-kernel, kineto-cpu, gloo, nccl-log, horovod"),
        _col("size_source", pa.string(), doc="where bytes came from: args (collective metadata of the call or "
             "its kernel), shapes (Input Dims x Input type, record_shapes), nccl-log, horovod, peer (another "
             "member of the matched instance); null: unknown"),
    ]
)

#: values of ``collectives.size_source``, most direct first
SIZE_SOURCES = ("args", "shapes", "nccl-log", "horovod", "peer")

RANKS = pa.schema(
    [
        _col("rank", pa.int32()),
        _col("rank_source", pa.string(), doc="distributedInfo, file name, order, nccl-init, ..."),
        _col("host", pa.string()),
        _col("pid", pa.int64()),
        _col("device", pa.int32()),
        _col("world_size", pa.int32()),
        _col("backend", pa.string()),
        _col("source_files", pa.list_(pa.string())),
        _col("format", pa.string()),
        _col("format_version", pa.string()),
        _col("clock_offset_ns", pa.int64(), doc="add to this rank's times to get the job clock"),
        _col("clock_estimate_ns", pa.int64(), doc="offset estimated from collective end times, applied or not "
                                                  "(null: nothing to estimate from)"),
        _col("clock_residual_ns", pa.int64(), doc="median |end - instance's median end| over this rank's matched "
                                                  "collectives, after alignment"),
        _col("clock_method", pa.string(), doc="reference, same host, estimated, below noise (estimate "
                                          "not significant, not applied), implausible (> 60 s, not applied), "
                                          "unmatched, not aligned"),
        _col("events", pa.int64()),
        _col("bytes_lost", pa.int64(), doc="input bytes after the last complete record"),
        _col("complete", pa.bool_()),
    ]
)

ITERATIONS = pa.schema(
    [
        _col("rank", pa.int32()),
        _col("iteration", pa.int64()),
        _col("start_ns", pa.int64()),
        _col("end_ns", pa.int64()),
        _col("method", pa.string(), doc="ProfilerStep, step-marker, horovod-cycle, whole-trace, ..."),
    ]
)

TOPOLOGY = pa.schema(
    [
        _col("comm_id", pa.string()),
        _col("rank", pa.int32()),
        _col("nranks", pa.int32()),
        _col("channel", pa.int32()),
        _col("peer", pa.int32()),
        _col("direction", pa.string(), doc="send, receive or null"),
        _col("transport", pa.string(), doc="P2P, SHM, NET/IB, NET/Socket, ... (family)"),
        _col("detail", pa.string(), doc="the full 'via' text, e.g. NET/IB/3/GDRDMA"),
        _col("host", pa.string()),
    ]
)

#: One row per member of an NCCL communicator as a debug log shows it (the process that logged it, on its Init,
#: nNodes or Destroy line): which rank of which group sits on which host and GPU.
COMMUNICATORS = pa.schema(
    [
        _col("comm_id", pa.string(), doc="NCCL commId (equal on every member; synthetic-/inferred- ids where the log "
             "prints none, see the NCCL-log parser)"),
        _col("comm_id_source", pa.string(), doc="log, derived (2.27+ split hash), synthetic (before 2.16), inferred "
             "(no Init line)"),
        _col("rank", pa.int32(), doc="rank in the communicator"),
        _col("nranks", pa.int32()),
        _col("nnodes", pa.int32(), doc="nodes the communicator spans (its nNodes line, 2.12+)"),
        _col("local_ranks", pa.int32(), doc="members on this member's node (nNodes line)"),
        _col("local_rank", pa.int32()),
        _col("host", pa.string(), doc="host of the process (null where the log has no host prefix)"),
        _col("pid", pa.int64(), doc="pid of the process (negative: a log without host:pid prefixes)"),
        _col("global_rank", pa.int32(), doc="the process's rank in its largest communicator (the job's rank)"),
        _col("cuda_dev", pa.int32()),
        _col("nvml_dev", pa.int32()),
        _col("bus_id", pa.string(), doc="PCI bus id of the GPU (hex, as printed)"),
        _col("nccl_version", pa.string()),
        _col("network", pa.string(), doc="the network the process used: IB, Socket or a plugin's name"),
        _col("parent_comm_id", pa.string()),
        _col("color", pa.int32()),
        _col("key", pa.int32()),
        _col("coll_channels", pa.int32()),
        _col("nvls_channels", pa.int32()),
        _col("p2p_channels", pa.int32()),
        _col("calls", pa.int64(), doc="COLL lines on it (0 without NCCL_DEBUG_SUBSYS=COLL)"),
        _col("init_line", pa.int64(), doc="line of its Init COMPLETE (or START, nNodes, Destroy) line"),
        _col("end", pa.string(), doc="destroy, abort or null"),
    ]
)

#: Rings and trees of NCCL communicators, one row per channel per line of the log that prints them.
NCCL_GRAPH = pa.schema(
    [
        _col("line", pa.int64()),
        _col("host", pa.string()),
        _col("pid", pa.int64()),
        _col("comm", pa.string(), doc="communicator pointer in the process"),
        _col("comm_id", pa.string()),
        _col("rank", pa.int32(), doc="rank in the communicator of the process the line is about"),
        _col("kind", pa.string(), doc="ring (the order, rank 0 prints it), ring_link (prev->rank->next, 2.19+) or "
             "tree (children->rank->parent)"),
        _col("channel", pa.int32()),
        _col("nchannels", pa.int32()),
        _col("value", pa.string()),
        _col("cut", pa.bool_(), doc="the line was cut (NCCL's line limit): the ring may be incomplete"),
    ]
)

#: The network devices NCCL's network used in each process (``NET/IB : Using ...``, ``NET/Socket : Using ...``),
#: with GPU Direct RDMA as the log says it.
NCCL_NETWORK = pa.schema(
    [
        _col("line", pa.int64()),
        _col("host", pa.string()),
        _col("pid", pa.int64()),
        _col("net", pa.string(), doc="IB, Socket or a plugin's name"),
        _col("index", pa.int32(), doc="NCCL's device index ([0], [1], ...)"),
        _col("device", pa.string(), doc="HCA (mlx5_0) or interface (eth0)"),
        _col("port", pa.int32(), doc="HCA port"),
        _col("link", pa.string(), doc="IB or RoCE (the HCA port's link layer); null for sockets"),
        _col("address", pa.string(), doc="the interface's address (sockets)"),
        _col("oob", pa.string(), doc="IB's out-of-band interface and address"),
        _col("gdr", pa.bool_(), doc="GPU Direct RDMA enabled (null: the log does not say)"),
        _col("gdr_line", pa.int64()),
        _col("gdr_reason", pa.string(), doc="what NCCL gave as the reason (no module, distance 5 > 4, ...)"),
    ]
)

#: Problems an NCCL log (or PyTorch's NCCL watchdog) shows, each with its file and line.
NCCL_PROBLEMS = pa.schema(
    [
        _col("kind", pa.string(), doc="warn, socket-fallback, gdr-disabled, version-mismatch, watchdog-timeout, "
             "stopped-first, ..."),
        _col("path", pa.string()),
        _col("line", pa.int64()),
        _col("host", pa.string()),
        _col("pid", pa.int64()),
        _col("rank", pa.int32()),
        _col("message", pa.string()),
    ]
)

#: The link class and transport of each process group's collectives, from the NCCL log (or the hosts).
GROUP_LINKS = pa.schema(
    [
        _col("pg", pa.string(), doc="process group as in collectives (default for calls that name none)"),
        _col("comm_id", pa.string(), doc="the NCCL communicator it is (null: several fit, all alike)"),
        _col("link_class", pa.string(), doc="inter (its traffic crosses hosts), intra (inside one host) or null"),
        _col("transport", pa.string(), doc="the transport that binds: NET/IB, NET/Socket, ... for inter; P2P, SHM, "
             "NVLS for intra"),
        _col("transports", pa.string(), doc="every transport its connections use, comma-separated"),
        _col("nnodes", pa.int32()),
        _col("source", pa.string(), doc="nccl-log (its communicator's lines), nccl-log by size (every communicator "
             "of its size alike) or hosts (the traces' host names; no transport)"),
    ]
)

#: How busy each link class was: transfer time of the collectives on it over the iteration time of its ranks.
LINK_BUSY = pa.schema(
    [
        _col("link_class", pa.string()),
        _col("transport", pa.string()),
        _col("ranks", pa.int32(), doc="ranks with calls on this class"),
        _col("calls", pa.int64()),
        _col("bus_bytes", pa.int64(), doc="null when a size is unknown"),
        _col("busy_ns", pa.int64(), doc="per rank, the union of its transfer time on this class, summed"),
        _col("wall_ns", pa.int64(), doc="the iteration time of those ranks"),
        _col("busy_share", pa.float64(), doc="busy_ns / wall_ns"),
    ]
)

BREAKDOWN = pa.schema(
    [
        _col("rank", pa.int32()),
        _col("iteration", pa.int64()),
        _col("start_ns", pa.int64()),
        _col("end_ns", pa.int64()),
        _col("wall_ns", pa.int64()),
        _col("compute_ns", pa.int64()),
        _col("overlapped_ns", pa.int64()),
        _col("exposed_comm_ns", pa.int64()),
        _col("memory_ns", pa.int64()),
        _col("idle_ns", pa.int64()),
        _col("wait_ns", pa.int64(), doc="part of exposed_comm spent waiting for other ranks"),
        _col("transfer_ns", pa.int64(), doc="part of exposed_comm spent moving data"),
        _col("comm_ns", pa.int64(), doc="union of communication activity (overlapped + exposed)"),
        _col("comm_bytes", pa.int64(), doc="collective payload bytes (S) in the window"),
        _col("bus_bytes", pa.int64(), doc="bus bytes (nccl-tests factors) of the collectives starting in the window"),
        _col("link_active_ns", pa.int64(), doc="union of communication time not known to be waiting: transfer "
                                               "time when wait_ns is known, all communication time otherwise"),
        _col("link_idle_ns", pa.int64(), doc="wall_ns - link_active_ns"),
        _col("busbw_gbps", pa.float64(), doc="achieved bus bandwidth while active, Gbit/s: 8 bus_bytes / "
                                             "link_active_ns"),
        _col("ideal_comm_ns", pa.int64(), doc="bus_bytes at the line rate (null without one)"),
        _col("link_utilisation", pa.float64(), doc="bus_bytes / (line rate x wall); null without a line rate"),
    ]
)

COLLECTIVE_INSTANCES = pa.schema(
    [
        _col("instance", pa.int64(), doc="id, in order of first arrival"),
        _col("pg", pa.string(), doc="process group (Kineto name, NCCL commId) or 'default' when unnamed"),
        _col("seq", pa.int64(), doc="sequence number shared by all members, when the sources have one"),
        _col("ordinal", pa.int64(), doc="call index among equal (pg, op, bytes) calls on each rank, when matched "
                                        "by order"),
        _col("matched_by", pa.string(), doc="pg+seq, order, p2p order, or unmatched"),
        _col("op", pa.string()),
        _col("bytes", pa.int64(), doc="S of the nccl-tests convention (largest member's, for all_to_all)"),
        _col("bus_bytes", pa.int64(), doc="bytes x bus factor of op and group size"),
        _col("nranks", pa.int32(), doc="size of the process group"),
        _col("ranks", pa.list_(pa.int32()), doc="the members seen in the traces"),
        _col("partial", pa.bool_(), doc="seen on fewer ranks than the group has"),
        _col("consistent", pa.bool_(), doc="false when a member ended before another arrived (after clock "
                                           "alignment): not the same call, or a damaged/sampled trace"),
        _col("sizes_agree", pa.bool_(), doc="false when members report different sizes for the same call"),
        _col("iteration", pa.int64(), doc="iteration of the first member's call"),
        _col("first_start_ns", pa.int64(), doc="job clock"),
        _col("last_start_ns", pa.int64(), doc="job clock: when the last member arrived"),
        _col("first_end_ns", pa.int64(), doc="job clock"),
        _col("last_end_ns", pa.int64(), doc="job clock"),
        _col("skew_ns", pa.int64(), doc="arrival skew: last_start_ns - first_start_ns"),
        _col("wait_ns", pa.int64(), doc="sum over members of last_start_ns - own start"),
        _col("transfer_ns", pa.int64(), doc="median over members of own end - last_start_ns"),
        _col("straggler_rank", pa.int32(), doc="the last to arrive; null for partial or inconsistent instances "
                                               "and when the skew is within the clocks' uncertainty"),
        _col("busbw_gbps", pa.float64(), doc="8 bus_bytes / transfer_ns, Gbit/s"),
        _col("link_utilisation", pa.float64(), doc="busbw / line rate (null without one)"),
    ]
)

COLLECTIVE_MEMBERS = pa.schema(
    [
        _col("instance", pa.int64()),
        _col("rank", pa.int32()),
        _col("collective_id", pa.int64(), doc="the member's row in collectives"),
        _col("bytes", pa.int64()),
        _col("start_ns", pa.int64(), doc="job clock"),
        _col("end_ns", pa.int64(), doc="job clock"),
        _col("wait_ns", pa.int64(), doc="last_start_ns - start_ns (null when the instance is inconsistent)"),
        _col("transfer_ns", pa.int64(), doc="end_ns - last_start_ns (null when the instance is inconsistent)"),
        _col("straggler", pa.bool_(), doc="this member arrived last"),
    ]
)

TOP_OPS = pa.schema(
    [
        _col("rank", pa.int32()),
        _col("class", pa.string(), doc="attribution class the time fell in: compute, overlapped, exposed_comm or "
             "memory (compute kernels count in compute and overlapped, communication in overlapped and "
             "exposed_comm, copies in memory)"),
        _col("kind", pa.string(), doc="event kind: compute, comm, memory (device activity, gloo work) or cpu_op "
             "(CPU-only ranks: top-level operators of each thread, nested calls folded in)"),
        _col("name", pa.string()),
        _col("calls", pa.int64(), doc="events of this name with time in this class"),
        _col("time_ns", pa.int64(), doc="time at least one of them ran in this class, inside the iteration windows "
             "(calls of this op running at once count once)"),
        _col("per_iteration_ns", pa.int64(), doc="time_ns / the rank's number of iteration windows"),
        _col("class_share", pa.float64(), doc="time_ns / the rank's time in this class, at most 1 (different ops "
             "running at once each count, so a class's shares can add up to more than 1)"),
        _col("rank_in_class", pa.int64(), doc="1 for the op with the most time in this class on this rank"),
    ]
)

IDLE_BREAKDOWN = pa.schema(
    [
        _col("rank", pa.int32()),
        _col("iteration", pa.int64()),
        _col("start_ns", pa.int64()),
        _col("end_ns", pa.int64()),
        _col("idle_ns", pa.int64(), doc="the breakdown window's idle_ns"),
        _col("host_bound_ns", pa.int64(), doc="idle gaps whose next device activity was launched after the gap "
             "began: the device waited for the CPU (null on CPU-only ranks)"),
        _col("sync_ns", pa.int64(), doc="idle time of the other gaps while a host thread was inside a "
             "synchronisation call (cuda*Synchronize, *StreamWaitEvent, blocking copies, cuda_sync records)"),
        _col("other_ns", pa.int64(), doc="the rest of idle_ns: host_bound_ns + sync_ns + other_ns = idle_ns"),
        _col("gaps", pa.int64(), doc="idle gaps in the window (null on CPU-only ranks)"),
        _col("device", pa.bool_(), doc="the rank has device activity (the split applies)"),
    ]
)

#: PyTorch Flight Recorder dumps (``parsers/flight_recorder``): one row per dump file read.
FR_DUMPS = pa.schema(
    [
        _col("path", pa.string()),
        _col("rank", pa.int32(), doc="the global rank: the digits that end the file name (PyTorch names each dump "
             "<prefix><rank>); null when the name has none"),
        _col("form", pa.string(), doc="pickle or json"),
        _col("version", pa.string(), doc="the dump's schema version (1.x: seq_id; 2.x: collective_seq_id, ...)"),
        _col("backend", pa.string(), doc="nccl, gloo, ...: the prefix of the entries' profiling names"),
        _col("comm_lib_version", pa.string(), doc="comm_lib_version (nccl_version before 2.10)"),
        _col("entries", pa.int64()),
        _col("with_stacks", pa.bool_(), doc="the entries carry their call stacks (pickle form, stacks included)"),
        _col("world_size_min", pa.int32(), doc="the job has at least this many ranks: the highest rank any group of "
             "its pg_config lists, plus one"),
    ]
)

#: One row per Flight Recorder entry (a collective or point-to-point call a rank issued), in the dump's order.
FR_ENTRIES = pa.schema(
    [
        _col("rank", pa.int32(), doc="the dump's rank (FR_DUMPS.rank)"),
        _col("path", pa.string()),
        _col("record_id", pa.int64(), doc="the entry's place in the rank's ring buffer (increasing)"),
        _col("pg_id", pa.int64(), doc="the process group's id in its rank's process"),
        _col("pg", pa.string(), doc="the process group's name (the same on every rank; pg_id before 2.0)"),
        _col("pg_desc", pa.string(), doc="its description: default_pg, a group_desc, undefined"),
        _col("collective_seq_id", pa.int64(), doc="the call's number among the group's collectives, equal on every "
             "member (seq_id before 2.0)"),
        _col("p2p_seq_id", pa.int64(), doc="the call's number among the group's point-to-point calls"),
        _col("op_id", pa.int64(), doc="logical op number (one per op inside a coalesced group)"),
        _col("is_p2p", pa.bool_()),
        _col("profiling_name", pa.string(), doc="as recorded, e.g. nccl:all_reduce, gloo:broadcast"),
        _col("op", pa.string(), doc="tracekit's op name (collectives.op)"),
        _col("input_sizes", pa.list_(pa.list_(pa.int64())), doc="the shape of each input tensor"),
        _col("output_sizes", pa.list_(pa.list_(pa.int64()))),
        _col("input_dtypes", pa.list_(pa.string())),
        _col("output_dtypes", pa.list_(pa.string())),
        _col("input_numel", pa.int64(), doc="elements over all input tensors"),
        _col("output_numel", pa.int64()),
        _col("state", pa.string(), doc="scheduled, started or completed when dumped (gloo: always scheduled)"),
        _col("time_created_ns", pa.int64(), doc="when the call was issued (the rank's wall clock, ns since the epoch)"),
        _col("time_started_ns", pa.int64(), doc="when its start was discovered (NCCL; null under gloo)"),
        _col("time_completed_ns", pa.int64(), doc="when its completion was discovered (NCCL; null under gloo)"),
        _col("duration_ns", pa.int64(), doc="device time of the collective (NCCL with TORCH_NCCL_ENABLE_TIMING)"),
        _col("retired", pa.bool_(), doc="the backend let go of the call: completed, or failed or timed out"),
        _col("timeout_ns", pa.int64(), doc="the process group's timeout for this call"),
        _col("thread_id", pa.string()),
        _col("thread_name", pa.string()),
        _col("frames", pa.string(), doc="the Python call stack, innermost first, one 'function at file:line' a line "
             "(null where the dump has none: JSON form)"),
    ]
)

#: Each dump's ``pg_config``: the process groups its rank knew, with their members.
FR_PG_CONFIG = pa.schema(
    [
        _col("rank", pa.int32(), doc="the rank whose dump says it"),
        _col("path", pa.string()),
        _col("pg", pa.string(), doc="the group's name ('' where gloo recorded none)"),
        _col("pg_desc", pa.string()),
        _col("ranks", pa.list_(pa.int32()), doc="its members (global ranks); null when unreadable"),
        _col("ranks_text", pa.string(), doc="the members as written"),
    ]
)

#: Each dump's ``pg_status`` (2.3+): per process group, the last call enqueued, started and completed.
FR_PG_STATUS = pa.schema(
    [
        _col("rank", pa.int32()),
        _col("path", pa.string()),
        _col("pg_id", pa.string()),
        _col("last_enqueued", pa.int64(), doc="last_enqueued_collective (gloo counts every op, p2p ones too)"),
        _col("last_started", pa.int64(), doc="-1: none known to have started"),
        _col("last_completed", pa.int64()),
    ]
)

#: Where each rank stands in each process group when the dumps were taken (:mod:`tracekit.analysis.hang.stuck`).
HANG_POSITIONS = pa.schema(
    [
        _col("pg", pa.string()),
        _col("pg_desc", pa.string()),
        _col("rank", pa.int32()),
        _col("dumped", pa.bool_(), doc="the rank left a dump"),
        _col("entered_seq", pa.int64(), doc="the last collective of the group the rank entered (collective_seq_id; "
             "0: none in its buffer)"),
        _col("entered_op", pa.string()),
        _col("entered_ns", pa.int64(), doc="when it entered it (its wall clock)"),
        _col("started_seq", pa.int64(), doc="the last one known started (NCCL's state; null under gloo)"),
        _col("completed_seq", pa.int64(), doc="the last one known completed (NCCL's state; null under gloo)"),
        _col("retired_seq", pa.int64(), doc="the last one retired (completed, or failed or timed out)"),
        _col("state", pa.string(), doc="waiting (entered the collective the group is stuck in), not started "
             "(entered it, its GPU never started it, where the dump records starts), behind (never entered it), "
             "no dump, in flight (its last call not finished, nobody behind) or done"),
        _col("stuck_seq", pa.int64(), doc="the collective the group is stuck in (null: not stuck)"),
        _col("blocked_in", pa.string(), doc="for a rank behind: the group and collective it waits in elsewhere"),
        _col("cause", pa.bool_(), doc="tracekit names this rank as a cause of the hang or desync"),
    ]
)

#: The five attribution classes, in display order; they add up to ``wall_ns``.
CLASSES: tuple[str, ...] = ("compute", "overlapped", "exposed_comm", "memory", "idle")


def dict_match(col: pa.ChunkedArray | pa.Array, pattern: str) -> np.ndarray:
    """Per row, whether a string column's value matches ``pattern`` (a regex; nulls are False): tested once per
    dictionary value and mapped to every row, not once per row (a job's lanes, kinds and names are a few hundred
    distinct strings over millions of rows)."""
    import numpy as np
    import pyarrow.compute as pc

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    values = arr.dictionary
    hit = pc.fill_null(pc.match_substring_regex(values.cast(pa.string()), pattern), False) if len(values) else \
        pa.array([], pa.bool_())
    flags = np.append(np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool), False)
    idx = pc.fill_null(arr.indices, len(flags) - 1).to_numpy(zero_copy_only=False)
    return flags[idx]


def dict_in(col: pa.ChunkedArray | pa.Array, values: tuple[str, ...]) -> np.ndarray:
    """Per row, whether a string column's value is one of ``values`` (:func:`dict_match`)."""
    return dict_match(col, "^(?:" + "|".join(map(re.escape, values)) + ")$")


def empty(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema``."""
    return schema.empty_table()


def table(schema: pa.Schema, columns: Mapping[str, Sequence[Any] | pa.Array]) -> pa.Table:
    """Build a table of ``schema`` from named columns; absent columns are null, types are cast."""
    n = None
    for value in columns.values():
        n = len(value)
        break
    n = n or 0
    arrays = []
    for f in schema:
        value = columns.get(f.name)
        if value is None:
            arrays.append(pa.nulls(n, f.type))
            continue
        arr = value if isinstance(value, pa.Array | pa.ChunkedArray) else _to_arrow(value)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if arr.type != f.type:
            if pa.types.is_dictionary(f.type) and not pa.types.is_dictionary(arr.type):
                arr = arr.cast(pa.string()).dictionary_encode()
                if arr.type != f.type:
                    arr = arr.cast(f.type)
            else:
                arr = arr.cast(f.type)
        arrays.append(arr)
    unknown = set(columns) - set(schema.names)
    if unknown:
        raise KeyError(f"columns not in schema: {sorted(unknown)}")
    return pa.Table.from_arrays(arrays, schema=schema)


def clean_text(v: Any) -> Any:
    """A string with lone surrogates (JSON ``"\\ud800"``) made encodable; other values unchanged."""
    if isinstance(v, str):
        return v.encode("utf-8", "replace").decode("utf-8")
    if isinstance(v, list):
        return [clean_text(x) for x in v]
    return v


def _to_arrow(values: Sequence[Any]) -> pa.Array:
    """``pa.array(values)``; strings that UTF-8 cannot encode are repaired rather than fatal."""
    try:
        return pa.array(values)
    except UnicodeEncodeError:
        return pa.array([clean_text(v) for v in values])


def conform(tbl: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast ``tbl`` to ``schema`` (same column order), adding null columns it lacks."""
    cols = {name: tbl.column(name) for name in tbl.column_names if name in schema.names}
    n = tbl.num_rows
    arrays = []
    for f in schema:
        col = cols.get(f.name)
        if col is None:
            arrays.append(pa.chunked_array([pa.nulls(n, f.type)]) if n else pa.chunked_array([], f.type))
        elif col.type != f.type:
            if pa.types.is_dictionary(f.type) and pa.types.is_dictionary(col.type):
                col = col.cast(pa.string()).cast(f.type)
            elif pa.types.is_dictionary(f.type):
                col = pa.chunked_array([c.dictionary_encode() for c in col.cast(pa.string()).chunks],
                                       type=f.type) if col.num_chunks else pa.chunked_array([], f.type)
            else:
                col = col.cast(f.type)
            arrays.append(col)
        else:
            arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


@dataclass
class ParsedFile:
    """Everything one input file contributes: tables of the schemas above plus what the file says about
    itself. Parsers return it; the TraceSet caches it and assigns ranks."""

    path: str
    format: str
    events: pa.Table = field(default_factory=lambda: empty(EVENTS))
    collectives: pa.Table = field(default_factory=lambda: empty(COLLECTIVES))
    topology: pa.Table = field(default_factory=lambda: empty(TOPOLOGY))
    #: format-specific extra tables (e.g. Horovod negotiation ticks), cached and exported with the rest
    tables: dict[str, pa.Table] = field(default_factory=dict)
    #: rank, world_size, backend, host, pid, device, format_version, pg_config, ... (JSON-serialisable)
    meta: dict[str, Any] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    bytes_lost: int = 0
    complete: bool = True
    #: set when the parser spilled to disk (bounded memory): ``events`` is this Arrow IPC file,
    #: memory-mapped; read it batch by batch (``pa.ipc.open_file``) to stay within the memory bound
    events_file: str | None = None


# --- the vocabulary of collective ops (``collectives.op``) ---

_OPS = {
    "allreduce": "allreduce", "all_reduce": "allreduce",
    "allgather": "allgather", "all_gather": "allgather", "allgatherv": "allgather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoallv": "all_to_all",
    "all_to_allv": "all_to_all", "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce",
    "send": "send", "recv": "recv", "sendrecv": "sendrecv", "barrier": "barrier", "gather": "gather",
    "scatter": "scatter", "generic": "generic",
}
_SUFFIXES = re.compile(r"(_base|_coalesced|_into_tensor|_tensor|_single|_)+$")
_KERNEL_FUNC = re.compile(r"(?:ncclDevKernel|ncclSymkDevKernel|ncclKernel)_([A-Za-z]+)|nccl([A-Z][A-Za-z]+?)"
                          r"(?:Ring|Tree|CollNet)?(?:LL128|LL)?Kernel_")


def normalise_op(name: str | None) -> str | None:
    """``c10d::_allgather_base_``, ``nccl:all_reduce``, ``AllReduce``, kernel names → tracekit op."""
    if not name or not isinstance(name, str):
        return None
    m = _KERNEL_FUNC.search(name)
    if m:
        name = m.group(1) or m.group(2)
    n = name.split("::")[-1].split(":")[-1].strip("_").lower()
    n = _SUFFIXES.sub("", n).strip("_")
    return _OPS.get(n, _OPS.get(n.replace("_", ""), n or None))
