"""The job's answer in Weights & Biases (offline), MLflow (a file store) and TensorBoard (event files), each read back
with the tracker's own reader and compared with what the Python API says about the job; ``summary --log``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import tracekit
from tests import wandb_records
from tracekit.cli import main
from tracekit.integrations import trackers
from tracekit.model.diagnostics import TraceError

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo"


@pytest.fixture(scope="module")
def job() -> tracekit.Job:
    return tracekit.load(SAMPLE, link_bw="500mbit", cache=False)


def _expected(job: tracekit.Job) -> tuple[dict[int, float], list[dict]]:
    """Each iteration's time in ms, and the what-if rows the trackers log by default — from the API."""
    times = {r["iteration"]: r["iteration_ns"] / 1e6 for r in job.summary()["iterations"]}
    from tracekit.analysis.ranges import sources_of, sources_text

    rows = job.whatif(**trackers.default_whatif(job)).to_dicts()
    for r in rows:  # logged as text: "variation ±7 %, contention −1/+3 %, …"
        r["range_sources"] = sources_text(sources_of(r["range_sources"]))
    return times, rows


def test_values_are_the_apis(job: tracekit.Job) -> None:
    v = trackers.values(job)
    times, rows = _expected(job)
    assert {it["iteration"]: it["iteration_ms"] for it in v.iterations} == times
    assert (v.kind, v.text) == (job.verdict.kind, job.verdict.text) and v.kind == "link-bound"
    assert [r["iteration_ns"] for r in v.whatif] == [r["iteration_ns"] for r in rows]
    # at the job's line rate, 2x and 4x it, compression 1 and 4, and the stragglers removed
    assert sorted({r["bandwidth_bps"] for r in v.whatif}) == [5e8, 1e9, 2e9] and len(v.whatif) == 7
    assert len(v.breakdown) == job.breakdown.height
    assert v.breakdown[0]["compute_ms"] == job.breakdown["compute_ns"][0] / 1e6
    assert v.scalars["scaling_factor"] == job.verdict.scaling_factor


def test_tensorboard_event_file(job: tracekit.Job, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [line] = trackers.log(job, "tensorboard", log_dir=tmp_path)
    folder = tmp_path / "runs" / "tracekit-ddp-gloo"
    assert line == f"tensorboard: {folder}"
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    times, rows = _expected(job)
    got = {e.step: e.value for e in ea.Scalars("tracekit/iteration_ms")}
    assert got == pytest.approx(times, rel=1e-6)  # float32 in the event file
    assert ea.Scalars("tracekit/exposed_comm_share")[0].value == pytest.approx(
        job.summary()["job"]["exposed_comm_share"], rel=1e-6)
    verdict = ea.Tensors("tracekit/verdict")[0].tensor_proto.string_val[0].decode()
    assert job.verdict.text in verdict
    table = ea.Tensors("tracekit/whatif")[0].tensor_proto.string_val[0].decode().splitlines()
    assert len(table) == 2 + len(rows) and table[0].startswith("| bandwidth_bps | compression")


def test_mlflow_file_store(job: tracekit.Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    from mlflow.tracking import MlflowClient

    [line] = trackers.log(job, "mlflow", log_dir=tmp_path, project="exp")
    uri = (tmp_path / "mlruns").as_uri()
    assert line.endswith(f"at {uri}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read it back
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracekit-ddp-gloo"
    assert run.data.params["tracekit.verdict"] == "link-bound"
    times, rows = _expected(job)
    hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "tracekit.iteration_ms")}
    assert hist == pytest.approx(times)
    art = Path(client.download_artifacts(run.info.run_id, "tracekit", str(tmp_path / "art")))
    assert json.loads((art / "whatif.json").read_text()) == json.loads(json.dumps(rows, default=str))
    assert (art / "verdict.txt").read_text().strip() == job.verdict.text


def test_mlflow_active_run_is_logged_into(job: tracekit.Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(tmp_path.as_uri())
    try:
        mlflow.set_experiment("user")
        with mlflow.start_run() as run:
            [line] = trackers.log(job, "mlflow")
            assert run.info.run_id in line
            assert mlflow.active_run() is not None  # the user's run is theirs to end
        data = mlflow.get_run(run.info.run_id).data
        assert data.params["tracekit.verdict"] == "link-bound" and "tracekit.median_iteration_ms" in data.metrics
    finally:
        mlflow.set_tracking_uri(None)


def _wandb_run(root: Path) -> Path:
    [f] = root.glob("wandb/offline-run-*/run-*.wandb")
    return f


def test_wandb_offline(job: tracekit.Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    [line] = trackers.log(job, ["wandb"], log_dir=tmp_path, project="p")
    run_file = _wandb_run(tmp_path)
    assert line.startswith("wandb: run tracekit-ddp-gloo")
    summary, history = wandb_records.summary_and_history(run_file)
    assert summary["tracekit/verdict"] == "link-bound" and summary["tracekit/verdict_text"] == job.verdict.text
    times, rows = _expected(job)
    logged = {h["tracekit/iteration"]: h["tracekit/iteration_ms"] for h in history if "tracekit/iteration_ms" in h}
    assert logged == pytest.approx(times)
    [table] = run_file.parent.glob("files/media/table/tracekit/whatif_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"][:2] == ["bandwidth_bps", "compression"] and len(data["data"]) == len(rows)


def test_wandb_active_run_is_logged_into(job: tracekit.Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wandb.init(dir=str(tmp_path), project="p", settings=wandb.Settings(silent=True, console="off"))
    try:
        run.log({"loss": 1.0})
        trackers.log(job, "wandb")
        assert wandb.run is run  # not finished by tracekit
    finally:
        run.finish()
    summary, _ = wandb_records.summary_and_history(_wandb_run(tmp_path))
    assert summary["loss"] == 1.0 and summary["tracekit/verdict"] == "link-bound"


def test_summary_log_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SAMPLE), "--link-bw", "500mbit", "--json", "--log", "tensorboard",
                 "--log-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["answer"]["kind"] == "link-bound"  # stdout stays JSON
    assert f"logged to tensorboard: {tmp_path / 'runs' / 'tracekit-ddp-gloo'}" in err
    assert list((tmp_path / "runs" / "tracekit-ddp-gloo").glob("events.out.tfevents.*"))
    with pytest.raises(SystemExit) as exc:
        main(["summary", str(SAMPLE), "--log", "comet"])
    assert exc.value.code == 2 and "'comet' is not a tracker" in capsys.readouterr().err


def test_a_missing_tracker_library_says_how_to_install_it(job: tracekit.Job, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(TraceError, match=r"--log wandb needs wandb, which is not installed: pip install "
                                         r"'tracekit\[wandb\]'"):
        trackers.log(job, "wandb")
    with pytest.raises(TraceError, match="is a URI"):
        trackers.log(job, "tensorboard", log_dir="sqlite:///x.db")
