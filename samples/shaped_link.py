"""Rate-limited network links between "hosts" on one machine, for recording multi-rank jobs.

One job: build N network namespaces ("hosts") joined by links shaped with ``tc``, hand out the
addresses and the argv prefix that runs a command on a host, and always tear everything down.

- 2 hosts: one veth pair between the two namespaces (``tk0`` on both sides).
- N > 2 hosts: a star — every host has a veth to a bridge in an extra "switch" namespace, like hosts
  on one switch port each.

Every link is shaped in BOTH directions: a ``tbf`` qdisc on each end (host egress and the peer's
egress towards the host), or ``netem rate ... delay ...`` when a delay is asked for (needs the
kernel's sch_netem; a clear error says when it is missing). All addresses live in the namespaces this
module creates (10.231.0.0/24 by default), so no traffic leaves the machine.

Usage::

    with ShapedNetwork(hosts=2, rate_bps=parse_rate("200mbit")) as net:
        subprocess.run(net.exec_argv(0, ["python", "server.py", net.hosts[0].address]))
        check = check_link(net)          # measured TCP throughput both ways vs the set rate

Needs root and iproute2. Namespace names are ``tk-<pid>-<n>-<host>`` so that leftovers of a killed
run can be found: ``python samples/shaped_link.py cleanup`` removes those whose process is gone.
``python samples/shaped_link.py check --rate 200mbit`` builds a link, measures it and removes it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from types import FrameType

__all__ = [
    "Host",
    "LinkCheck",
    "LinkError",
    "ShapedNetwork",
    "check_link",
    "format_rate",
    "measure_throughput",
    "parse_delay",
    "parse_rate",
    "remove_stale_namespaces",
    "require_netns",
]

NS_PREFIX = "tk-"
IFNAME = "tk0"
MIN_RATE_BPS = 8_000  # tc's own floor is a few bit/s; below 1 kB/s a training job never finishes
MAX_RATE_BPS = 400_000_000_000

# tc(8) units: "bit" and a bare number are bits per second, "bps" is BYTES per second.
_RATE_UNITS: dict[str, float] = {
    "": 1,
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "kibit": 2.0**10,
    "mibit": 2.0**20,
    "gibit": 2.0**30,
    "tibit": 2.0**40,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
    "kibps": 8 * 2.0**10,
    "mibps": 8 * 2.0**20,
    "gibps": 8 * 2.0**30,
    "tibps": 8 * 2.0**40,
}
_DELAY_UNITS: dict[str, float] = {"us": 1, "usec": 1, "ms": 1e3, "msec": 1e3, "s": 1e6, "sec": 1e6}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"


class LinkError(RuntimeError):
    """A shaped link could not be built, used or checked; the message says what to do."""


def parse_rate(text: str) -> int:
    """Parse a tc rate ("200mbit", "1gbit", "1.5Gbit", "100mbps" = bytes/s) into bits per second.

    Raises ValueError for anything tc would not take or that is out of the useful range.
    """
    s = text.strip().lower()
    m = re.fullmatch(rf"({_NUMBER})\s*([a-z]*)", s)
    if not m or m.group(3) not in _RATE_UNITS:
        units = ", ".join(u for u in _RATE_UNITS if u)
        raise ValueError(f"bad link rate {text!r}: expected a number and a tc unit ({units}), e.g. 200mbit")
    value = float(m.group(1)) * _RATE_UNITS[m.group(3)]
    if not math.isfinite(value) or value < MIN_RATE_BPS or value > MAX_RATE_BPS:
        raise ValueError(
            f"link rate {text!r} = {value:.6g} bit/s is outside {format_rate(MIN_RATE_BPS)}"
            f"..{format_rate(MAX_RATE_BPS)}"
        )
    return round(value)


def format_rate(bps: int) -> str:
    """Shortest exact tc spelling of a rate in bits per second: 200000000 -> "200mbit"."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps % scale == 0:
            return f"{bps // scale}{unit}"
    return f"{bps}bit"


def parse_delay(text: str) -> int:
    """Parse a one-way delay ("5ms", "250us", "0.5ms", "1s") into whole microseconds (>= 0)."""
    s = text.strip().lower()
    m = re.fullmatch(rf"({_NUMBER})\s*([a-z]*)", s)
    if not m or m.group(3) not in _DELAY_UNITS:
        raise ValueError(f"bad link delay {text!r}: expected e.g. 2ms, 500us or 0.1s")
    us = float(m.group(1)) * _DELAY_UNITS[m.group(3)]
    if not math.isfinite(us) or us > 10e6:
        raise ValueError(f"link delay {text!r} is out of range (0..10s)")
    return round(us)


def require_netns() -> None:
    """Raise LinkError unless this process can build namespaces (root + iproute2's ip and tc)."""
    if os.geteuid() != 0:
        raise LinkError(
            "a shaped link needs root (network namespaces and tc); run as root or drop --link-rate"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise LinkError(f"{tool!r} not found: install iproute2 (apt-get install -y iproute2)")


def _run(argv: Sequence[str]) -> str:
    """Run one ip/tc command; raise LinkError with its stderr when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise LinkError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@dataclass(frozen=True)
class Host:
    """One namespace ("host"): its name, the interface towards the link, and its address on it."""

    netns: str
    ifname: str
    address: str


_counter = itertools.count()


@dataclass
class ShapedNetwork:
    """Context manager: ``hosts`` namespaces joined by links shaped to ``rate_bps`` (None = unshaped).

    ``delay_us`` adds a one-way delay per direction with netem. ``runner`` runs one ip/tc command (tests
    replace it). Teardown kills whatever still runs in the namespaces and deletes them; it runs on normal
    exit, on any exception and on SIGTERM/SIGHUP (turned into SystemExit while inside the block).
    """

    hosts_count: int = 2
    rate_bps: int | None = None
    delay_us: int | None = None
    subnet: str = "10.231.0"
    latency_ms: float = 25.0
    runner: Callable[[Sequence[str]], str] = _run
    hosts: list[Host] = field(default_factory=list, init=False)
    namespaces: list[str] = field(default_factory=list, init=False)
    qdiscs: list[str] = field(default_factory=list, init=False)
    #: the shaped link ends, (namespace, device): what :meth:`set_rate` changes
    shaped: list[tuple[str, str]] = field(default_factory=list, init=False)
    _old_handlers: dict[int, object] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 2 <= self.hosts_count <= 250:
            raise ValueError(f"hosts must be 2..250, not {self.hosts_count}")
        if self.rate_bps is not None and not MIN_RATE_BPS <= self.rate_bps <= MAX_RATE_BPS:
            raise ValueError(f"rate {self.rate_bps} bit/s out of range")
        if self.delay_us is not None and self.delay_us < 0:
            raise ValueError("delay must be >= 0")
        self.tag = f"{NS_PREFIX}{os.getpid()}-{next(_counter)}"

    # -- building -------------------------------------------------------------------------------
    def __enter__(self) -> ShapedNetwork:
        self._install_signal_handlers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ns(self, suffix: str) -> str:
        name = f"{self.tag}-{suffix}"
        self.runner(["ip", "netns", "add", name])
        self.namespaces.append(name)
        self.runner(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _build(self) -> None:
        n = self.hosts_count
        names = [self._ns(_host_suffix(i)) for i in range(n)]
        for i, ns in enumerate(names):
            self.hosts.append(Host(ns, IFNAME, f"{self.subnet}.{i + 1}"))
        if n == 2:
            a, b = names
            self.runner(
                ["ip", "link", "add", IFNAME, "netns", a, "type", "veth", "peer", "name", IFNAME, "netns", b]
            )
            shaped = [(a, IFNAME), (b, IFNAME)]
        else:
            sw = self._ns("sw")
            self.runner(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
            self.runner(["ip", "-n", sw, "link", "set", "br0", "up"])
            shaped = []
            for i, ns in enumerate(names):
                port = f"p{i}"
                self.runner(
                    [
                        "ip",
                        "link",
                        "add",
                        IFNAME,
                        "netns",
                        ns,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        port,
                        "netns",
                        sw,
                    ]
                )
                self.runner(["ip", "-n", sw, "link", "set", port, "master", "br0"])
                self.runner(["ip", "-n", sw, "link", "set", port, "up"])
                shaped += [(ns, IFNAME), (sw, port)]
        for host in self.hosts:
            self.runner(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", IFNAME])
            self.runner(["ip", "-n", host.netns, "link", "set", IFNAME, "up"])
        self.shaped = list(shaped)
        for ns, dev in shaped:
            qdisc = self.qdisc_args()
            if qdisc:
                try:
                    self.runner(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *qdisc])
                except LinkError as exc:
                    if qdisc[0] == "netem" and "unknown" in str(exc).lower():
                        raise LinkError(
                            "this kernel has no netem qdisc (sch_netem), so a link delay cannot be "
                            "set here; drop the delay and shape the rate only (tbf)"
                        ) from exc
                    raise
                self.qdiscs.append(f"{ns}/{dev}: {' '.join(qdisc)}")

    def qdisc_args(self) -> list[str]:
        """The tc qdisc (kind + parameters) put on every link end; [] when unshaped."""
        if self.delay_us is not None:
            args = ["netem", "delay", f"{self.delay_us}us"]
            if self.rate_bps is not None:
                # netem's queue is counted in packets: hold ~latency_ms of full frames (at least 1000).
                frames = self.rate_bps / 8 * self.latency_ms / 1e3 / 1514
                args += ["rate", f"{self.rate_bps}bit", "limit", str(max(1000, math.ceil(frames)))]
            return args
        if self.rate_bps is None:
            return []
        # burst: 1 ms at line rate, at least 10 full frames, so high rates are not starved by timer
        # granularity and low rates are not bursty; the queue holds latency_ms at line rate.
        burst = max(15_140, math.ceil(self.rate_bps / 8 / 1000))
        return [
            "tbf",
            "rate",
            f"{self.rate_bps}bit",
            "burst",
            str(burst),
            "latency",
            f"{self.latency_ms:g}ms",
        ]

    def set_rate(self, rate_bps: int) -> None:
        """Change the rate of every shaped link end while the network is in use (``tc qdisc change``: the
        connections stay up; packets queued at the old rate drain at the new one). Only a ``tbf``-shaped
        network (a rate and no delay) can change its rate."""
        if self.delay_us is not None or self.rate_bps is None:
            raise LinkError("only a link shaped by rate alone (tbf, no delay) can change its rate while in use")
        if not MIN_RATE_BPS <= rate_bps <= MAX_RATE_BPS:
            raise ValueError(f"rate {rate_bps} bit/s out of range")
        self.rate_bps = rate_bps
        qdisc = self.qdisc_args()
        self.qdiscs = []
        for ns, dev in self.shaped:
            self.runner(["tc", "-n", ns, "qdisc", "change", "dev", dev, "root", *qdisc])
            self.qdiscs.append(f"{ns}/{dev}: {' '.join(qdisc)}")

    # -- using ----------------------------------------------------------------------------------
    def exec_argv(self, host: int, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` inside host ``host``'s namespace (environment passes through)."""
        return ["ip", "netns", "exec", self.hosts[host].netns, *argv]

    def describe(self) -> dict[str, object]:
        """JSON-able description: rate, delay, hosts, qdiscs."""
        return {
            "rate": format_rate(self.rate_bps) if self.rate_bps else None,
            "rate_bps": self.rate_bps,
            "delay_us": self.delay_us,
            "topology": "veth pair"
            if self.hosts_count == 2
            else f"star of {self.hosts_count} veths on a bridge",
            "hosts": [asdict(h) for h in self.hosts],
            "qdisc": " ".join(self.qdisc_args()) or None,
        }

    # -- teardown -------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill what runs in our namespaces and delete them. Idempotent; never raises."""
        try:
            for ns in reversed(self.namespaces):
                _kill_netns_pids(ns, self.runner)
            for ns in reversed(self.namespaces):
                with contextlib.suppress(Exception):
                    self.runner(["ip", "netns", "del", ns])
            self.namespaces.clear()
        finally:
            self._restore_signal_handlers()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def _raise(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, _raise)

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old_handlers.clear()


def _host_suffix(i: int) -> str:
    return chr(ord("a") + i) if i < 26 else f"h{i}"


def _kill_netns_pids(ns: str, runner: Callable[[Sequence[str]], str] = _run) -> None:
    """SIGKILL every process still inside namespace ``ns`` (best effort)."""
    try:
        out = runner(["ip", "netns", "pids", ns])
    except Exception:
        return
    for tok in out.split():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(tok), signal.SIGKILL)


def remove_stale_namespaces() -> list[str]:
    """Delete ``tk-<pid>-*`` namespaces whose creating process no longer exists; return their names."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{NS_PREFIX}(\d+)-\d+-\w+", name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        _kill_netns_pids(name)
        if subprocess.run(["ip", "netns", "del", name], capture_output=True).returncode == 0:
            removed.append(name)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- measuring ------------------------------------------------------------------------------------

# Receiver: accept one connection, count bytes; report bytes and the time from the first to the last
# byte (so connection set-up and the sender's start-up do not count).
_RECEIVER = r"""
import json, socket, sys, time
addr, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, port)); srv.listen(1); srv.settimeout(timeout)
print("listening", flush=True)
conn, _ = srv.accept(); conn.settimeout(timeout)
buf = bytearray(1 << 20); total = 0; first = last = None; skip = 0
while True:
    n = conn.recv_into(buf)
    if not n:
        break
    now = time.perf_counter()
    if first is None:
        first, skip = now, n
    total += n; last = now
print(json.dumps({"bytes": total - skip, "seconds": (last - first) if first else 0.0}), flush=True)
"""

# Sender: send zeros for a fixed time, then close.
_SENDER = r"""
import socket, sys, time
addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + 10
while True:
    try:
        s = socket.create_connection((addr, port), timeout=5); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.05)
chunk = bytes(1 << 16); end = time.perf_counter() + seconds
while time.perf_counter() < end:
    s.sendall(chunk)
s.close()
"""


def measure_throughput(
    net: ShapedNetwork, src: int, dst: int, seconds: float = 1.5, port: int = 5201
) -> float:
    """TCP goodput in bit/s from host ``src`` to host ``dst`` over ``seconds`` (one connection)."""
    addr = net.hosts[dst].address
    timeout = seconds + 20
    recv = subprocess.Popen(
        net.exec_argv(dst, [sys.executable, "-c", _RECEIVER, addr, str(port), str(timeout)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout is not None
        if recv.stdout.readline().strip() != "listening":
            raise LinkError(f"throughput receiver did not start: {recv.stderr.read() if recv.stderr else ''}")
        send = subprocess.run(
            net.exec_argv(src, [sys.executable, "-c", _SENDER, addr, str(port), str(seconds)]),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if send.returncode != 0:
            raise LinkError(f"throughput sender failed: {send.stderr.strip()}")
        out, err = recv.communicate(timeout=timeout)
        if recv.returncode != 0:
            raise LinkError(f"throughput receiver failed: {err.strip()}")
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    if result["seconds"] <= 0:
        raise LinkError("throughput test moved no data")
    return 8 * result["bytes"] / result["seconds"]


@dataclass
class LinkCheck:
    """Measured goodput per direction against the set rate, and whether it is acceptably close."""

    rate_bps: int | None
    measured_bps: dict[str, float]
    ratios: dict[str, float]
    low: float
    high: float
    ok: bool

    def summary(self) -> str:
        parts = [
            f"{k}: {v / 1e6:.1f} Mbit/s" + (f" ({self.ratios[k]:.0%} of set)" if self.ratios else "")
            for k, v in self.measured_bps.items()
        ]
        return "; ".join(parts)


def check_link(
    net: ShapedNetwork,
    seconds: float = 1.5,
    low: float = 0.80,
    high: float = 1.05,
    pairs: Sequence[tuple[int, int]] | None = None,
) -> LinkCheck:
    """Measure TCP goodput both ways between hosts 0 and 1 (or ``pairs``) and compare with the set rate.

    TCP/IP/Ethernet headers take ~4.4 % of a 1500-byte frame, so goodput on a perfect link is ~0.956 of the
    set rate; ``ok`` means every direction lies within [low, high] x rate. With no rate, ``ok`` is True.
    """
    pairs = list(pairs) if pairs is not None else [(0, 1), (1, 0)]
    measured: dict[str, float] = {}
    for k, (s, d) in enumerate(pairs):
        measured[f"{s}->{d}"] = measure_throughput(net, s, d, seconds, port=5201 + k)
    ratios = {key: v / net.rate_bps for key, v in measured.items()} if net.rate_bps else {}
    ok = all(low <= r <= high for r in ratios.values())
    return LinkCheck(net.rate_bps, measured, ratios, low, high, ok)


# -- command line -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``check``: build a shaped 2-host link, measure it, tear it down. ``cleanup``: remove stale ones."""
    parser = argparse.ArgumentParser(prog="shaped_link.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    chk = sub.add_parser("check", help="build a shaped link, measure TCP goodput both ways, remove it")
    chk.add_argument("--rate", help="tc rate, e.g. 200mbit (default: unshaped)")
    chk.add_argument("--delay", help="one-way delay, e.g. 2ms (needs sch_netem)")
    chk.add_argument("--hosts", type=int, default=2)
    chk.add_argument("--seconds", type=float, default=1.5)
    sub.add_parser("cleanup", help="delete tk-<pid>-* namespaces whose process is gone")
    args = parser.parse_args(argv)
    try:
        require_netns()
        if args.cmd == "cleanup":
            for name in remove_stale_namespaces():
                print(f"removed {name}")
            return 0
        rate = parse_rate(args.rate) if args.rate else None
        delay = parse_delay(args.delay) if args.delay else None
        with ShapedNetwork(args.hosts, rate, delay) as net:
            t0 = time.perf_counter()
            result = check_link(net, args.seconds)
            print(
                json.dumps(
                    {
                        **net.describe(),
                        "check": asdict(result),
                        "check_seconds": round(time.perf_counter() - t0, 2),
                    },
                    indent=2,
                )
            )
            print(result.summary(), file=sys.stderr)
            return 0 if result.ok else 1
    except (LinkError, ValueError) as exc:
        print(f"shaped_link: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
