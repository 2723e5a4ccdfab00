"""NCCL debug logs (``NCCL_DEBUG=INFO``, FORMATS.md section 2) into tracekit tables.

A log is text lines written by one or many processes (a per-process ``NCCL_DEBUG_FILE``, or a shared
stdout with launcher prefixes and interleaving), or an excerpt of one as pasted into bug reports: without
the Init lines, or without the ``host:pid:tid`` prefix (``[1] NCCL INFO ...``, ``NCCL INFO ...``; the lines
of each ``[dev]`` are then one pseudo-process with host ``""`` and pid ``-2 - dev``, or ``-1`` without
``[dev]``: :func:`bare_pid`). This parser turns it into:

``collectives`` (COLLECTIVES schema), one row per ``COLL`` line (``NCCL_DEBUG_SUBSYS`` must contain
``COLL``), in line order:

* ``rank`` -- the **global** rank of the process that logged the line when known (its rank in its
  largest communicator, the "world" comm, or RCCL's ``globalrank``), otherwise its rank in the
  communicator of the call, otherwise null. ``tables["nccl_calls"].rank_is_global`` says which. Without
  Init lines the rank in a communicator comes from its nNodes line (``comm %p rank %d nRanks %d nNodes``,
  2.12+), its Destroy line, or the rank its transport, ring and tree lines say the process has; a process
  with none of these gets, in its largest communicator, the rank of its launcher prefix (OpenMPI
  ``[1,R]<stdout>:``, ``srun --label``), else of its CUDA device ``[d]`` (a guess, reported: right for one
  process per GPU on one node). ``meta["processes"][i]["rank_source"]`` says which (``nccl-init``,
  ``nccl-nnodes``, ``nccl-destroy``, ``nccl-topology``, ``launcher``, ``device``, ``rccl-globalrank``,
  ``nccl-tests``).
* ``collective_id`` -- row number in this file (0-based, line order).
* ``pg`` -- the NCCL ``commId`` as printed (``0x`` + lower-case hex), equal on every member. NCCL 2.27+
  split communicators print no commId on their Init lines: it is *derived* with NCCL's own hash of the
  parent's commId, ``splitCount`` and ``color`` (src/init.cc), and replaced by the commId of the
  Destroy line when the log has one (a mismatch is reported). Before NCCL 2.16 no commId exists at
  all: ``pg`` is then the
  synthetic ``synthetic-n{nranks}-{k}`` = the k-th communicator of that size created by the process
  (ranks create communicators in the same order, so it matches across ranks; two *disjoint* groups of
  equal size collide -- flagged by a diagnostic when both are in one file).
  A communicator with no Init line in the log (``NCCL_DEBUG_SUBSYS=COLL`` only, excerpts) is known from its
  COLL lines (pointer, ``[nranks=N]``), nNodes or Destroy line: ``pg`` is ``inferred-n{nranks}-{k}``, the
  k-th communicator of that size the process used (same order on every member when the excerpts start
  together; more claimants than ranks is reported). ``tables["nccl_comms"].comm_id_source`` says which
  (``log``, ``derived``, ``synthetic``, ``inferred``). Null only for orphan bodies of no known process.
* ``seq`` -- 0-based index of the call among the calls of the same process on the same communicator
  (``pg``), in line order: the k-th call of a comm is the same collective on every member (FORMATS 2.4).
  NCCL's ``opCount`` is *not* a call id (stuck at 0 or shared by a group); it is in ``nccl_calls``.
  Null for an orphan body whose process could not be recovered. A lost or cut COLL line shifts the seq
  of that process's later calls on that comm: members then disagree on (pg, seq), which is reported as a
  diagnostic.
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
[send|receive] via T``, CollNet's ``Coll NN : a [send] via COLLNET/...`` of 2.7-2.11 and ``CollNet NN/c : ...``):
``rank`` is the rank **in the communicator** of the process that logged it (``a``, or ``b`` for ``[receive]``),
``peer`` the other end (in-comm, like ``rank``), ``transport`` the family (``P2P SHM NET/IB NET/Socket NET/<plugin>
COLLNET NVLS ...``; ``via direct shared memory`` of 2.4-2.13 is ``SHM``), ``detail`` the whole ``via`` text.
Transport lines do not name their communicator: they are attributed to the communicator being
initialised by that process (between Init START and COMPLETE, after its nNodes line, or before a COMPLETE
in eras without START), or -- for lazily connected channels -- to the comm of the process's last COLL
line, or -- in excerpts without Init lines -- to the process's only communicator, checked against the
process's rank in it and the comm's size; null ``comm_id`` (the row is kept) when that is ambiguous.

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
* ``nccl_graph`` (NCCL_GRAPH) -- ring orders (``kind=ring``, rank 0 of the comm prints them: ``value`` = the
  space-separated in-comm ranks), ring neighbours (``kind=ring_link``, 2.19+ ``Ring 02 : 2 -> 0 -> 1``,
  every rank: ``value`` = ``prev->rank->next``) and trees (``kind=tree``: ``value`` =
  ``children->rank->parent`` from ``Trees [c] ...`` and 2.19+ ``Tree c : up -> rank -> children``, or the
  joined up|down trees of 2.4-2.6) per channel: ``comm comm_id rank channel nchannels cut`` (the line hit
  NCCL's 1 KB limit, so the ring may be incomplete).
* ``nccl_tuning`` -- every TUNING line: ``host pid op`` (null before 2.23) ``bytes algorithm protocol
  channel_lo channel_hi time_us`` (predicted, 2.20-2.23) ``kernel`` (2.27+ symmetric kernels, then
  ``algorithm`` = ``SYMMETRIC``) ``size_kind`` (``S``: the line prints the full buffer, 2.20-2.23;
  ``cs``: count * element size, 2.24+) and the call it was matched to: ``comm_id seq collective_id
  matched_by`` (``op+bytes``, ``bytes``, ``op``; null when unmatched).
* ``nccl_warnings`` -- WARN (and other non-INFO/TRACE levels) lines: ``host pid tid device level loc``
  (``file.cc:line``) ``func`` (2.30.7+) ``message log_time``; indented continuation lines are appended
  to the message.
* ``pytorch_watchdog`` -- PyTorch ProcessGroupNCCL watchdog lines of every era (``[Rank 3]``, ``[PG 0 Rank 3]``,
  ``[PG 0 (default_pg) Rank 3]``, ``[PG ID 0 PG GUID 0(default_pg) Rank 3]``; a file of nothing else is an NCCL log
  too): ``rank seq_num op_type numel_in numel_out timeout_ms text`` ``kind`` (``timeout``: ``Watchdog caught
  collective operation timeout: WorkNCCL(SeqNum=..., OpType=...)``; ``exception``: ``... detected by watchdog at
  work: N`` / ``Timeout at NCCL work: N``; ``dump``: ``Received a dump signal ... from rank R``; ``progress``;
  ``failed``) ``pg`` (the PG id, with its description) ``last_enqueued last_completed`` (the last work the rank
  enqueued and completed) ``ran_ms dump_from log_time`` (a glog header's time).
* ``communicators`` (COMMUNICATORS of :mod:`tracekit.model.schema`) -- one row per communicator instance per
  process, as ``nccl_comms`` but in the public schema: ``comm_id rank nranks nnodes local_ranks local_rank host``
  (null for lines without a host prefix) ``pid global_rank cuda_dev nvml_dev bus_id nccl_version network``
  (its ``Using network X``) ``calls init_line ...``.
* ``nccl_network`` (NCCL_NETWORK) -- the network devices of each process's ``NET/IB : Using [0]mlx5_0:1/IB ...``
  and ``NET/Socket : Using [0]eth0:10.0.0.1<0>`` lines (``net index device port link`` -- IB or RoCE --
  ``address oob``), with ``gdr`` (GPU Direct RDMA, from the GDR lines of every era: null when none speaks of that
  HCA) ``gdr_line gdr_reason``.

``meta``: ``format_version`` / ``nccl_version`` (from the version line; ``None`` without one),
``era`` (version range inferred from the formats seen, e.g. ``2.21.0-2.23.x``), ``backend``
(``nccl``), ``world_size`` (largest comm), ``network`` (``IB``, ``Socket``, ...), ``processes`` (list
of ``{host, pid, rank, rank_source, nranks, devices, comms, version, version_line, network, prefixes, plugin,
env, net_issues}``: ``plugin`` the network plugin (``internal`` or the name of the one loaded), ``env`` the ``NCCL_*
set by environment to`` lines (``{name: {value, line}}``), ``net_issues`` the lines saying InfiniBand was not used
(``NET/IB : No device found.``, ``Failed to open libibverbs``: ``[{kind, line, text}]``); ``comms``
being ``[{comm, comm_id, rank, nranks, cuda_dev, bus_id, parent, color, key}]``; ``rank_source`` as
for ``collectives.rank`` above), ``versions`` (every NCCL version of the file: ``{version: {count, line}}``), and
when the file holds exactly one process also ``rank host pid device``. Counters: ``lines blank_lines nccl_lines
ignored_lines`` (NCCL messages known to hold nothing
tracekit uses: :data:`.grammar.KNOWN`) ``unrecognised_lines`` (NCCL lines not understood: messages of no known
kind, and ``damaged_lines``, lines of a known kind whose text does not fit it) ``unparsed_lines`` (lines
nothing was read from: text that is not NCCL's, and the damaged lines) ``bare_lines`` (without
``host:pid:tid``) ``warn_lines cut_lines orphan_lines widowed_prefixes ray_repeats continuation_lines
unwind_lines`` (``file.cc:123 -> 6`` error-return lines); ``unrecognised``: the not-understood lines by
kind (``[{level, kind, count, first_line, example, damaged}]``, most frequent first), also named in a
diagnostic -- never skipped silently.

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

Modules, one stage each (this package's ``__init__`` is its public face: the names below re-exported):
:mod:`.reader` (the entry points ``sniff`` and ``parse``, reading whole lines in blocks -- ``BLOCK``,
``MAX_LINE``, which tests shrink with monkeypatch on that module -- and putting it together),
:mod:`.grammar` (vocabulary and regexes), :mod:`.columnar` (the columnar path), :mod:`.lines` (the per-line
path and the parse state), :mod:`.comms` (communicator instances, ids and ranks; lines that name no
communicator), :mod:`.network` (network devices, GPU Direct RDMA, the plugin, ``NCCL_*`` settings),
:mod:`.tuning` (TUNING lines to calls) and :mod:`.tables` (the output tables and ``meta``).
"""

from __future__ import annotations

from .comms import split_comm_id
from .grammar import DTYPES
from .lines import bare_pid
from .reader import BLOCK, FORMAT, MAX_LINE, PARSER_VERSION, parse, sniff

__all__ = ["BLOCK", "DTYPES", "FORMAT", "MAX_LINE", "PARSER_VERSION", "bare_pid", "parse", "sniff", "split_comm_id"]
