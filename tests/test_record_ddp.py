"""samples/record_ddp.py and samples/shaped_link.py: a real 2-rank gloo DDP recording, rate parsing, and the
network namespaces behind --link-rate (built, measured, always removed)."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
sys.path.insert(0, str(SAMPLES))

import record_ddp  # noqa: E402
import shaped_link  # noqa: E402
from shaped_link import LinkError, ShapedNetwork, format_rate, parse_delay, parse_rate  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None
TINY = ["--hidden", "32", "--layers", "2", "--batch", "8", "--steps", "2", "--wait", "0", "--warmup", "1"]


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


needs_netns = pytest.mark.skipif(not _netns_usable(), reason="needs root and iproute2 (ip netns, tc)")
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def _our_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    prefix = f"{shaped_link.NS_PREFIX}{os.getpid()}-"
    return {line.split()[0] for line in out.splitlines() if line.startswith(prefix)}


def _load_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _run_cli(args: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SAMPLES / "record_ddp.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _check_recording(out: Path, nproc: int = 2, steps: int = 2) -> dict:
    run = json.loads((out / "run.json").read_text())
    for rank in range(nproc):
        trace = _load_trace(out / f"rank{rank}.pt.trace.json.gz")
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == nproc
        assert trace["distributedInfo"]["backend"] == "gloo"
        assert isinstance(trace["baseTimeNanoseconds"], int)
        names = [e.get("name", "") for e in trace["traceEvents"]]
        step_marks = sorted(n for n in names if n.startswith("ProfilerStep#"))
        assert step_marks == [f"ProfilerStep#{i}" for i in run["profiler"]["profiled_steps"]]
        gloo = [e for e in trace["traceEvents"] if e.get("name", "").startswith("gloo:")]
        assert gloo, "no gloo:* work in the trace"
        assert all("Input Dims" in e["args"] for e in gloo), "record_shapes is off"
        assert "c10d::allreduce_" in names
        assert len(run["step_times"]["ranks"][str(rank)]["steps"]) == run["profiler"]["schedule"]["wait"] + (
            run["profiler"]["schedule"]["warmup"] + steps
        )
    assert run["model"]["gradient_bytes"] == 4 * run["model"]["parameters"]
    assert not list(out.glob(".record-*")), "temporary work directory left behind"
    return run


# -- (a) a real recording over loopback ---------------------------------------------------------------


@pytest.mark.slow
@needs_torch
def test_record_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    proc = _run_cli(["--out", str(out), *TINY])
    assert proc.returncode == 0, proc.stderr
    run = _check_recording(out)
    assert run["world_size"] == 2 and run["link"]["namespaces"] is False
    assert run["profiler"]["profiled_steps"] == [1, 2]
    assert {p.name for p in out.iterdir()} == {"rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "run.json"}

    # A second recording into the same directory is refused (nothing touched) unless --force.
    before = (out / "rank0.pt.trace.json.gz").read_bytes()
    again = _run_cli(["--out", str(out), *TINY])
    assert again.returncode == 1 and "--force" in again.stderr and "Traceback" not in again.stderr
    assert (out / "rank0.pt.trace.json.gz").read_bytes() == before

    # The recording function is importable; --force replaces the old traces (also of the other variant).
    cfg = record_ddp.RecordConfig(
        out=str(out), hidden=16, layers=1, batch=4, steps=1, wait=0, warmup=0, gzip=False, force=True
    )
    run2 = record_ddp.record(cfg, log=io.StringIO())
    assert {p.name for p in out.iterdir()} == {"rank0.pt.trace.json", "rank1.pt.trace.json", "run.json"}
    assert run2["profiler"]["profiled_steps"] == [0]
    trace = json.loads((out / "rank1.pt.trace.json").read_text())
    assert trace["distributedInfo"]["rank"] == 1


def test_refuses_to_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rank1.pt.trace.json").write_text("{}")
    assert record_ddp.main(["--out", str(tmp_path), *TINY]) == 1
    assert "use --force" in capsys.readouterr().err
    assert (tmp_path / "rank1.pt.trace.json").read_text() == "{}"


@pytest.mark.parametrize(
    "args",
    [["--nproc", "1"], ["--steps", "0"], ["--hidden", "0"], ["--bucket-mb", "0"]],
)
def test_bad_settings_are_one_line_errors(tmp_path: Path, args: list[str], capsys) -> None:
    assert record_ddp.main(["--out", str(tmp_path / "x"), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("record_ddp: error:") and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_cli_rejects_bad_rate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        record_ddp.build_parser().parse_args(["--out", "x", "--link-rate", "fast"])
    assert exc.value.code == 2
    assert "bad link rate" in capsys.readouterr().err


def test_config_from_args() -> None:
    args = record_ddp.build_parser().parse_args(
        ["--out", "d", "--link-rate", "1gbit", "--no-gzip", "--bucket-mb", "2.5"]
    )
    cfg = record_ddp.config_from_args(args)
    assert cfg.link_rate_bps == 10**9 and cfg.shaped and not cfg.gzip and cfg.bucket_mb == 2.5
    assert cfg.trace_name(1) == "rank1.pt.trace.json"
    plain = record_ddp.config_from_args(record_ddp.build_parser().parse_args(["--out", "d"]))
    assert not plain.shaped and plain.trace_name(0) == "rank0.pt.trace.json.gz"


@needs_torch
def test_model_stats_counts_gradient_bytes() -> None:
    cfg = record_ddp.RecordConfig(out="x", hidden=16, layers=3)
    stats = record_ddp.model_stats(cfg)
    assert stats["parameters"] == 3 * (16 * 16 + 16) + 16 * 10 + 10
    assert stats["gradient_bytes"] == 4 * stats["parameters"]
    cnn = record_ddp.model_stats(record_ddp.RecordConfig(out="x", model="cnn", hidden=8, layers=2))
    assert cnn["parameters"] == (3 * 9 * 8 + 8) + (8 * 9 * 8 + 8) + 8 * 10 + 10


# -- (c) rate / delay parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("200mbit", 200_000_000),
        ("1gbit", 1_000_000_000),
        ("1Gbit", 1_000_000_000),
        ("1.5gbit", 1_500_000_000),
        ("3gbit", 3_000_000_000),
        ("100mbps", 800_000_000),  # tc: bps = BYTES per second
        ("1mibit", 1_048_576),
        ("500kbit", 500_000),
        ("64000", 64_000),  # tc: a bare number is bit/s
        (" 50mbit ", 50_000_000),
        ("2e8bit", 200_000_000),
    ],
)
def test_parse_rate(text: str, bps: int) -> None:
    assert parse_rate(text) == bps


@pytest.mark.parametrize(
    "text", ["", "fast", "200 mb", "-5mbit", "0mbit", "1kbit", "1000tbit", "nanmbit", "1e400bit"]
)
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_format_rate_round_trips() -> None:
    for bps in (50_000_000, 200_000_000, 10**9, 3 * 10**9, 1_500_000_000, 123_456_789):
        assert parse_rate(format_rate(bps)) == bps
    assert format_rate(200_000_000) == "200mbit" and format_rate(1_500_000_000) == "1500mbit"


@pytest.mark.parametrize(
    ("text", "us"), [("2ms", 2000), ("250us", 250), ("0.5ms", 500), ("1s", 1_000_000), ("0ms", 0)]
)
def test_parse_delay(text: str, us: int) -> None:
    assert parse_delay(text) == us


@pytest.mark.parametrize("text", ["2", "fast", "-1ms", "20s"])
def test_parse_delay_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_delay(text)


def test_qdisc_arguments() -> None:
    tbf = ShapedNetwork(rate_bps=200_000_000).qdisc_args()
    assert tbf[:3] == ["tbf", "rate", "200000000bit"] and "burst" in tbf and "latency" in tbf
    assert int(tbf[tbf.index("burst") + 1]) == 25_000  # 1 ms at line rate
    assert int(ShapedNetwork(rate_bps=1_000_000).qdisc_args()[4]) == 15_140  # never below 10 frames
    assert ShapedNetwork().qdisc_args() == []
    netem = ShapedNetwork(rate_bps=10**8, delay_us=2000).qdisc_args()
    assert netem[:3] == ["netem", "delay", "2000us"] and "rate" in netem


# -- (c) cleanup, without root: a fake ip/tc that records commands and fails where told ------------------


class FakeIp:
    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail_on = fail_on

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if self.fail_on and self.fail_on in " ".join(argv):
            raise LinkError(f"`{' '.join(argv)}` failed: injected")
        return ""

    def added(self) -> list[str]:
        return [c[3] for c in self.calls if c[:3] == ["ip", "netns", "add"]]

    def deleted(self) -> list[str]:
        return [c[3] for c in self.calls if c[:3] == ["ip", "netns", "del"]]


@pytest.mark.parametrize("hosts", [2, 3])
def test_fake_build_shapes_both_directions(hosts: int) -> None:
    fake = FakeIp()
    with ShapedNetwork(hosts, rate_bps=10**8, runner=fake) as net:
        assert [h.address for h in net.hosts] == [f"10.231.0.{i + 1}" for i in range(hosts)]
        assert net.exec_argv(1, ["true"]) == ["ip", "netns", "exec", net.hosts[1].netns, "true"]
        qdiscs = [c for c in fake.calls if c[0] == "tc"]
        assert len(qdiscs) == (2 if hosts == 2 else 2 * hosts)  # every link shaped at both ends
    assert sorted(fake.deleted()) == sorted(fake.added())
    assert len(fake.added()) == hosts + (hosts > 2)


def test_cleanup_after_exception_inside_block() -> None:
    fake = FakeIp()
    with pytest.raises(RuntimeError, match="boom"), ShapedNetwork(runner=fake, rate_bps=10**8):
        raise RuntimeError("boom")
    assert len(fake.added()) == 2 and sorted(fake.deleted()) == sorted(fake.added())


def test_cleanup_when_building_fails_halfway() -> None:
    fake = FakeIp(fail_on="qdisc add")
    with pytest.raises(LinkError, match="injected"), ShapedNetwork(runner=fake, rate_bps=10**8):
        pytest.fail("the block must not run")
    assert len(fake.added()) == 2 and sorted(fake.deleted()) == sorted(fake.added())


def test_signal_handlers_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with ShapedNetwork(runner=FakeIp()):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


# -- (b)/(c) real namespaces --------------------------------------------------------------------------


@pytest.mark.netns
@needs_netns
def test_namespaces_removed_after_exception() -> None:
    with pytest.raises(RuntimeError), ShapedNetwork(rate_bps=parse_rate("100mbit")) as net:
        names = {h.netns for h in net.hosts}
        assert names <= _our_namespaces()
        # A process left running inside a namespace must not keep it alive.
        subprocess.Popen(net.exec_argv(0, ["sleep", "60"]))
        raise RuntimeError("boom")
    assert not names & _our_namespaces()


@pytest.mark.netns
@needs_netns
def test_namespaces_removed_on_sigterm(tmp_path: Path) -> None:
    code = (
        f"import sys, time; sys.path.insert(0, {str(SAMPLES)!r}); import shaped_link\n"
        "with shaped_link.ShapedNetwork(rate_bps=10**8) as net:\n"
        "    print(' '.join(h.netns for h in net.hosts), flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    names = proc.stdout.readline().split()
    assert len(names) == 2
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(n in listed for n in names)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)


@pytest.mark.netns
@needs_netns
def test_link_check_measures_the_set_rate() -> None:
    with ShapedNetwork(rate_bps=parse_rate("50mbit")) as net:
        t0 = time.monotonic()
        check = shaped_link.check_link(net, seconds=1.0)
        assert time.monotonic() - t0 < 30
    assert check.ok, check.summary()
    assert set(check.measured_bps) == {"0->1", "1->0"}
    assert all(0.8 <= r <= 1.05 for r in check.ratios.values())
    assert not _our_namespaces()


@pytest.mark.slow
@pytest.mark.netns
@needs_netns
@needs_torch
def test_record_across_shaped_link(tmp_path: Path) -> None:
    out = tmp_path / "shaped"
    proc = _run_cli(["--out", str(out), "--link-rate", "50mbit", *TINY], timeout=180)
    assert proc.returncode == 0, proc.stderr
    run = _check_recording(out)
    link = run["link"]
    assert link["namespaces"] and link["rate_bps"] == 50_000_000 and link["qdisc"].startswith("tbf")
    assert link["check"]["ok"], link["check"]
    assert link["hosts"][0]["address"] != link["hosts"][1]["address"]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(h["netns"] in listed for h in link["hosts"])


# -- the rate schedule (--rate-schedule), stragglers and slow loaders ------------------------------------


def test_set_rate_changes_every_link_end() -> None:
    fake = FakeIp()
    with ShapedNetwork(3, rate_bps=10**9, runner=fake) as net:
        fake.calls.clear()
        net.set_rate(10**8)
        changes = [c for c in fake.calls if c[0] == "tc"]
        assert len(changes) == 6 and all(c[3:5] == ["qdisc", "change"] for c in changes)
        assert all("100000000bit" in c for c in changes) and net.rate_bps == 10**8
        assert all("100000000bit" in q for q in net.qdiscs)
    with ShapedNetwork(rate_bps=10**8, delay_us=1000, runner=FakeIp()) as net, pytest.raises(LinkError):
        net.set_rate(10**9)


def test_rate_schedule_options() -> None:
    args = record_ddp.build_parser().parse_args(
        ["--out", "d", "--rate-schedule", "1gbit, 100mbit,3gbit", "--block-steps", "4", "--sleep-rank", "1",
         "--sleep-ms", "50", "--loader-ms", "20", "--realtime", "10"])
    cfg = record_ddp.config_from_args(args)
    assert cfg.rate_schedule == [10**9, 10**8, 3 * 10**9] and cfg.block_steps == 4 and cfg.steps == 12
    assert cfg.shaped and cfg.link_rate_bps is None
    assert (cfg.sleep_rank, cfg.sleep_ms, cfg.loader_ms, cfg.realtime) == (1, 50.0, 20.0, 10)
    cfg.validate()
    # wait + warm-up steps run before the blocks; then block k holds profiled steps k*4 .. k*4+3
    assert [cfg.block_of(i) for i in range(cfg.wait + cfg.warmup + 13)] == \
        [None, None, *[k for k in range(3) for _ in range(4)], 3]
    plain = record_ddp.config_from_args(record_ddp.build_parser().parse_args(["--out", "d"]))
    assert plain.rate_schedule == [] and plain.block_of(5) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--rate-schedule", "1gbit,100mbit", "--link-rate", "1gbit"], "not both"),
     (["--rate-schedule", "1gbit", "--block-steps", "0"], "--block-steps"),
     (["--rate-schedule", "1gbit", "--link-delay", "1ms"], "--link-delay"),
     (["--sleep-rank", "2", "--sleep-ms", "10"], "--sleep-rank"),
     (["--loader-ms", "-1"], "--loader-ms"),
     (["--realtime", "100"], "--realtime")],
)
def test_bad_schedule_settings_are_one_line_errors(tmp_path: Path, args: list[str], message: str, capsys) -> None:
    assert record_ddp.main(["--out", str(tmp_path / "x"), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("record_ddp: error:") and message in err and "Traceback" not in err


def test_cli_rejects_bad_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        record_ddp.build_parser().parse_args(["--out", "x", "--rate-schedule", "1gbit,fast"])
    assert "bad link rate" in capsys.readouterr().err


def test_block_barrier_waits_for_the_launcher(tmp_path: Path) -> None:
    """A rank reaching a block says so with a file and waits until the launcher has changed the rate (the
    RateSchedule thread, here with a fake network), or gives up at once when it could not."""
    import threading

    import record_ddp_job

    cfg = record_ddp.RecordConfig(out="x", nproc=2, steps=4, rate_schedule=[10**9, 10**8], block_steps=2)
    fake = FakeIp()
    with ShapedNetwork(rate_bps=10**9, runner=fake) as net:
        sched = record_ddp.RateSchedule(net, cfg, tmp_path)
        sched.start()
        ranks = [threading.Thread(target=record_ddp_job._block_barrier, args=(tmp_path, r, 1, 30)) for r in (0, 1)]
        for t in ranks:
            t.start()
        for t in ranks:
            t.join(30)
        sched.join(30)
        assert not any(t.is_alive() for t in ranks) and not sched.is_alive()
        assert net.rate_bps == 10**8 and [c["block"] for c in sched.changes] == [1]
        assert (tmp_path / "block1.go").exists()
    failing = ShapedNetwork(rate_bps=10**9, runner=FakeIp(fail_on="qdisc change"))
    with failing as net:
        sched = record_ddp.RateSchedule(net, cfg, tmp_path / "b")
        (tmp_path / "b").mkdir()
        sched.start()
        for r in (0, 1):
            (tmp_path / "b" / f"block1.rank{r}").touch()
        sched.join(30)
        assert isinstance(sched.error, LinkError) and (tmp_path / "b" / "block1.abort").exists()
        with pytest.raises(RuntimeError, match="block 1 was not set"):
            record_ddp_job._block_barrier(tmp_path / "b", 0, 1, 30)


@pytest.mark.slow
@pytest.mark.netns
@needs_netns
@needs_torch
def test_record_with_a_rate_schedule(tmp_path: Path) -> None:
    """The link's rate changes between blocks while the job runs: one trace per rank holds every block, run.json
    says each block's rate and steps, and every step which block it ran in."""
    out = tmp_path / "sched"
    proc = _run_cli(["--out", str(out), "--rate-schedule", "200mbit,50mbit", "--block-steps", "2",
                     "--no-check-link", "--sleep-rank", "1", "--sleep-ms", "5", *TINY[:6], "--wait", "0",
                     "--warmup", "1"], timeout=180)
    assert proc.returncode == 0, proc.stderr
    run = _check_recording(out, steps=4)
    blocks = run["schedule"]["blocks"]
    assert [(b["rate"], b["steps"]) for b in blocks] == [("200mbit", [1, 2]), ("50mbit", [3, 4])]
    assert "changed_unix_ns" in blocks[1] and "changed_unix_ns" not in blocks[0]
    steps = run["step_times"]["ranks"]["0"]["steps"]
    assert [s.get("block") for s in steps] == [None, 0, 0, 1, 1]
    assert [s.get("rate_bps") for s in steps[1:]] == [200_000_000] * 2 + [50_000_000] * 2
    # the change happened between the blocks, before the first step of the second one started
    assert steps[2]["start_unix_ns"] < blocks[1]["changed_unix_ns"] < steps[3]["start_unix_ns"]
    assert run["straggler"] == {"rank": 1, "sleep_ms": 5.0}
