"""The vocabulary and grammar of NCCL debug lines (FORMATS.md 2.2-2.6), shared by the stages of
:mod:`tracekit.parsers.nccl`.

Vocabulary: datatype ids, op, algorithm and protocol names. Grammar: one regex per message kind for the
per-line path (:mod:`.lines`), with the eras that print each form; :data:`KNOWN`, the messages that
hold nothing tracekit uses; and the sniffer's pattern. The columnar path (:mod:`.columnar`) reads
COLL and TUNING lines by token position instead; its few token patterns live beside it.
"""

from __future__ import annotations

import re

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


# ---------------------------------------------------------------------------------------------------
# grammar (FORMATS.md 2.2-2.6), for the per-line path

#: the least int32: communicator ranks and counts beyond int32 are damage
I32_MIN = -(1 << 31)

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
#: a peer connection's transport line (FORMATS.md 2.3); CollNet's is ``Coll NN : r [send] via COLLNET/...`` in 2.7-2.11,
#: ``CollNet NN[/c] : ...`` later
CONN = re.compile(
    r"(?P<kw>Ring|Channel|CollNet|Coll) (?P<ch>\d+)(?:/(?P<conn>\d+))? : "
    r"(?P<src>\d+)(?:\[(?P<sdev>[0-9a-fA-F]+)\])?(?: -> (?P<dst>\d+)(?:\[(?P<ddev>[0-9a-fA-F]+)\])?)?"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$")
#: a ring order; NCCL cuts one longer than its line buffer and ends it with ``...`` (src/graph/rings.cc)
RING = re.compile(r"^(?:Ring|Channel) (?P<ch>\d+)(?:/(?P<n>\d+))? :(?P<ranks>(?: +\d+)*)(?P<more> *\d*\.\.\.)? *$")
#: 2.19+, every rank, per channel: its ring neighbours ``Ring 02 : prev -> rank -> next`` (src/init.cc) and
#: its tree ``Tree 1 : up -> rank -> down0/down1/down2`` (src/graph/connect.cc)
RING_LINK = re.compile(r"^Ring (?P<ch>\d+) : (?P<prev>-?\d+) -> (?P<rank>\d+) -> (?P<next>-?\d+)\s*$")
TREE_LINK = re.compile(r"^Tree (?P<ch>\d+) : (?P<up>-?\d+) -> (?P<rank>\d+) -> (?P<down>-?\d+(?:/-?\d+)*)\s*$")
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
NETWORK = re.compile(r"^(?:Using network (?P<net>\S+)|NET/(?P<net2>(?!Plugin\b)[^\s:]+) ?: Using)")
UNWIND = re.compile(r"^\S+\.(?:cc|cu|h|c|cpp):\d+ -> \d+")
#: PyTorch ProcessGroupNCCL's watchdog lines (FORMATS.md 2.5), after the rank prefix of every era: ``[Rank 3]``,
#: ``[PG 0 Rank 3]``, ``[PG 0 (default_pg) Rank 3]``, ``[PG ID 0 PG GUID 0(default_pg) Rank 3]``
WATCHDOG = re.compile(
    r"\[(?:PG (?:ID )?(?P<pg>\d{1,9})(?: PG GUID (?P<guid>[^\s\]()]{1,64}))? ?(?:\((?P<desc>[^)\]]{0,200})\))? )?"
    r"Rank (?P<rank>\d{1,9})\]:?\s*(?P<what>(?:Watchdog caught collective operation timeout|Exception (?:\(either an "
    r"error or timeout\) )?detected by watchdog|Timeout at NCCL work|Received a dump signal|NCCL Work update "
    r"periodically|Some NCCL operations have failed)(?P<rest>.*))$")
#: the fields of a watchdog message
WORK_NCCL = re.compile(r"WorkNCCL\((?P<args>(?:[^()]|\([^()]*\)){0,2000})\)")
WATCHDOG_SEQ = re.compile(r"(?:at work|Timeout at NCCL work): (?P<seq>-?\d{1,18})")
LAST_ENQUEUED = re.compile(r"[Ll]ast enqueued NCCL work: (?P<n>-?\d{1,18})")
LAST_COMPLETED = re.compile(r"[Ll]ast completed NCCL work: (?P<n>-?\d{1,18})")
RAN_FOR = re.compile(r"ran for (?P<ms>\d{1,18}) milliseconds")
DUMP_FROM = re.compile(r"from\s+rank (?P<rank>\d{1,9})")
#: a glog header before it (PyTorch >= 2.3): ``[E1104 16:41:07.118204311 ProcessGroupNCCL.cpp:607]``
GLOG_TIME = re.compile(r"\[[EWIF](?P<ts>\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?)\s")
NCCL_TESTS = re.compile(r"^#\s+Rank\s+(?P<rank>\d+)\s+Group\s+\d+\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
                        r"\s+device\s+(?P<dev>\d+)")
RAY_REPEAT = re.compile(r"\[repeated (?P<n>\d+)x across cluster\]")
#: a 2.26+ timestamp at the end of a prefix: ``[...]`` with a digit and one of ``-:.`` (or a long epoch)
TIMESTAMP = re.compile(r"\[(?P<ts>[^\[\]]*\d[-:./][^\[\]]*|\d{9,}[^\[\]]*)\] ?$")

#: A line without ``host:pid:tid`` (pasted or trimmed excerpts): ``[dev] NCCL INFO ...`` or bare ``NCCL INFO
#: ...``, possibly behind a launcher or logger prefix. NCCL's part must begin the line or follow a space or one
#: of ``] : > )``. Possessive and bounded quantifiers over separator-free runs keep a search linear.
BARE = re.compile(
    r"(?:^|(?<=[\s\]:>)]))(?:\[(?P<dev>-?\d{1,9})\] )?(?:(?P<ms>\d++\.\d++) )?"
    r"(?:(?P<loc>[^\s()\[\]:>]++:\d++) (?:\((?P<func>[^()]{0,200}+)\) )?)?NCCL (?P<level>[A-Z]{3,})\b ?")
#: the rank a launcher prefix states: OpenMPI ``[jobid,rank]<stdout>:``, ``srun --label`` ``rank: ``
LAUNCHER_RANK = re.compile(r"^(?:\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:|(?P<srun>\d+): )")
#: a line that is nothing but a launcher prefix (the blank line before a WARN, behind the launcher; also a
#: Kubernetes CRI or ``docker --timestamps`` prefix)
LAUNCHER_ONLY = re.compile(r"^\s*(?:\[[^\]]*\](?:<std(?:out|err)>)?:?|\(.*\)|[\w.-]+:|>"
                           r"|\d{4}-\d\d-\d\dT[\d:.]{1,40}Z?(?: std(?:out|err) [FP])?)\s*$")
#: any NCCL marker, to count lines that carry one but could not be read at all
NCCL_MARK = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|CALL|ABORT)\b")

#: INFO messages NCCL prints that hold nothing tracekit uses (INIT, ENV, NET, GRAPH, ALLOC, PROXY, NVLS,
#: TUNING and plugin subsystems): counted as ``ignored_lines``. Any other message is *not understood*: it is
#: counted by kind and named in a diagnostic (see ``meta["unrecognised"]``).
KNOWN = re.compile("^(?:" + "|".join((
    r"Bootstrap\b", r"cudaDriverVersion \d", r"NCCL_\w+ set by environment to", r"Comm config \w+ set to",
    r"NET/", r"(?:NET|TUNER|PROFILER|ENV|GIN|RAS)/Plugin", r"Plugin Path", r"P2P plugin", r"Loaded \w+ plugin",
    r"Assigned NET plugin", r"Using (?:non-device |internal )?(?:net|network) ", r"Using \d+ threads",
    r"Failed to open libnccl",
    r"Setting affinity for GPU", r"NVLS\b", r"Connected (?:all|NVLS|CollNet|to proxy)", r"New proxy (?:send|recv)",
    r"\[Proxy [A-Za-z ]+\]", r"[Pp]roxy\w* ", r"Allocated \d+ bytes", r"Cuda Host Alloc", r"MemoryPool",
    r"DMA-BUF", r"GPU Direct RDMA", r"threadThresholds ", r"CC (?:On|Off)", r"Init timings",
    r"Pattern \d+, crossNic", r"=+ ?(?:System|$)", r"(?:CPU|GPU|NIC|NET|NVS|PCI)/\S+", r"\+ [A-Z0-9]+\[",
    r"\d+ : (?:GPU|NET|NVS|CPU)/", r"Enabled NCCL Func/Proto/Algo Matrix", r"[A-Za-z][\w /]*\|",
    r"P2P Chunksize set to \d", r"CollNet(?:Direct)? channel", r"Collnet Chains", r"rank \d+ Connected CollNet",
    r"Communicator has \d+ nodes", r"Launch mode (?:Parallel|Group)", r"MNNVL\b", r"ncclCommInitRank\w*: comm",
    r"Symmetric", r"Check P2P Type", r"Initialized NET plugin", r"RAS client listening", r"ncclTopoGetCpuAffinity",
)) + ")")

#: Sniffer: the anchor or a version line anywhere in the head; or, for logs without ``host:pid:tid``,
#: an NCCL level at the start of a line (after launcher and logger prefixes), or one followed by a message
#: only NCCL prints (COLL, Init, transport, ring and tree lines, network and bootstrap lines).
_SNIFF = re.compile(
    rb"(?:^|[\s:\[\]])[^\s:\[\]]*:\d+:\d+ (?:\[-?\d+\] )?(?:\d+\.\d+ )?(?:[^\s()]+:\d+ (?:\([^)]*\) )?)?"
    rb"NCCL [A-Z]+\b|NCCL version \d+\.\d+\.\d+"
    # line start, launcher prefixes ([1,0]<stdout>:, [default0]:, 0: , host: , (Ray actor) , > , [time])
    rb"|(?m:^(?:\[\d++,\d++\]<std(?:out|err)>:|\[[A-Za-z_]*+\d++\]: ?|[\w.-]++: |\([^()\n]{0,200}+\) |> "
    rb"|\[(?=[^\]\n]{0,60}\d[-:./T])[^\]\n]{1,120}+\] ?|\d{4}-\d\d-\d\dT[\d:.]++Z? (?:std(?:out|err) [FP] )?)*+"
    rb"(?:\[-?\d+\] )?(?:\d+\.\d+ )?(?:[\w/.-]+\.(?:cc|cu|h|c|cpp):\d+ (?:\([^)\n]*\) )?)?"
    rb"NCCL (?:INFO|WARN|TRACE|CALL|ABORT) ?\S)"
    # anywhere, followed by a message only NCCL prints
    rb"|(?:^|[\s\]:>)])(?:\[-?\d+\] )?NCCL INFO (?:[A-Za-z]+: opCount [0-9a-fA-F]+ sendbuff "
    rb"|(?:nccl\w+ )?comm 0x[0-9a-fA-F]+ rank \d+ n[Rr]anks \d+|(?:Channel|Ring|CollNet) \d+(?:/\d+)? : "
    rb"|Trees? \[?\d|NET/\w+ ?: |Using network |Bootstrap ?: |cudaDriverVersion \d|P2P Chunksize|\d+ coll channels"
    rb"|NCCL version \d|NCCL_\w+ set by environment)"
    rb"|(?:^|\s)(?:\[-?\d+\] )?[\w/.-]+\.(?:cc|cu|h|c|cpp):\d+ (?:\([^)\n]*\) )?NCCL WARN "
    # PyTorch's NCCL watchdog (a hang's excerpt may hold nothing else)
    rb"|Rank \d+\]:? ?(?:Watchdog caught collective operation timeout|Exception (?:\(either an error or timeout\) )?"
    rb"detected by watchdog|Timeout at NCCL work: -?\d|Received a dump signal|NCCL Work update periodically)")
