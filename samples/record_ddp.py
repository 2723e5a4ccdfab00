"""Record a real multi-process PyTorch training job (gloo, CPU) under torch.profiler: one Kineto trace per rank.

``--parallel`` picks how the model is spread: ``ddp`` (DistributedDataParallel, the default), ``fsdp``
(FSDP2 ``fully_shard`` per layer: parameter all-gathers in forward and backward, gradient reduce-scatter —
an all-reduce on gloo), ``pipeline`` (``torch.distributed.pipelining`` GPipe, one stage per rank: send/recv
of activations and gradients, bubbles) or ``dp-tp`` (Megatron-style tensor-parallel pairs inside a host and
DDP across hosts: two process groups at once). ``--accumulate K`` runs K micro-steps per iteration and
synchronises gradients on the last only (``no_sync`` / ``set_requires_gradient_sync``).

The job is launched with torchrun (``python -m torch.distributed.run``). Without ``--link-rate`` all ranks
run on this machine over loopback. With ``--link-rate 200mbit`` (root + iproute2) every rank runs in its
own network namespace ("host") and the ranks talk over veth links shaped with tc in both directions
(see ``shaped_link.py``); the link's real TCP goodput is measured first and stored in run.json.

``--rate-schedule R1,R2,...`` changes the link's rate while the job runs, between blocks of ``--block-steps``
profiled steps (the ranks wait for it outside their timed steps); ``--realtime PRIO`` runs the ranks under the
real-time scheduler so that other work on a shared machine disturbs them less; ``--sleep-rank``/``--sleep-ms``
make a straggler and ``--loader-ms`` a slow data loader (docs/accuracy.md).

Writes into ``--out``:
  rank{r}.pt.trace.json.gz   Kineto trace of rank r (plain .json with --no-gzip)
  run.json                   parameters, model size, gradient bytes, link, measured per-step wall times

The defaults (MLP 8 x 512, batch 512, 1 MB buckets, 1 wait + 1 warmup + 5 profiled steps) are those of the
bundled sample samples/ddp-gloo, recorded with ``--link-rate 500mbit``. Examples::

    python samples/record_ddp.py --out /tmp/ddp
    sudo python samples/record_ddp.py --out /tmp/ddp-200m --link-rate 200mbit --force
    sudo python samples/record_ddp.py --out /tmp/fsdp --parallel fsdp --link-rate 1gbit --no-record-shapes
    sudo python samples/record_ddp.py --out /tmp/dptp --parallel dp-tp --nproc 4 --link-rate 300mbit
    sudo python samples/record_ddp.py --out /tmp/sched --rate-schedule 1gbit,100mbit,3gbit --block-steps 3 --realtime 10
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the training job every rank runs, and RecordConfig, the settings handed to it
from record_ddp_job import PARALLEL, RecordConfig, build_model, input_shape, train_worker
from shaped_link import (
    LinkError,
    ShapedNetwork,
    check_link,
    format_rate,
    parse_delay,
    parse_rate,
    require_netns,
)

SCRIPT = Path(__file__).resolve()
TRACE_GLOB = "rank*.pt.trace.json*"
MASTER_PORT = 29500  # inside our own namespaces every port is free


class RecordError(RuntimeError):
    """A recording could not be made; the message is meant for the user (no traceback)."""


# ---------------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------------


def model_stats(cfg: RecordConfig) -> dict[str, Any]:
    """Number of parameters and gradient bytes of the model (built once here, on the CPU)."""
    model = build_model(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    return {
        "parameters": sum(p.numel() for p in params),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
        "tensors": len(params),
        "dtype": str(params[0].dtype).replace("torch.", ""),
        "input_shape": list(input_shape(cfg)),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(
    nnodes: int, node_rank: int, nproc_per_node: int, addr: str, port: int, cfg_path: Path
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc_per_node),
        "--master-addr",
        addr,
        "--master-port",
        str(port),
        str(SCRIPT),
        "--worker-config",
        str(cfg_path),
    ]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a launcher and its workers (own process group), then kill after a grace period."""
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
            return


def _run_launchers(argvs: list[list[str]], env: dict[str, str], workdir: Path, timeout_s: float) -> None:
    """Start every launcher, wait for all; on failure or timeout stop the rest and raise with log tails."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for i, argv in enumerate(argvs):
            log = open(workdir / f"launcher{i}.log", "wb")  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(
                subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
        if failed or any(p.poll() is None for p in procs):
            why = (
                f"launcher {failed[0]} exited with {procs[failed[0]].returncode}"
                if failed
                else f"timed out after {timeout_s:g}s"
            )
            for p in procs:
                _stop(p)
            tails = []
            for i in range(len(procs)):
                text = (workdir / f"launcher{i}.log").read_text(errors="replace").strip().splitlines()
                tails.append(f"--- launcher {i} (last lines) ---\n" + "\n".join(text[-25:]))
            raise RecordError(f"the DDP job failed: {why}\n" + "\n".join(tails))
    finally:
        for p in procs:
            _stop(p)
        for log in logs:
            log.close()


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def _summary(walls: list[float]) -> dict[str, float]:
    return {
        "mean_s": statistics.fmean(walls),
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "max_s": max(walls),
    }


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def existing_outputs(out: Path) -> list[Path]:
    """Trace files and run.json already in ``out`` (what a recording would overwrite)."""
    if not out.is_dir():
        return []
    found = sorted(out.glob(TRACE_GLOB))
    return found + ([out / "run.json"] if (out / "run.json").exists() else [])


@contextlib.contextmanager
def _exit_on_signals() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into SystemExit so that every finally (stop workers, remove namespaces) runs."""

    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _network(cfg: RecordConfig) -> Iterator[ShapedNetwork | None]:
    if not cfg.shaped:
        yield None
        return
    require_netns()
    rate = cfg.rate_schedule[0] if cfg.rate_schedule else cfg.link_rate_bps
    with ShapedNetwork(cfg.hosts, rate, cfg.link_delay_us) as net:
        yield net


class RateSchedule(threading.Thread):
    """Changes the link's rate between blocks of the job's profiled steps (``--rate-schedule``): once every rank
    has reached block k (``block{k}.rank{r}`` files in the work directory, see ``record_ddp_job._block_barrier``),
    sets block k's rate on every link end and releases the ranks (``block{k}.go``). ``changes`` records when."""

    def __init__(self, net: ShapedNetwork, cfg: RecordConfig, workdir: Path) -> None:
        super().__init__(name="rate-schedule", daemon=True)
        self.net, self.cfg, self.workdir = net, cfg, workdir
        self.stop = threading.Event()
        self.changes: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        for k in range(1, len(self.cfg.rate_schedule)):
            ready = [self.workdir / f"block{k}.rank{r}" for r in range(self.cfg.nproc)]
            while not all(p.exists() for p in ready):
                if self.stop.wait(0.002):
                    return
            t0 = time.perf_counter()
            at = time.time_ns()
            try:
                self.net.set_rate(self.cfg.rate_schedule[k])
            except BaseException as exc:  # the ranks give up at once instead of timing out
                self.error = exc
                (self.workdir / f"block{k}.abort").touch()
                return
            self.changes.append({"block": k, "changed_unix_ns": at, "tc_s": time.perf_counter() - t0,
                                 "loadavg": _loadavg()})
            (self.workdir / f"block{k}.go").touch()


def record(cfg: RecordConfig, argv: Sequence[str] | None = None, log: Any = sys.stderr) -> dict[str, Any]:
    """Record one job as configured; write the traces and run.json into ``cfg.out``; return run.json's data.

    Refuses (RecordError) to overwrite existing traces or run.json unless ``cfg.force``. Outputs appear only
    when every rank succeeded: traces are gzipped to temporary names and renamed into place.
    """
    cfg.validate()
    out = Path(cfg.out)
    clash = existing_outputs(out)
    if clash and not cfg.force:
        raise RecordError(f"{out} already holds {', '.join(p.name for p in clash)}; use --force to overwrite")
    if cfg.shaped:
        require_netns()
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _record_into(cfg, out, argv, log)
    except BaseException:
        if created:  # leave no empty directory behind for a recording that did not happen
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _record_into(cfg: RecordConfig, out: Path, argv: Sequence[str] | None, log: Any) -> dict[str, Any]:
    stats = model_stats(cfg)
    import torch

    with _exit_on_signals(), tempfile.TemporaryDirectory(prefix=".record-", dir=out) as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        cfg_path = workdir / "config.json"
        cfg_path.write_text(json.dumps(asdict(cfg)))
        env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "PYTHONUNBUFFERED": "1"}
        link_info: dict[str, Any] = {
            "rate": None,
            "rate_bps": None,
            "delay_us": None,
            "namespaces": False,
            "transport": "loopback (127.0.0.1)",
        }
        t_start = time.perf_counter()
        load: dict[str, Any] = {}
        with _network(cfg) as net:
            if net is None:
                argvs = [_torchrun(1, 0, cfg.nproc, "127.0.0.1", _free_port(), cfg_path)]
            else:
                link_info = {
                    **net.describe(),
                    "namespaces": True,
                    "transport": f"TCP over veth {net.hosts[0].ifname}",
                }
                if cfg.check_link:
                    checks = {}
                    # every rate of a schedule (the first last: the job starts at it)
                    rates = list(dict.fromkeys(cfg.rate_schedule))
                    for rate in rates[1:] + rates[:1] or [None]:
                        if rate is not None:
                            net.set_rate(rate)
                        print(f"measuring the link ({' '.join(net.qdisc_args())}) ...", file=log)
                        chk = check_link(net)
                        checks[format_rate(rate) if rate else "set"] = asdict(chk)
                        print(f"link: {chk.summary()}", file=log)
                        if not chk.ok:
                            print(
                                f"warning: measured goodput is outside {chk.low:.0%}..{chk.high:.0%}"
                                " of the set rate",
                                file=log,
                            )
                    if cfg.rate_schedule:
                        link_info["checks"] = checks
                    else:
                        link_info["check"] = next(iter(checks.values()))
                env["GLOO_SOCKET_IFNAME"] = net.hosts[0].ifname
                addr = net.hosts[0].address
                argvs = [
                    net.exec_argv(i, _torchrun(cfg.hosts, i, cfg.nproc // cfg.hosts, addr, MASTER_PORT, cfg_path))
                    for i in range(cfg.hosts)
                ]
            print(
                f"running {cfg.nproc} ranks: {cfg.wait} wait + {cfg.warmup} warmup"
                f" + {cfg.steps} active steps",
                file=log,
            )
            scheduler = RateSchedule(net, cfg, workdir) if net is not None and cfg.rate_schedule else None
            if scheduler is not None:
                scheduler.start()
            try:
                # the ranks' scheduling priority: a shared machine's other work disturbs them less
                if cfg.nice:
                    argvs = [["nice", "-n", str(cfg.nice), *a] for a in argvs]
                if cfg.realtime:
                    argvs = [["chrt", "--rr", str(cfg.realtime), *a] for a in argvs]
                load["start"] = _loadavg()
                _run_launchers(argvs, env, workdir, cfg.timeout_s)
                load["end"] = _loadavg()
            finally:
                if scheduler is not None:
                    scheduler.stop.set()
                    scheduler.join()
            if scheduler is not None and scheduler.error is not None:
                raise RecordError(f"changing the link's rate failed: {scheduler.error}")
        job_s = time.perf_counter() - t_start

        ranks = [json.loads((workdir / f"rank{r}.steps.json").read_text()) for r in range(cfg.nproc)]
        for r in range(cfg.nproc):
            raw = (workdir / f"rank{r}.pt.trace.json").read_bytes()
            data = gzip.compress(raw, compresslevel=9, mtime=0) if cfg.gzip else raw
            _atomic_write(workdir / cfg.trace_name(r), data)
        if cfg.force:
            for old in out.glob(TRACE_GLOB):
                old.unlink()
        for r in range(cfg.nproc):
            os.replace(workdir / cfg.trace_name(r), out / cfg.trace_name(r))

    first_active = cfg.wait + cfg.warmup
    run = {
        "recorded_by": "samples/record_ddp.py",
        "command": list(argv) if argv is not None else None,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "launcher": "torchrun (torch.distributed.run), env:// rendezvous",
        "backend": "gloo",
        "world_size": cfg.nproc,
        "parallel": {
            "kind": cfg.parallel,
            "accumulate": cfg.accumulate,
            **({"microbatches": cfg.microbatches} if cfg.parallel == "pipeline" else {}),
            **({"tp_groups": [[a, a + 1] for a in range(0, cfg.nproc, 2)],
                "dp_groups": [list(range(k, cfg.nproc, 2)) for k in range(2)]} if cfg.parallel == "dp-tp" else {}),
            "hosts": cfg.hosts if cfg.shaped else 1,
        },
        "threads_per_rank": cfg.threads,
        "seed": cfg.seed,
        "model": {
            "kind": cfg.model,
            "hidden": cfg.hidden,
            "layers": cfg.layers,
            "batch": cfg.batch,
            **({"image": cfg.image} if cfg.model == "cnn" else {}),
            **stats,
        },
        "ddp": {"bucket_cap_mb": cfg.bucket_mb, **ranks[0].get("ddp", {})},
        "optimizer": "SGD(lr=0.01, momentum=0.9)",
        "profiler": {
            "activities": ["CPU"],
            "record_shapes": cfg.record_shapes,
            "with_stack": False,
            "schedule": {"wait": cfg.wait, "warmup": cfg.warmup, "active": cfg.steps, "repeat": 1},
            "profiled_steps": list(range(first_active, first_active + cfg.steps)),
            "step_annotation": "ProfilerStep#N, N = step index",
        },
        "link": link_info,
        **({"schedule": _schedule_info(cfg, first_active, scheduler)} if cfg.rate_schedule else {}),
        **({"straggler": {"rank": cfg.sleep_rank, "sleep_ms": cfg.sleep_ms}} if cfg.sleep_rank is not None else {}),
        **({"loader": {"ms_per_batch": cfg.loader_ms, "ranks": "all"}} if cfg.loader_ms > 0 else {}),
        "files": {str(r): cfg.trace_name(r) for r in range(cfg.nproc)},
        "job_wall_s": job_s,
        "machine": {"nice": cfg.nice, "realtime": cfg.realtime, "loadavg": load,
                    "note": "/proc/loadavg (1, 5, 15 min) when the ranks started and ended: the machine is shared"},
        "step_times": {
            "note": "time.perf_counter around zero_grad + forward + backward (+allreduce) + optimizer step",
            "ranks": {
                str(x["rank"]): {
                    "pid": x["pid"],
                    "steps": x["steps"],
                    "active": _summary([s["wall_s"] for s in x["steps"] if s["phase"] == "active"]),
                }
                for x in ranks
            },
        },
    }
    _atomic_write(out / "run.json", (json.dumps(run, indent=1) + "\n").encode())
    return run


def _schedule_info(cfg: RecordConfig, first_active: int, scheduler: RateSchedule | None) -> dict[str, Any]:
    """run.json's ``schedule``: each block's rate and profiled steps (ProfilerStep numbers), and when the rate
    was changed before it."""
    changes = {c["block"]: c for c in (scheduler.changes if scheduler is not None else [])}
    blocks = []
    for k, rate in enumerate(cfg.rate_schedule):
        first = first_active + k * cfg.block_steps
        blocks.append({"block": k, "rate": format_rate(rate), "rate_bps": rate,
                       "steps": list(range(first, first + cfg.block_steps)),
                       **({key: changes[k][key] for key in ("changed_unix_ns", "tc_s", "loadavg")}
                          if k in changes else {})})
    return {
        "block_steps": cfg.block_steps,
        "note": "the link's rate (tc tbf, both ends) changes between blocks while the job runs; the ranks wait "
        "for it before the first step of a block, outside the timed step and before any traced op. The first "
        "step of a block may still be transitional (TCP adapting to the new rate): step_times' block field "
        "says which block every step ran in",
        "blocks": blocks,
    }


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def _rate_arg(text: str) -> int | None:
    if text.lower() in ("none", "unlimited", "off"):
        return None
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _schedule_arg(text: str) -> list[int]:
    rates = [r.strip() for r in text.split(",") if r.strip()]
    if not rates:
        raise argparse.ArgumentTypeError("--rate-schedule needs at least one rate")
    try:
        return [parse_rate(r) for r in rates]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _delay_arg(text: str) -> int:
    try:
        return parse_delay(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    d = RecordConfig(out="")
    p = argparse.ArgumentParser(
        prog="record_ddp.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--force", action="store_true", help="overwrite existing traces / run.json in DIR")
    p.add_argument("--nproc", type=int, default=d.nproc, help="number of ranks (default %(default)s)")
    p.add_argument("--steps", type=int, default=d.steps, help="profiled (active) steps (default %(default)s)")
    p.add_argument("--wait", type=int, default=d.wait, help="unprofiled steps first (default %(default)s)")
    p.add_argument(
        "--warmup", type=int, default=d.warmup, help="profiler warm-up steps (default %(default)s)"
    )
    p.add_argument(
        "--model", choices=["mlp", "cnn"], default=d.model, help="model kind (default %(default)s)"
    )
    p.add_argument(
        "--hidden", type=int, default=d.hidden, help="MLP width / CNN channels (default %(default)s)"
    )
    p.add_argument(
        "--layers", type=int, default=d.layers, help="hidden layers / conv blocks (default %(default)s)"
    )
    p.add_argument("--batch", type=int, default=d.batch, help="per-rank batch size (default %(default)s)")
    p.add_argument(
        "--image", type=int, default=d.image, help="CNN input side in pixels (default %(default)s)"
    )
    p.add_argument(
        "--bucket-mb", type=float, default=d.bucket_mb, help="DDP bucket_cap_mb (default %(default)s)"
    )
    p.add_argument(
        "--link-rate",
        type=_rate_arg,
        metavar="RATE",
        help="shape the link between ranks to RATE (tc syntax: 200mbit, 1gbit); needs root",
    )
    p.add_argument(
        "--rate-schedule",
        type=_schedule_arg,
        metavar="RATE,RATE,...",
        help="change the link's rate while the job runs: one rate per block of --block-steps profiled steps "
        "(e.g. 1gbit,3gbit,300mbit,1gbit,100mbit,3gbit,300mbit,100mbit); the profiled steps become blocks x "
        "--block-steps; run.json says which block and rate every step ran at; needs root",
    )
    p.add_argument("--block-steps", type=int, default=3, help="profiled steps per block of --rate-schedule "
                   "(default %(default)s)")
    p.add_argument("--sleep-rank", type=int, default=None, metavar="R", help="a straggler: rank R sleeps "
                   "--sleep-ms in every step before its forward pass")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="the straggler's sleep per step (default 0)")
    p.add_argument("--loader-ms", type=float, default=0.0, help="a slow input pipeline: every rank loads its "
                   "batches through a torch DataLoader that takes this long per batch (default 0)")
    p.add_argument(
        "--link-delay",
        type=_delay_arg,
        metavar="DELAY",
        help="one-way delay per direction (e.g. 2ms) via netem; needs root and sch_netem",
    )
    p.add_argument(
        "--no-check-link",
        dest="check_link",
        action="store_false",
        help="skip measuring the shaped link's TCP goodput before the job",
    )
    p.add_argument(
        "--gzip",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write rank{r}.pt.trace.json.gz (default) or plain .json",
    )
    p.add_argument(
        "--parallel",
        choices=PARALLEL,
        default=d.parallel,
        help="ddp (default), fsdp (FSDP2 fully_shard per layer), pipeline (GPipe over the ranks, send/recv), "
        "dp-tp (tensor-parallel pairs inside a host, DDP across hosts: two process groups)",
    )
    p.add_argument(
        "--accumulate", type=int, default=d.accumulate, help="gradient-accumulation micro-steps per iteration, "
        "synchronised on the last (default %(default)s)"
    )
    p.add_argument(
        "--microbatches", type=int, default=d.microbatches, help="pipeline micro-batches (default %(default)s)"
    )
    p.add_argument(
        "--nodes", type=int, default=None, help="namespaces (hosts) of a shaped run, ranks spread evenly "
        "(default: one per rank; dp-tp: one per pair)"
    )
    p.add_argument(
        "--record-shapes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="profile with record_shapes (default); --no-record-shapes records as torch.profiler's defaults do",
    )
    p.add_argument("--nice", type=int, default=d.nice, help="run the ranks at this nice level, e.g. -10 (root) to "
                   "be disturbed less by other work on a shared machine (default %(default)s)")
    p.add_argument("--realtime", type=int, default=d.realtime, metavar="PRIO", help="run the ranks under the "
                   "round-robin real-time scheduler at this priority (chrt --rr; 1-99, root): on a shared machine "
                   "other work then takes their cores only while they wait (the kernel keeps 5 %% of every "
                   "second for the rest); 0 = the normal scheduler (default)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of weights and data (default %(default)s)")
    p.add_argument(
        "--threads", type=int, default=d.threads, help="torch threads per rank (default %(default)s)"
    )
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=d.timeout_s,
        help="give up on the job after this many seconds (default %(default)s)",
    )
    p.add_argument("--worker-config", help=argparse.SUPPRESS)
    return p


def config_from_args(args: argparse.Namespace) -> RecordConfig:
    """RecordConfig from parsed arguments."""
    names = {f.name for f in fields(RecordConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values["link_rate_bps"] = args.link_rate
    values["link_delay_us"] = args.link_delay
    values["rate_schedule"] = []
    if args.rate_schedule:
        if args.link_rate is not None:
            raise ValueError("give --link-rate or --rate-schedule, not both")
        values["rate_schedule"] = args.rate_schedule
        values["block_steps"] = args.block_steps
        values["steps"] = len(args.rate_schedule) * args.block_steps
    return RecordConfig(**values)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: record (or, under torchrun, run one rank with --worker-config)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker-config"] and len(argv) == 2:
        cfg_path = Path(argv[1])
        train_worker(RecordConfig(**json.loads(cfg_path.read_text())), cfg_path.parent)
        return 0
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
        cfg.validate()
        run = record(cfg, argv=["samples/record_ddp.py", *argv])
    except (RecordError, LinkError, ValueError, OSError) as exc:
        print(f"record_ddp: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("record_ddp: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # raised by our SIGTERM/SIGHUP handler once everything was cleaned up
        print(f"record_ddp: stopped by a signal (exit {exc.code}); nothing was written", file=sys.stderr)
        raise
    for r, info in run["step_times"]["ranks"].items():
        a = info["active"]
        print(
            f"rank {r}: active step median {a['median_s'] * 1e3:.1f} ms (min {a['min_s'] * 1e3:.1f}, "
            f"max {a['max_s'] * 1e3:.1f})",
            file=sys.stderr,
        )
    print(f"wrote {', '.join(run['files'].values())} and run.json to {cfg.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
