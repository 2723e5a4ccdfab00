"""The folders training tools write their traces into, read with every rank right: torchtitan, Lightning, Accelerate,
Composer, W&B's pytorch_traces, tracekit's own windows; the rank from the name where the JSON has none; --rank-regex;
a warning where name and JSON disagree. (The real libraries' own output: tests/test_lightning.py and
tests/test_huggingface.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tests import kineto_traces as kt
from tracekit.cli import main
from tracekit.loading import layouts, traceset
from tracekit.model.diagnostics import TraceError


def _write(path: Path, rank: int | None, steps: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return kt.write(path, kt.gpu_job(steps), rank=rank)


def _ranks(paths: list[Path], **kw: object) -> tuple[dict[int, tuple[str, str]], list[str]]:
    """``{rank: (file read, rank source)}`` and the warnings of loading ``paths``."""
    ts = traceset.load([str(p) for p in paths], use_cache=False, **kw)
    r = pl.from_arrow(ts.ranks)
    out = {row["rank"]: (row["source_files"][0], row["rank_source"]) for row in r.iter_rows(named=True)}
    return out, [str(d) for d in ts.diagnostics if d.level != "info"]


@pytest.mark.parametrize("claimed", [True, False])
def test_torchtitan_reads_one_iteration_folder_and_the_last_of_several(tmp_path: Path, claimed: bool) -> None:
    root = tmp_path / "outputs" / "profile_trace"
    for step in (10, 20):
        for r in (0, 1):
            _write(root / f"iteration_{step}" / f"rank{r}_trace.json{'.gz' if r else ''}", r if claimed else None)
    source = "distributedInfo" if claimed else "file name"
    ranks, warnings = _ranks([root / "iteration_10"])
    assert ranks == {0: (str(root / "iteration_10" / "rank0_trace.json"), source),
                     1: (str(root / "iteration_10" / "rank1_trace.json.gz"), source)}
    assert warnings == []
    ranks, warnings = _ranks([root])
    assert {r: Path(f).parent.name for r, (f, _) in ranks.items()} == {0: "iteration_20", 1: "iteration_20"}
    assert len(warnings) == 1 and "torchtitan: one profiling window per rank read, iteration_20" in warnings[0]
    assert "2 more left out (iteration_10)" in warnings[0]


def test_composer_keeps_each_ranks_last_batch(tmp_path: Path) -> None:
    d = tmp_path / "my-run" / "torch_traces"
    for batch in (3, 7, 11):
        for r in (0, 1):
            _write(d / f"rank{r}.{batch}.pt.trace.json", None)
    ranks, warnings = _ranks([d])
    assert ranks == {r: (str(d / f"rank{r}.11.pt.trace.json"), "file name") for r in (0, 1)}
    assert "composer" in warnings[0] and "batch 11" in warnings[0] and "4 more left out" in warnings[0]


def test_lightning_profiler_folder_takes_the_training_steps_and_local_ranks(tmp_path: Path) -> None:
    d = tmp_path / "lightning_logs"
    names = {}
    for r, ns in ((0, 1795886810883312574), (1, 1795886810848869839)):
        names[r] = f"fit-prof-{r}-[Strategy]DDPStrategy.training_step.{ns}.pt.trace.json"
        _write(d / names[r], None)
        _write(d / f"fit-prof-{r}-[Strategy]DDPStrategy.validation_step.{ns + 400_000_000}.pt.trace.json", None)
        _write(d / f"test-prof-{r}-[Strategy]DDPStrategy.test_step.{ns + 900_000_000}.pt.trace.json", None)
    (d / "fit-prof-0.txt").write_text("the profiler's summary table")
    ranks, warnings = _ranks([d])
    assert ranks == {r: (str(d / names[r]), "file name") for r in (0, 1)}
    assert "lightning: one profiling window per rank read, fit training_step" in warnings[0]
    # one process: no rank in the name; the rank in the file, whatever it is, is not contradicted
    single = tmp_path / "single" / "fit-prof-[Strategy]SingleDeviceStrategy.training_step.1795886810883312574" \
                                    ".pt.trace.json"
    assert layouts.facts(str(single)).rank is None
    # a node-local rank that differs from the global one in the JSON (node 1 of 2) is no disagreement
    node1 = _write(tmp_path / "node1" / names[1], 3)
    ranks, warnings = _ranks([node1])
    assert ranks == {3: (str(node1), "distributedInfo")} and warnings == []


def test_traces_of_different_ranks_that_share_a_name_are_no_windows(tmp_path: Path) -> None:
    """Two nodes' Lightning profilers in one shared folder (the same local ranks), one worker_name on every rank: the
    rank at the start of each trace keeps them apart; the windows of each rank still collapse."""
    d = tmp_path / "shared"
    kept = {}
    for node in (0, 1):
        ns = 1795886810883312574 + node * 1000
        for local in (0, 1):
            rank = 2 * node + local
            kept[rank] = f"fit-prof-{local}-[Strategy]DDPStrategy.training_step.{ns + local}.pt.trace.json"
            _write(d / kept[rank], rank)
            _write(d / f"fit-prof-{local}-[Strategy]DDPStrategy.validation_step.{ns + 9_000_000}.pt.trace.json", rank)
    ranks, warnings = _ranks([d])
    assert ranks == {r: (str(d / name), "distributedInfo") for r, name in kept.items()}
    assert "4 more left out (fit validation_step)" in warnings[0]
    for r in (0, 1):
        _write(tmp_path / "tb" / f"trainer.17958868100000000{r}.pt.trace.json", r)
    ranks, warnings = _ranks([tmp_path / "tb"])
    assert sorted(ranks) == [0, 1] and warnings == []


def test_accelerate_profile_files_by_process_index(tmp_path: Path) -> None:
    d = tmp_path / "output_trace"
    for r in (1, 0):
        _write(d / f"profile_{r}.json", None)
    ranks, warnings = _ranks([d / "profile_1.json", d / "profile_0.json"])  # given out of order
    assert ranks == {r: (str(d / f"profile_{r}.json"), "file name") for r in (0, 1)} and warnings == []


def test_wandb_pytorch_traces_ranks_from_the_json_and_one_window_per_process(tmp_path: Path) -> None:
    runs = tmp_path / "wandb"
    # W&B's handler names files <host>_<pid>.<time_ns>: nothing in the name is a rank
    files = {0: runs / "run-a/files/pytorch_traces/node-b_900.1795886810000000000.pt.trace.json",
             1: runs / "run-b/files/pytorch_traces/node-a_100.1795886810000000001.pt.trace.json"}
    for r, f in files.items():
        _write(f, r)
        _write(f.with_name(f.name.replace(".17958868100", ".17958868000")), r)  # an earlier window
    ranks, warnings = _ranks([runs])
    assert ranks == {r: (str(f), "distributedInfo") for r, f in files.items()}
    assert "tensorboard_trace_handler: one profiling window per rank read" in warnings[0]
    # without distributedInfo the order is all there is, and the ranks table says so
    for f in files.values():
        _write(f, None)
    ranks, _ = _ranks([files[0], files[1]])
    assert {r: s for r, (_, s) in ranks.items()} == {0: "order", 1: "order"}


def test_tracekit_windows_and_a_name_that_contradicts_the_json(tmp_path: Path) -> None:
    for k in (0, 1):
        _write(tmp_path / "w" / f"rank0.w{k}.pt.trace.json.gz", 0)
    ranks, warnings = _ranks([tmp_path / "w"])
    assert ranks == {0: (str(tmp_path / "w" / "rank0.w1.pt.trace.json.gz"), "distributedInfo")}
    assert "tracekit: one profiling window per rank read, w1" in warnings[0]
    # names swapped against the files' own ranks: the JSON wins, with a warning naming the file and both ranks
    _write(tmp_path / "x" / "rank0_trace.json", 1)
    _write(tmp_path / "x" / "rank1_trace.json", 0)
    ranks, warnings = _ranks([tmp_path / "x"])
    assert ranks == {1: (str(tmp_path / "x" / "rank0_trace.json"), "distributedInfo"),
                     0: (str(tmp_path / "x" / "rank1_trace.json"), "distributedInfo")}
    assert warnings == [f"{tmp_path / 'x' / 'rank0_trace.json'}: the file name says rank 0, the file's distributedInfo "
                        "rank 1 (and 1 more files): rank 1 taken (--rank-regex takes the ranks from the names)"]


def test_rank_regex_overrides_the_json_in_memory_and_rank_by_rank(tmp_path: Path) -> None:
    d = tmp_path / "job"
    for node in (0, 1):
        for gpu in (0, 1):
            # every file claims rank 0 (as jobs of several independent groups do): only the path tells them apart
            _write(d / f"node{node}" / f"gpu{gpu}.json", 0)
    rx = r"node(?P<node>\d)/gpu(?P<rank>\d)"
    with pytest.raises(TraceError, match="finds no rank in any"):
        _ranks([d], rank_regex=r"host(\d+)")
    # the group named rank gives the rank: duplicates across nodes keep the first, with a warning
    ranks, warnings = _ranks([d], rank_regex=rx)
    assert {r: s for r, (_, s) in ranks.items()} == {0: "rank regex", 1: "rank regex", 2: "order", 3: "order"}
    assert any("rank 1 is claimed by another file too" in w for w in warnings)
    ranks, warnings = _ranks([d], rank_regex=r"node(\d)/gpu(\d)")  # no group named rank: the first group
    assert sorted(s for _, s in ranks.values()) == ["order", "order", "rank regex", "rank regex"]
    job = tracekit.load(d, rank_regex=r"node(\d)", by_rank=True, cache=False)
    assert job.ranks.sort("rank").select("rank", "rank_source").rows() == [
        (0, "rank regex"), (1, "rank regex"), (2, "order"), (3, "order")]
    with pytest.raises(TraceError, match="no group around the rank"):
        tracekit.load(d, rank_regex=r"node\d")
    with pytest.raises(TraceError, match="not a regular expression"):
        tracekit.load(d, rank_regex="node(")


def test_rank_regex_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "job"
    _write(d / "a" / "rank0.pt.trace.json.gz", 1, steps=3)
    _write(d / "b" / "rank1.pt.trace.json.gz", 0, steps=3)
    assert main(["summary", str(d), "--json", "--rank-regex", r"/(?P<rank>[ab])/"]) == 1  # letters are no rank
    assert "finds no rank in any" in capsys.readouterr().err
    assert main(["summary", str(d), "--json", "--rank-regex", r"rank(\d+)\.pt"]) == 0
    out, err = capsys.readouterr()
    assert {r["rank"] for r in json.loads(out)["ranks"]} == {0, 1}
    assert "--rank-regex gives rank 0, the file's distributedInfo says rank 1" in err


def test_rank_regex_in_the_terminal_app_and_its_results_cache(tmp_path: Path) -> None:
    """``inspect --rank-regex``: the app's loader takes it, and a cached result of other ranks is not reused."""
    from tracekit.tui.data import LoadCallbacks, LoadOptions, load_job

    d = tmp_path / "job"
    _write(d / "a" / "rank0.pt.trace.json.gz", 1, steps=3)
    _write(d / "b" / "rank1.pt.trace.json.gz", 0, steps=3)
    cache = str(tmp_path / "cache")
    plain = load_job([str(d)], LoadOptions(cache_dir=cache), LoadCallbacks())
    assert pl.from_arrow(plain.ranks).sort("rank")["rank_source"].to_list() == ["distributedInfo"] * 2
    named = load_job([str(d)], LoadOptions(cache_dir=cache, rank_regex=r"rank(\d)"), LoadCallbacks())
    assert not named.from_cache
    ranks = pl.from_arrow(named.ranks).sort("rank")
    assert ranks["rank_source"].to_list() == ["rank regex"] * 2
    assert [Path(f[0]).parent.name for f in ranks["source_files"].to_list()] == ["a", "b"]


@pytest.mark.slow  # a W&B run starts its service process: ~10 s here
def test_wandb_torch_trace_handler_as_wandb_writes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's own handler (``wandb.profiler.torch_trace_handler``), two profiling windows of one process: the folder
    holds two traces of ``<host>_<pid>``, tracekit reads the later one as the one rank."""
    wandb = pytest.importorskip("wandb")
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wandb.init(dir=str(tmp_path), project="p", settings=wandb.Settings(silent=True, console="off"))
    try:
        sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=2)
        x = torch.randn(64, 64)
        with torch.profiler.profile(schedule=sched, on_trace_ready=wandb.profiler.torch_trace_handler()) as prof:
            for _ in range(6):
                (x @ x).sum()
                prof.step()
        folder = Path(run.dir) / "pytorch_traces"
    finally:
        run.finish()
    files = sorted(folder.glob("*.pt.trace.json"), key=lambda p: int(p.name.split(".")[-4]))
    assert len(files) == 2 and all(re.fullmatch(r".+_\d+\.\d{16,}\.pt\.trace\.json", p.name) for p in files)
    ranks, warnings = _ranks([folder])
    assert ranks == {0: (str(files[-1]), "order")}
    assert "tensorboard_trace_handler: one profiling window per rank read" in warnings[0]
