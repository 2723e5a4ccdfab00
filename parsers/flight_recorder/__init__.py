"""PyTorch Flight Recorder dumps: each rank's last collectives, read beside the job's traces (``docs/hangs.md``).

A dump is one rank's ring buffer of collective and point-to-point calls (``TORCH_FR_BUFFER_SIZE`` entries, or
``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.6), written by ProcessGroupNCCL's watchdog on a timeout (to
``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``, later ``$TORCH_FR_DUMP_TEMP_FILE<rank>``; default
``/tmp/nccl_trace_rank_<rank>``) or by the program (``torch._C._distributed_c10d._dump_fr_trace()`` for the pickle,
``_dump_fr_trace_json()`` for the JSON form; gloo has no other way). Both forms hold one dict; this parser reads
either (gzip too) into four tables and no events:

``fr_dumps`` (FR_DUMPS) one row: path, rank (the digits the name ends in, before ``.json``/``.pkl``/``.gz``), form,
  ``version``, backend, comm_lib_version, entries, whether stacks are in it, and the least world size its
  ``pg_config`` implies.
``fr_entries`` (FR_ENTRIES) one row per entry, in the dump's order (oldest first).
``fr_pg_config`` (FR_PG_CONFIG) one row per process group of ``pg_config``.
``fr_pg_status`` (FR_PG_STATUS) one row per group of ``pg_status``.

The schema versions of PyTorch's source (``FlightRecorder.hpp`` / ``NCCLUtils.hpp`` / ``TraceUtils.h``: the
``version`` field; minor for fields added, major for fields changed), all read by field name:

=======  =====================================================================================================
1.0-1.1  ``entries`` of {pg_id, seq_id, profiling_name, time_created_ns, duration_ms (with timing), input_sizes,
         output_sizes, state, time_discovered_started_ns, time_discovered_completed_ns, retired, frames}
1.2-1.5  + record_id, op_id; ``pg_config`` {pg_id: [ranks]} and ``nccl_comm_state`` (as in 1.4)
2.0-2.2  ``seq_id`` split into collective_seq_id and p2p_seq_id (2.0); ``process_group`` (name, desc), input_dtypes,
         output_dtypes, timeout_ms, is_p2p (as in 2.2)
2.3-2.6  + ``pg_status`` {pg_id: {last_enqueued_collective, last_started_collective, last_completed_collective}};
         ``pg_config`` {name: {name, desc, ranks as text}}; the JSON form (no frames, pg_status values as text)
2.7-2.9  + ``nccl_version`` (2.7: non-p2p calls inside a coalesced group recorded one by one)
2.10     ``comm_lib_version`` for ``nccl_version``; + thread_id, thread_name (torch 2.13 writes 2.10, gloo too)
=======  =====================================================================================================

Versions between these rows add to them; every field is read where present and null where not.
A 1.x ``seq_id`` becomes ``collective_seq_id`` (``p2p_seq_id`` for send/recv) and its ``pg_id`` the group's name.
The pickle form is untrusted input: it is read with an unpickler that refuses every class, function and persistent
reference (:mod:`tracekit.parsers.flight_recorder.unpickle`), so it only ever builds plain data; a pickle that names
code is refused with a :class:`~tracekit.model.diagnostics.TraceError`, a damaged or truncated one too (a pickle has
no record boundary to keep what came before), and a value of the wrong type is null and counted in a diagnostic.
"""

from .reader import FORMAT, PARSER_VERSION, parse, rank_from_name, sniff

__all__ = ["FORMAT", "PARSER_VERSION", "parse", "rank_from_name", "sniff"]
