"""Network lines of an NCCL log: which devices each process's network uses and how, for
:mod:`tracekit.parsers.nccl`.

* ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.9.0.11<0>`` (2.4+; merged devices of 2.19+
  print ``[0]={[0] mlx5_0:1/IB, [1] mlx5_1:1/IB}``), ``NET/Socket : Using [0]eth0:10.0.0.1<0>``: one row per
  device (HCA and port with its link layer, or interface and address);
* ``GPU Direct RDMA Enabled|Disabled`` per HCA, in every era's form: ``NET/IB : GPU Direct RDMA Disabled for HCA 0
  'mlx5_0' (no module)`` (2.5-2.17), ``NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'`` (2.18+), ``GPU Direct
  RDMA Disabled for GPU 1b000 / HCA 0 (distance 5 > 4)`` (2.7-2.23), ``NET/IB : GPU Direct RDMA Disabled for GPU
  0[0] / HCA 0 (distance 5 >= 2)`` (2.4);
* the network plugin (``NET/Plugin : No plugin found (libnccl-net.so), using internal implementation``,
  ``NET/Plugin: Using internal network plugin.``, ``NET/Plugin: Loaded net plugin NAME (v7)``);
* what says InfiniBand was not used: ``NET/IB : No device found.``, ``Failed to open libibverbs.so[.1]``,
  ``Failed to initialize NET plugin IB`` (2.28, which then prints ``NET/IB : Using [RO]; OOB ...`` with no device:
  not a network in use);
* ``NCCL_* set by environment to VALUE`` (the ENV subsystem, default from 2.17).

The facts go on the process (:class:`.lines._Proc`: ``env``, ``plugin``, ``net_issues``) and into the rows of
the ``nccl_network`` table (:func:`network_table`).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import pyarrow as pa


class _Parser(Protocol):
    """What this module reads and fills of the line parser's state (:class:`.lines._Parser`), named here so that
    the two modules do not import each other."""

    nics: list[dict[str, Any]]
    networks: list[str]
    gdr: list[dict[str, Any]]

    def proc(self, host: str, pid: int) -> Any: ...

#: ``NET/<name> : Using <devices>[ [RO]][; OOB <if>:<addr>]`` (the device list of IB and Socket alike)
NET_USING = re.compile(r"^NET/(?P<net>[^\s:/]+) ?: Using (?P<list>.*?)\s*(?:\[RO\])?\s*(?:; ?OOB (?P<oob>\S+))?\s*$")
#: one IB device of the list: ``[0]mlx5_0:1/IB``, ``[1] mlx5_1:1/RoCE`` (inside a merged device)
NIC_IB = re.compile(r"\[(?P<idx>\d{1,6})\]\s?(?P<dev>[^\s:\[\]{},=]+):(?P<port>\d{1,6})/(?P<link>IB|RoCE)\b")
#: one Socket interface of the list: ``[0]eth0:10.0.0.1<0>``, ``[1]ib0:fe80::1%ib0<0>``
NIC_SOCKET = re.compile(r"\[(?P<idx>\d{1,6})\](?P<dev>[^\s:\[\]]+):(?P<addr>\S+)")
#: GPU Direct RDMA per HCA, every era (module docstring)
GDR = re.compile(
    r"^(?:NET/(?P<net>[^\s:/]+) ?: )?GPU Direct RDMA (?P<state>Enabled|Disabled) for (?:GPU (?P<gpu>[0-9a-fA-F]+)"
    r"(?:\[\d+\])? / )?HCA (?P<hca>[0-9a-fA-F]{1,16})(?: '(?P<name>[^']*)')?(?: \((?P<why>[^)]*)\))?")
PLUGIN = re.compile(
    r"^(?:NET/Plugin ?: ?)?(?:(?P<none>No plugin found|Using internal network plugin|Could not find)"
    r"|Loaded net plugin (?P<name>.+?)(?: \(v\d+\))?\.?$)")
ENV = re.compile(r"^(?P<name>NCCL_[A-Z0-9_]+) set by environment to ?(?P<value>.*?)\s*$")
IB_MISSING = re.compile(r"^(?:NET/IB ?: No device found|Failed to open libibverbs"
                        r"|Failed to initialize NET plugin IB\b)")

#: columns of ``nccl_network`` (one row per network device a process uses, or names in a GDR line)
NETWORK_SCHEMA = pa.schema([
    ("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()), ("net", pa.string()),
    ("index", pa.int32()), ("device", pa.string()), ("port", pa.int32()), ("link", pa.string()),
    ("address", pa.string()), ("oob", pa.string()), ("gdr", pa.bool_()), ("gdr_line", pa.int64()),
    ("gdr_reason", pa.string()),
])

#: the message starts the per-line path hands to :func:`network_line`
STARTS = ("NET/", "GPU Direct RDMA", "Failed to open libibverbs", "Failed to initialize NET plugin IB",
          "Loaded net plugin", "NCCL_")


def network_line(st: _Parser, no: int, body: str, host: str, pid: int) -> bool:
    """Read one network, plugin or environment message of process (host, pid) into the parse state; False when
    ``body`` is none of these (the caller goes on with its other rules)."""
    text = body.strip()
    if text.startswith("NCCL_"):
        m = ENV.match(text)
        if m is None:
            return False
        st.proc(host, pid).env.setdefault(m["name"], (m["value"], no))
        return True
    m = NET_USING.match(text)
    if m and m["net"] != "Plugin":
        _devices(st, no, host, pid, m)
        return True
    m = GDR.match(text)
    if m:
        hca = int(m["hca"]) if m["hca"].isdigit() and len(m["hca"]) < 10 else None  # 2.21+: a hex net id
        st.gdr.append({"line": no, "host": host, "pid": pid, "net": m["net"], "index": hca, "device": m["name"],
                       "gdr": m["state"] == "Enabled", "reason": m["why"]})
        return True
    if IB_MISSING.match(text):
        st.proc(host, pid).net_issues.append(("ib-missing", no, text))
        return True
    m = PLUGIN.match(text)
    if m:
        st.proc(host, pid).plugin = "internal" if m["none"] else m["name"]
        return True
    return False


def _devices(st: _Parser, no: int, host: str, pid: int, m: re.Match[str]) -> None:
    """The devices of a ``NET/<net> : Using ...`` line as rows."""
    net, devs = m["net"], m["list"]
    found = False
    for d in NIC_IB.finditer(devs):
        found = True
        st.nics.append({"line": no, "host": host, "pid": pid, "net": net, "index": int(d["idx"]), "device": d["dev"],
                        "port": int(d["port"]), "link": d["link"], "address": None, "oob": m["oob"]})
    if not found:
        for d in NIC_SOCKET.finditer(devs):
            found = True
            st.nics.append({"line": no, "host": host, "pid": pid, "net": net, "index": int(d["idx"]),
                            "device": d["dev"], "port": None, "link": None, "address": d["addr"], "oob": m["oob"]})
    if not found:  # 2.28 prints IB's Using line with no device (``NET/IB : Using [RO]; OOB ...``): not used
        return
    proc = st.proc(host, pid)
    if net not in proc.network:
        proc.network.append(net)
    if net not in st.networks:
        st.networks.append(net)


def network_table(st: _Parser) -> list[dict[str, Any]]:
    """The rows of ``nccl_network``: each device of the Using lines, with GPU Direct RDMA as the process's GDR
    lines say for that HCA (disabled where any line says so; null where none speaks of it). A GDR line about an
    HCA no Using line listed (an excerpt) is a row of its own."""
    rows = [{**r, "gdr": None, "gdr_line": None, "gdr_reason": None} for r in st.nics]
    at = {(r["host"], r["pid"], r["index"]): r for r in rows if r["link"] is not None}
    for g in st.gdr:
        r = at.get((g["host"], g["pid"], g["index"]))
        if r is None:
            r = {"line": g["line"], "host": g["host"], "pid": g["pid"], "net": g["net"] or "IB", "index": g["index"],
                 "device": g["device"], "port": None, "link": None, "address": None, "oob": None, "gdr": None,
                 "gdr_line": None, "gdr_reason": None}
            rows.append(r)
            at[(g["host"], g["pid"], g["index"])] = r
        if r["gdr"] is None or (r["gdr"] and not g["gdr"]):
            r["gdr"], r["gdr_line"], r["gdr_reason"] = g["gdr"], g["line"], g["reason"]
    return rows
